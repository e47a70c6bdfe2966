"""tests/fakes/ngc-emulator: the NGC API EMULATOR (tests/fakes/ngc_api.py, a fake, named so) started alone, as a user
trying BCP mode without an account would start it; the environment it prints is what NVIDIA's client and
bcp-pipeline then use, and it stops (its jobs killed) on SIGTERM as on Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from support.bcp_emulation import needs_ngcsdk
from support.golden_files import REPO

pytestmark = needs_ngcsdk
SCRIPT = REPO / "tests" / "fakes" / "ngc-emulator"


def exported(lines: list[str]) -> dict[str, str]:
    """`export KEY=VALUE` lines (values shell-quoted) as a mapping."""
    import shlex

    return dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in lines)


def test_the_emulator_starts_alone_prints_its_environment_and_stops_on_sigterm(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(REPO / "stages", project / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pipelines.yaml", project / "pipelines.yaml")
    home = tmp_path / "emulator"
    process = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            "--home",
            str(home),
            "--workspace",
            "demo",
            "--ace-limit",
            "maxRuntimeSeconds=5400",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [process.stdout.readline().rstrip("\n") for _ in range(10)]
        assert all(line.startswith("export ") for line in lines), (lines, process.stderr.read())
        env = exported(lines)
        assert env["NGC_CLI_API_URL"].startswith("https://127.0.0.1:")
        assert env["PATH"].split(":")[0] == str(REPO / "tests" / "fakes")  # NVIDIA's CLI code as `ngc`
        assert (home / "env.sh").read_text().splitlines() == lines  # `source` it in another shell
        base = {key: value for key, value in os.environ.items() if not key.startswith("NGC_CLI_")}

        def bcp_pipeline(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "bcp_pipeline", *args],
                cwd=project,
                env={**base, **env},
                capture_output=True,
                text=True,
                timeout=120,
            )

        plan = bcp_pipeline("plan", "demo", "--backend", "bcp")
        assert plan.returncode == 0, plan.stderr
        assert "ACE bcpp-test-ace: every job fits its limits" in plan.stderr  # the ACE was read from the emulator
        detached = bcp_pipeline("plan", "demo", "--backend", "bcp", "--detach")
        assert detached.returncode == 1 and "maxRuntimeSeconds allows 1H30M (5400 s)" in detached.stderr
        info = subprocess.run(
            ["ngc", "workspace", "info", "demo", "--format_type", "json"],
            env={**base, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert info.returncode == 0 and '"name": "demo"' in info.stdout, info.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "stopped (its jobs killed)" in err
    try:
        urllib.request.urlopen(env["NGC_CLI_API_URL"], timeout=5)  # noqa: S310 - loopback only
        raise AssertionError("the emulator still answers after SIGTERM")
    except urllib.error.URLError as exc:
        assert "refused" in str(exc.reason).lower() or "connect" in str(exc.reason).lower(), exc


def test_run_detach_works_on_the_emulator_as_the_readme_says(tmp_path):
    """The README's steps (start the emulator, source its env.sh, `run --detach`): the driver's secret is there
    without `ngc user secret create`, which the emulator does not answer, and the detached run finishes."""
    project = tmp_path / "project"
    shutil.copytree(REPO / "stages", project / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pipelines.yaml", project / "pipelines.yaml")
    home = tmp_path / "emulator"
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--home", str(home)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        env = exported([process.stdout.readline().rstrip("\n") for _ in range(10)])
        base = {key: value for key, value in os.environ.items() if not key.startswith("NGC_CLI_")}

        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                list(args), cwd=project, env={**base, **env}, capture_output=True, text=True, timeout=180
            )

        listed = run("ngc", "user", "secret", "list", "--format_type", "json")
        assert listed.returncode == 0 and "bcp-pipeline-ngc" in listed.stdout, listed.stderr
        assert env["NGC_CLI_API_KEY"] not in listed.stdout  # names and key names only, never a value
        detached = run(
            sys.executable, "-m", "bcp_pipeline", "run", "demo", "--backend", "bcp", "--detach", "--only", "sample"
        )
        assert detached.returncode == 0, detached.stderr
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            status = run(sys.executable, "-m", "bcp_pipeline", "status", "--json")
            if json.loads(status.stdout)["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(2)
        assert json.loads(status.stdout)["status"] == "succeeded", (status.stdout, status.stderr)
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)


def test_an_unknown_ace_limit_is_refused_by_name(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--home", str(tmp_path / "emulator"), "--ace-limit", "maxRuntme=5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "unknown ACE limit(s) ['maxRuntme']" in done.stderr, done.stderr
    assert done.stdout == ""
