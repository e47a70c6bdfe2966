"""stages/bootstrap.sh and the fast BPE engine (stages/requirements-fast.txt): installed with --no-deps and its
hash where it is missing; where it cannot be, the job goes on (tokenize-preprocess then uses tiktoken), and the
install is tried once per node, not by every job. The interpreter is a fresh venv, the required packages are
stood in for by none (modules=""), and the engine is a local wheel: pip runs offline."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.golden_files import REPO


def engine_wheel(folder: Path, name: str) -> Path:
    """A minimal wheel of one empty module `name` that declares a dependency that does not exist (as gigatoken's
    awkward and typer are absent from the job's image): only --no-deps installs it offline."""
    files = {
        f"{name}/__init__.py": b"",
        f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
        "Requires-Dist: no-such-package-anywhere\n".encode(),
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


@pytest.fixture
def job(tmp_path):
    """(stages folder, the venv's python, environment): bootstrap.sh with no required modules and the engine
    module renamed to a test wheel's."""
    python_env = tmp_path / "python"
    subprocess.run([sys.executable, "-m", "venv", str(python_env)], check=True, timeout=120)
    stages = tmp_path / "stages"
    stages.mkdir()
    text = (REPO / "stages" / "bootstrap.sh").read_text()
    for line in ('modules="zstandard requests tenacity tiktoken numpy pyarrow"', 'fast_module="gigatoken"'):
        assert line in text
    text = text.replace('modules="zstandard requests tenacity tiktoken numpy pyarrow"', 'modules=""')
    (stages / "bootstrap.sh").write_text(text.replace('fast_module="gigatoken"', 'fast_module="bcpp_fast_bpe"'))
    (stages / "requirements.txt").write_text(f"# {tmp_path}\n")  # a digest of its own: a marker of its own
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    yield stages, python_env / "bin" / "python", env
    for marker in Path("/tmp").glob(f"bcp-pipeline-fast-bpe-{os.getuid()}-*"):
        if marker.stat().st_mtime >= tmp_path.stat().st_mtime:
            marker.unlink(missing_ok=True)


def bootstrap(stages: Path, python: Path, env: dict) -> subprocess.CompletedProcess:
    program = "import importlib.util; print(importlib.util.find_spec('bcpp_fast_bpe') is not None)"
    return subprocess.run(
        ["bash", str(stages / "bootstrap.sh"), str(python), "-c", program],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_engine_is_installed_without_its_declared_dependencies(job, tmp_path):
    stages, python, env = job
    path = engine_wheel(tmp_path, "bcpp_fast_bpe")
    (stages / "requirements-fast.txt").write_text(
        f"{path} --hash=sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}\n"
    )
    done = bootstrap(stages, python, env)
    assert done.returncode == 0, done.stderr
    assert "installing the fast BPE engine" in done.stderr and done.stdout == "True\n"


def test_an_engine_that_cannot_be_installed_leaves_the_job_running_and_is_not_retried(job, tmp_path):
    stages, python, env = job
    path = engine_wheel(tmp_path, "bcpp_fast_bpe")
    (stages / "requirements-fast.txt").write_text(f"{path} --hash=sha256:{'0' * 64}\n")  # a wheel that is not this
    first = bootstrap(stages, python, env)
    assert first.returncode == 0, first.stderr
    assert (
        "could not install bcpp_fast_bpe (the fast BPE engine); tokenize-preprocess tokenizes with tiktoken"
        in first.stderr
        and first.stdout == "False\n"
    )
    again = bootstrap(stages, python, env)
    assert again.returncode == 0 and "fast BPE engine" not in again.stderr and again.stdout == "False\n"
