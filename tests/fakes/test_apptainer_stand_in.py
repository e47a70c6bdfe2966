"""The Apptainer STAND-IN (tests/fakes/apptainer_bin/apptainer) is never kinder than Apptainer: each test quotes the
manual it holds the stand-in to (apptainer.org/docs/user/latest: environment_and_metadata.html,
bind_paths_and_mounts.html, cli/apptainer_exec.html, gpu.html), and stages/bootstrap.sh never pip-installs into a
read-only image."""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.apptainer import STAND_IN
from support.fake_sif import write_fake_sif
from support.golden_files import REPO

VENV_BIN = str(Path(sys.executable).parent)


def apptainer(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The stand-in as a job runs it: `apptainer ARGV`, with the host environment `env` (default: this one)."""
    return subprocess.run(
        [sys.executable, str(STAND_IN), *argv],
        cwd=cwd,
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )


def env_inside(result: subprocess.CompletedProcess) -> dict[str, str]:
    assert result.returncode == 0, result.stderr
    return dict(line.split("=", 1) for line in result.stdout.split("\0") if "=" in line)


def test_the_host_s_path_and_ld_library_path_never_enter_most_other_variables_do(tmp_path):
    """environment_and_metadata: "Most of the environment variables set on your host, which are passed into the
    container"; "The PATH environment variable will be modified to contain default values"; "The LD_LIBRARY_PATH is
    modified to a default /.singularity.d/libs"; Apptainer "will ensure PATH in the container is set to a default
    /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"."""
    image = write_fake_sif(tmp_path / "plain.sif")
    host = {
        **os.environ,
        "PATH": f"{tmp_path}/host-bin:{os.environ['PATH']}",
        "LD_LIBRARY_PATH": "/host/lib",
        "SITE_SETTING": "kept",
    }
    inside = env_inside(apptainer("exec", str(image), "env", "-0", cwd=tmp_path, env=host))
    assert inside["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert inside["LD_LIBRARY_PATH"] == "/.singularity.d/libs"
    assert inside["SITE_SETTING"] == "kept" and inside["HOME"] == os.environ["HOME"]
    assert inside["APPTAINER_COMMAND"] == "exec" and inside["APPTAINER_CONTAINER"] == str(image)
    # So a program only the host's PATH finds is not found in the image, as in Apptainer.
    (tmp_path / "host-bin").mkdir()
    (tmp_path / "host-bin" / "only-on-host").write_text("#!/bin/sh\necho ran\n")
    (tmp_path / "host-bin" / "only-on-host").chmod(0o755)
    missing = apptainer("exec", str(image), "only-on-host", cwd=tmp_path, env=host)
    assert missing.returncode == 255 and "executable file not found in $PATH" in missing.stderr


def test_the_image_s_environment_wins_over_the_host_s_and_apptainerenv_and_env_over_both(tmp_path):
    """environment_and_metadata: "an environment variable set on the host *will not* override a variable of the same
    name that has been set inside the container image"; "If you export an environment variable on your host called
    APPTAINERENV_xxx before you run a container, then it will set the environment variable xxx inside the
    container"; "The --env option ... allows you to specify environment variables as NAME=VALUE pairs ... Separate
    multiple variables with commas"; "If PATH is defined, add any missing path parts from ... defaults";
    APPEND_PATH / PREPEND_PATH."""
    image = write_fake_sif(tmp_path / "img.sif", env={"PATH": "/opt/image/bin", "IMAGE_VAR": "image", "OTHER": "i"})
    host = {
        **os.environ,
        "IMAGE_VAR": "host",
        "APPTAINERENV_FROM_PREFIX": "prefixed",
        "APPTAINERENV_OTHER": "p",
        "APPTAINERENV_PREPEND_PATH": "/first",
    }
    inside = env_inside(
        apptainer("exec", "--env", "A=1,B=2", "--env", "OTHER=env", str(image), "env", "-0", cwd=tmp_path, env=host)
    )
    assert inside["PATH"] == "/first:/opt/image/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert inside["IMAGE_VAR"] == "image" and inside["FROM_PREFIX"] == "prefixed"
    assert inside["A"] == "1" and inside["B"] == "2" and inside["OTHER"] == "env"
    assert "APPTAINERENV_FROM_PREFIX" not in inside


def test_cleanenv_passes_only_a_minimal_environment(tmp_path):
    """environment_and_metadata: "If you *do not want* the host environment variables to pass into the container you
    can use the -e or --cleanenv option. This gives a clean environment inside the container, with a minimal set of
    environment variables"; the manual's example shows HOME, LANG=C, LD_LIBRARY_PATH, PATH, TERM and the runtime's."""
    image = write_fake_sif(tmp_path / "img.sif")
    host = {**os.environ, "SITE_SETTING": "dropped", "TERM": "xterm", "APPTAINERENV_KEEP": "yes"}
    for flag in ("-e", "--cleanenv"):
        inside = env_inside(apptainer("exec", flag, str(image), "env", "-0", cwd=tmp_path, env=host))
        assert "SITE_SETTING" not in inside and inside["LANG"] == "C" and inside["TERM"] == "xterm"
        assert inside["KEEP"] == "yes" and inside["HOME"] == os.environ["HOME"]


def test_the_image_is_checked_a_sif_header_or_a_sandbox_folder(tmp_path):
    """A SIF's global header (sylabs/apptainer pkg/sif/sif.go): launch script, "SIF_MAGIC", version, arch; what is
    not one is refused as Apptainer refuses it (exit 255, `FATAL:`)."""
    empty = tmp_path / "empty.sif"
    empty.write_bytes(b"")
    foreign = tmp_path / "foreign.sif"
    foreign.write_bytes(b"hsqs" + bytes(4096))  # a bare squashfs is not a SIF
    wrong_arch = write_fake_sif(tmp_path / "arm.sif", arch=b"05")
    truncated = tmp_path / "truncated.sif"
    truncated.write_bytes(write_fake_sif(tmp_path / "whole.sif", env={"A": "1"}).read_bytes()[:-5])
    for image, words in (
        (empty, "image format not recognized"),
        (foreign, "image format not recognized"),
        (wrong_arch, "architecture"),
        (truncated, "truncated SIF"),
    ):
        done = apptainer("exec", str(image), "true", cwd=tmp_path)
        assert done.returncode == 255 and done.stderr.startswith("FATAL:") and words in done.stderr, done.stderr
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    assert apptainer("exec", str(sandbox), "true", cwd=tmp_path).returncode == 0
    assert apptainer("exec", str(write_fake_sif(tmp_path / "ok.sif")), "true", cwd=tmp_path).returncode == 0


def test_the_image_s_root_is_read_only_and_the_binds_are_writable(tmp_path):
    """bind_paths_and_mounts: "In the default configuration, the default bind mounts are: The user's home directory
    ($HOME), The current working directory ..., /dev, /etc/hosts, /etc/localtime, /proc, /sys, /tmp, /var/tmp";
    --bind "Mount options ('opts') may be specified as 'ro' (read-only) or 'rw' (read/write, which is the default)".
    A SIF's root file system is squashfs, read-only (sif.go: "FsSquash ... RDONLY"); the image's own files stay
    read-only even where a bind holds them."""
    image_root = tmp_path / "image-root"
    (image_root / "site-packages").mkdir(parents=True)
    image = write_fake_sif(tmp_path / "img.sif", contents=[str(image_root)])
    data, ro_data, work = tmp_path / "data", tmp_path / "ro-data", tmp_path / "work"
    for folder in (data, ro_data, work):
        folder.mkdir()
    # A file of this machine that no bind names is read-only: the venv's, unless the checkout lies under a default
    # bind ($HOME, /tmp, /var/tmp), where it is writable as Apptainer makes it (a checkout under /tmp, issue 50).
    venv_file = Path(sys.prefix, "pyvenv.cfg").resolve()
    venv_bound = any(
        venv_file.is_relative_to(Path(folder).resolve())
        for folder in (os.environ.get("HOME") or "/", "/tmp", "/var/tmp")
        if folder != "/"
    )
    script = (
        "touch {root}/site-packages/x 2>&1; touch /usr/x 2>&1; touch {exe} 2>&1 && echo venv-rw; "
        "touch {tmp}/in-rw/rw && echo bind-rw; touch {tmp}/in-ro/x 2>&1; touch ./cwd && echo cwd-rw; "
        "touch /tmp/bcpp-$$ && rm /tmp/bcpp-$$ && echo tmp-rw"
    )
    script = script.format(root=image_root, exe=shlex.quote(str(venv_file)), tmp=tmp_path)
    binds = f"{data}:{tmp_path}/in-rw,{ro_data}:{tmp_path}/in-ro:ro"
    done = apptainer("exec", "--bind", binds, str(image), "bash", "-c", script, cwd=work)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    read_only = [line for line in lines if "Read-only file system" in line]
    assert len(read_only) == 3 + (not venv_bound), lines  # the image, /usr, the venv (unless bound), the ro bind
    assert (["venv-rw"] if venv_bound else []) + ["bind-rw", "cwd-rw", "tmp-rw"] == [
        line for line in lines if "Read-only" not in line
    ]
    assert any(str(venv_file) in line for line in read_only) != venv_bound, lines
    assert (data / "rw").exists() and (work / "cwd").exists() and not (image_root / "site-packages" / "x").exists()


def test_nv_binds_the_driver_s_libraries_or_says_there_are_none(tmp_path):
    """gpu.html: with --nv "Apptainer will ... locate the NVIDIA libraries and binaries on the host system, and bind
    them into the container"; the libraries go to /.singularity.d/libs, on LD_LIBRARY_PATH. Where there are none,
    Apptainer warns ("Could not find any nv files on this host!"), never silently."""
    image = write_fake_sif(tmp_path / "img.sif")
    bare = {**os.environ, "PATH": f"{tmp_path / 'bare'}:{os.environ['PATH']}"}
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "ldconfig").write_text("#!/bin/sh\necho '0 libs found in cache'\n")
    (tmp_path / "bare" / "ldconfig").chmod(0o755)
    none = apptainer("exec", "--nv", str(image), "true", cwd=tmp_path, env=bare)
    assert none.returncode == 0 and "WARNING: Could not find any nv files on this host!" in none.stderr
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "libcuda.so.1").write_bytes(b"\x7fELF fake driver")
    (driver / "ldconfig").write_text(
        f"#!/bin/sh\nprintf '\\tlibcuda.so.1 (libc6,x86-64) => %s\\n' {driver / 'libcuda.so.1'}\n"
    )
    (driver / "ldconfig").chmod(0o755)
    found = apptainer(
        "exec",
        "--nv",
        str(image),
        "bash",
        "-c",
        "echo $LD_LIBRARY_PATH; cat /.singularity.d/libs/*",
        cwd=tmp_path,
        env={**os.environ, "PATH": f"{driver}:{os.environ['PATH']}"},
    )
    assert found.returncode == 0, found.stderr
    assert "--nv binds 1 NVIDIA driver file(s) into /.singularity.d/libs" in found.stderr
    assert found.stdout.splitlines() == ["/.singularity.d/libs", "\x7fELF fake driver"]


def wheel(folder: Path, name: str) -> Path:
    """A minimal wheel of one empty module `name` (pip installs it offline)."""
    files = {
        f"{name}/__init__.py": b"",
        f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{name}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = (
        "".join(
            f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
            f"{len(data)}\n"
            for path, data in files.items()
        )
        + f"{name}-1.0.dist-info/RECORD,,\n"
    )
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in {**files, f"{name}-1.0.dist-info/RECORD": record.encode()}.items():
            archive.writestr(member, data)
    return path


def test_bootstrap_installs_into_a_writable_folder_never_into_the_read_only_image(tmp_path):
    """stages/bootstrap.sh in an image whose Python lacks a stage package: Apptainer's image is read-only, so pip
    into the image's site-packages fails; bootstrap installs into $BCP_PIPELINE_PACKAGES (here a bound folder) on
    PYTHONPATH, and the program imports the package. The image's Python is a fresh venv (no packages), the stand-in
    plays it as the image's files; the requirement is a local wheel (pip offline)."""
    image_python = tmp_path / "image-python"
    subprocess.run([sys.executable, "-m", "venv", str(image_python)], check=True, timeout=120)
    stages = tmp_path / "stages"
    stages.mkdir()
    text = (REPO / "stages" / "bootstrap.sh").read_text()
    assert 'modules="zstandard requests tenacity tiktoken numpy pyarrow"' in text
    (stages / "bootstrap.sh").write_text(
        text.replace('modules="zstandard requests tenacity tiktoken numpy pyarrow"', 'modules="bcpp_probe"')
    )
    (stages / "requirements.txt").write_text(f"{wheel(tmp_path, 'bcpp_probe')}\n")
    (stages / "requirements-nodeps.txt").write_text(f"{wheel(tmp_path, 'bcpp_probe_data')}\n")
    image = write_fake_sif(tmp_path / "img.sif", contents=[str(image_python)], env={"PATH": str(image_python / "bin")})
    packages = tmp_path / "packages"
    host = {
        **os.environ,
        "BCP_PIPELINE_PACKAGES": str(packages),
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    host.pop("PYTHONPATH", None)
    program = "import bcpp_probe, bcpp_probe_data; print('imported', bcpp_probe.__file__)"
    direct = apptainer(
        "exec",
        str(image),
        "python3",
        "-m",
        "pip",
        "install",
        "--no-index",
        str(tmp_path / "bcpp_probe-1.0-py3-none-any.whl"),
        cwd=tmp_path,
        env=host,
    )
    assert direct.returncode != 0 and "Read-only file system" in direct.stderr + direct.stdout  # as in Apptainer
    done = apptainer(
        "exec", str(image), "bash", f"{stages}/bootstrap.sh", "python3", "-c", program, cwd=tmp_path, env=host
    )
    assert done.returncode == 0, done.stderr
    assert "is read-only (a container image); installing into" in done.stderr
    [installed] = packages.iterdir()
    assert done.stdout.startswith("imported ") and str(installed) in done.stdout
    assert not list((image_python / "lib").glob("python3*/site-packages/bcpp_probe*"))
    again = apptainer(
        "exec", str(image), "bash", f"{stages}/bootstrap.sh", "python3", "-c", program, cwd=tmp_path, env=host
    )
    assert again.returncode == 0 and "installing" not in again.stderr  # the next job finds the earlier install


def test_bootstrap_on_a_writable_python_installs_into_its_own_site_packages(tmp_path):
    """Where the interpreter's site-packages is writable (BCP's Docker containers), bootstrap installs there as
    before, and never into the packages folder."""
    python_env = tmp_path / "python"
    subprocess.run([sys.executable, "-m", "venv", str(python_env)], check=True, timeout=120)
    stages = tmp_path / "stages"
    stages.mkdir()
    text = (REPO / "stages" / "bootstrap.sh").read_text()
    (stages / "bootstrap.sh").write_text(
        text.replace('modules="zstandard requests tenacity tiktoken numpy pyarrow"', 'modules="bcpp_probe"')
    )
    (stages / "requirements.txt").write_text(f"{wheel(tmp_path, 'bcpp_probe')}\n")
    (stages / "requirements-nodeps.txt").write_text(f"{wheel(tmp_path, 'bcpp_probe_data')}\n")
    env = {
        **os.environ,
        "BCP_PIPELINE_PACKAGES": str(tmp_path / "packages"),
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [
            "bash",
            str(stages / "bootstrap.sh"),
            str(python_env / "bin" / "python"),
            "-c",
            "import bcpp_probe; print(bcpp_probe.__file__)",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(str(python_env)) and not (tmp_path / "packages").exists()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="the stand-in needs unshare")
def test_the_apptainer_bind_variable_is_honoured(tmp_path):
    """The renderer binds node-local scratch through APPTAINER_BIND (appendix: "APPTAINER_BIND and
    APPTAINER_BINDPATH: Comma separated string source:<dest> list of paths to bind between the host and the
    container")."""
    image = write_fake_sif(tmp_path / "img.sif")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = apptainer(
        "exec",
        str(image),
        "bash",
        "-c",
        f"touch {tmp_path}/in/x && echo ok",
        cwd=tmp_path,
        env={**os.environ, "APPTAINER_BIND": f"{scratch}:{tmp_path}/in"},
    )
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
    assert (scratch / "x").exists()
