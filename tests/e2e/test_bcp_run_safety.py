"""Runs that never block or lie, on the emulated BCP (NVIDIA's client against the NGC API EMULATOR on loopback,
tests/fakes/ngc_api.py: a fake, named so): a corrupt state file blocks only its own run, a BCP workspace has one
writer (an orchestrator here, in another project, or a detached driver job), outputs another config made are
redone, and a missing workspace is named before a run is recorded."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.bcp_emulation import needs_ngcsdk
from support.cli import cli
from support.golden_files import REPO
from support.pipeline_fixtures import bcp_chain_config, start_orchestrator, wait_for, write_chain_project

from bcp_pipeline.engine.state import RunStore

pytestmark = needs_ngcsdk
SECRET = "bcp-pipeline-ngc"


@pytest.fixture
def project(tmp_path, fake):
    fake.set_secret(SECRET, {"api_key": fake.api_key})  # for a driver job (`run --detach`)
    text = bcp_chain_config(fake.transport).replace(
        "poll_max_seconds: 0.3}", "poll_max_seconds: 0.3, driver: {total_runtime: 1h, handover_before: 10m}}"
    )
    return write_chain_project(tmp_path / "project", text)


def second_writer(config: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """A second orchestrator as its own process: refused at once, or still running at `timeout`."""
    return subprocess.run(
        [sys.executable, "-m", "bcp_pipeline", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def store(config: Path) -> RunStore:
    return RunStore(config.parent / ".bcp-pipeline")


def running(fake, stage: str) -> bool:
    return any(
        record["job"]["jobDefinition"]["name"] == f"chain.{stage}" and record["job"]["jobStatus"]["status"] == "RUNNING"
        for record in fake.jobs().values()
    )


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_a_corrupt_bcp_run_is_set_aside_and_a_new_run_works(fake, project, capsys):
    assert cli(project, "run", "chain", "--backend", "bcp", "--only", "first") == 0
    old = store(project).latest()
    state_path = store(project).state_path(old.run_id)
    text = state_path.read_text()[:300]
    state_path.write_text(text)
    capsys.readouterr()
    assert cli(project, "run", "chain", "--backend", "bcp", "--only", "first", "--restart") == 0
    assert cli(project, "list") == 0
    out, err = capsys.readouterr()
    aside = next(state_path.parent.glob("state.corrupt-*.json"))
    assert aside.read_text() == text and err.count(f"run {old.run_id} is corrupt") == 1
    assert f"corrupt (state set aside as {aside})" in out
    assert store(project).latest().status == "succeeded"


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_one_writer_per_bcp_workspace_across_projects_and_a_detached_driver(fake, project, tmp_path, capsys):
    other = write_chain_project(tmp_path / "other project", bcp_chain_config(fake.transport))  # same workspace
    stall = fake.workspace_path("main") / "first/STALL"
    stall.parent.mkdir(parents=True, exist_ok=True)
    stall.touch()
    first = start_orchestrator(project, "run", "chain", "--backend", "bcp")
    try:
        wait_for(lambda: running(fake, "first"), timeout=120, what="the first run's job running")
        holder = store(project).latest().run_id
        for config, args in ((project, ["--restart"]), (other, []), (other, ["--only", "third"])):
            refused = second_writer(config, "run", "chain", "--backend", "bcp", *args)
            assert refused.returncode == 1, (args, refused.stderr)
            assert f"workspace main (bcp) is being written by run {holder}" in refused.stderr, refused.stderr
        assert store(other).runs() == []
    finally:
        first.send_signal(signal.SIGKILL)  # its lock goes with it; its job is stopped with the run below
        first.wait()
    assert cli(project, "cancel", holder) == 0

    assert cli(project, "run", "chain", "--backend", "bcp", "--restart", "--detach") == 0
    detached = store(project).latest().run_id
    capsys.readouterr()
    refused = second_writer(other, "run", "chain", "--backend", "bcp")
    assert refused.returncode == 1
    assert f"is being written by run {detached}" in refused.stderr and "detached to a BCP driver job" in refused.stderr
    assert cli(project, "cancel", detached) == 0  # the driver's hold ends with its run
    stall.unlink()
    assert cli(other, "run", "chain", "--backend", "bcp") == 0


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_a_sample_made_with_another_seed_is_redone_on_bcp(fake, tmp_path, capsys):
    shutil.copytree(REPO / "stages", tmp_path / "demo/stages", ignore=shutil.ignore_patterns("__pycache__"))
    config = tmp_path / "demo/pipelines.yaml"
    config.write_text(
        (REPO / "pipelines.yaml")
        .read_text()
        .replace(
            "\nbackends:\n", "\nbackends:\n  bcp: {transport: sdk, poll_min_seconds: 0.2, poll_max_seconds: 0.5}\n", 1
        )
    )
    fake.create_workspace("demo")
    seed = (
        "sample.args=[--out, '${{mirror}}', --chunks, '2', --files-per-chunk, '4', --docs-per-file, '40', "
        "--seed, '{}', --validation-files, '${{validation_files}}']"
    )
    mirror = fake.workspace_path("demo") / "mirror"

    def sample(value: int) -> dict[str, bytes]:
        assert (
            cli(config, "run", "demo", "--backend", "bcp", "--only", "sample", "--restart", "--set", seed.format(value))
            == 0
        )
        return {str(p.relative_to(mirror)): p.read_bytes() for p in sorted((mirror / "train").rglob("*.zst"))}

    before = sample(0)
    after = sample(7)
    assert after.keys() == before.keys() and all(after[k] != before[k] for k in before)
    aside = next(mirror.glob(".superseded-*"))
    assert {str(p.relative_to(aside)): p.read_bytes() for p in sorted((aside / "train").rglob("*.zst"))} == before
    capsys.readouterr()
    assert cli(config, "status") == 0
    assert "sample: 10 output(s) made by another config" in capsys.readouterr().out  # 8 train, 2 held out


def test_a_missing_workspace_is_named_before_a_run_is_recorded(fake, tmp_path, capsys):
    config = write_chain_project(
        tmp_path / "project",
        bcp_chain_config(fake.transport).replace(
            "{name: main, mount: /mount_workspace, mode: RW}", "{name: nowhere, mount: /mount_workspace, mode: RW}"
        ),
    )
    capsys.readouterr()
    assert cli(config, "run", "chain", "--backend", "bcp") == 2
    err = capsys.readouterr().err
    assert "BCP workspace 'nowhere'" in err and "ngc workspace create --name nowhere" in err
    assert store(config).runs() == [] and not fake.jobs()
    assert cli(config, "run", "chain") == 0  # and nothing blocks the local backend
