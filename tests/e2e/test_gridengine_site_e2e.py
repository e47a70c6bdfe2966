"""Grid Engine as a busy site's users run it, on the real two-host cell (tests/support/sge_cluster.py): with
accounting that lags, a job's own start and exit records decide what accounting has not told yet (records.py);
h_rt expiry; a data stage's node-local scratch ($TMPDIR).

The cell flushes accounting at once, so `qacct` here is tests/fakes/slow_qacct/qacct: a FAKE, a wrapper around the
cell's real qacct that hides each record until BCP_FAKE_QACCT_LAG seconds after the job's end (the real records,
byte for byte, once shown). Grid Engine, its jobs, h_rt and qdel are real.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from support.cli import cli
from support.pipeline_fixtures import (
    DEMO_SPREAD,
    GE_CHAIN,
    GE_OPTIONS,
    REPO,
    TRAINER,
    start_orchestrator,
    wait_for,
    without_training,
    write_chain_project,
)
from support.sge_cluster import SgeCell, sge_cell  # noqa: F401 (the fixture)

from bcp_pipeline.backends.contract import JobRequest, JobState
from bcp_pipeline.backends.gridengine.records import PENDING, PENDING_SLOW
from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.load import load_config
from bcp_pipeline.engine.state import RunStore, StageStatus

pytestmark = pytest.mark.usefixtures("sge_cell")
SLOW_QACCT = REPO / "tests" / "fakes" / "slow_qacct"


@pytest.fixture
def slow_accounting(monkeypatch: pytest.MonkeyPatch):
    """`qacct` on PATH is the lagging wrapper; returns a setter for its lag in seconds."""
    monkeypatch.setenv("PATH", f"{SLOW_QACCT}:{os.environ['PATH']}")

    def lag(seconds: float) -> None:
        monkeypatch.setenv("BCP_FAKE_QACCT_LAG", str(seconds))

    return lag


def test_the_wrapper_hides_a_record_then_shows_the_real_one(slow_accounting, tmp_path: Path) -> None:
    slow_accounting(6)
    job = subprocess.run(
        ["qsub", "-terse", "-sync", "y", "-j", "y", "-o", str(tmp_path / "x.log"), "-b", "y", "/bin/true"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    hidden = subprocess.run(["qacct", "-j", job], capture_output=True, text=True)
    assert hidden.returncode == 1 and f"job id {job} not found" in hidden.stderr, hidden
    shown = wait_for(
        lambda: (r := subprocess.run(["qacct", "-j", job], capture_output=True, text=True)).returncode == 0 and r,
        timeout=20,
        what="the record once the lag is over",
    )
    assert f"jobnumber {job} " in " ".join(shown.stdout.split()) + " ", shown.stdout


def test_a_run_finishes_from_its_jobs_own_records_while_accounting_lags(slow_accounting, tmp_path: Path) -> None:
    """Accounting hidden for 10 minutes, the grace 3 s: before the jobs' own records, every stage was cancelled as
    "deleted before it started" 3 s after its job left qstat."""
    slow_accounting(600)
    reference = write_chain_project(tmp_path / "local", GE_CHAIN)
    assert cli(reference, "run", "chain", "--backend", "local") == 0
    config = write_chain_project(tmp_path / "ge", GE_CHAIN)
    assert cli(config, "run", "chain", "--backend", "gridengine") == 0
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    assert all(stage.status is StageStatus.SUCCEEDED for stage in state.stages.values())
    jobs = [job for stage in state.stages.values() for job in stage.jobs]
    assert jobs and all("own exit record" in job.detail for job in jobs), [job.detail for job in jobs]
    # The records sit in the run's log folder, none in the workspace beside the stage's outputs.
    first = state.stages["first"].jobs[0].job_id
    logs = config.parent / ".bcp-pipeline/runs" / state.run_id / "logs" / first
    assert sorted(p.name for p in logs.glob("task-*")) == [
        "task-1.exit",
        "task-1.started",
        "task-2.exit",
        "task-2.started",
    ]
    assert not [p for p in (config.parent / "ws").rglob("task-*")]


def test_a_failing_stage_fails_with_its_exit_status_while_accounting_lags(slow_accounting, tmp_path: Path) -> None:
    slow_accounting(600)
    config = write_chain_project(tmp_path / "ge", GE_CHAIN)
    (config.parent / "ws/main/first").mkdir(parents=True)
    (config.parent / "ws/main/first/FAIL-item-0003.txt").touch()  # rank 1 (array task 2) fails item 3
    assert cli(config, "run", "chain", "--backend", "gridengine") == 1
    stage = RunStore(config.parent / ".bcp-pipeline").latest().stages["first"]
    assert stage.status is StageStatus.FAILED and "task 2: exit status 1" in stage.error, stage.error


def sleeper_backend(tmp_path: Path, h_rt: str | None = None):
    """The chain's first stage as one plain job running `sleep 60` (its rendered script: the record lines too)."""
    text = GE_CHAIN.replace(
        "        gridengine: {nodes: 2}\n",
        "        gridengine: {nodes: 1, command: [sleep, '60']" + (f", h_rt: {h_rt}" if h_rt else "") + "}\n",
    )
    assert text != GE_CHAIN
    loaded = load_config(write_chain_project(tmp_path / "p", text))
    pipeline = loaded.pipelines["chain"]
    backend = make_backend("gridengine", loaded, pipeline, tmp_path / "p/.bcp-pipeline/runs/manual")
    request = JobRequest(
        run_id="manual", pipeline=pipeline, stage=pipeline.stages["first"], kind="stage", program="items.py", args=()
    )
    return backend, backend.render(request)


def natives_until_finished(backend, job: str, timeout: float) -> tuple[list[str], object]:
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = backend.poll([job]).get(job)
        if status is not None:
            if not seen or seen[-1] != status.native:
                seen.append(status.native)
            if status.state.finished:
                return seen, status
        time.sleep(0.3)
    raise AssertionError(f"job {job} did not finish in {timeout} s; natives seen: {seen}")


def test_a_running_job_deleted_is_pending_then_slow_until_accounting_answers(slow_accounting, tmp_path: Path) -> None:
    """qdel of a running job kills it (SIGKILL: no exit record), so only accounting can tell its end."""
    slow_accounting(12)
    backend, submission = sleeper_backend(tmp_path)
    job = backend.submit(submission)
    started = backend.logs_dir / job / "task-1.started"
    wait_for(started.exists, timeout=60, what="the job's start record")
    backend.cancel([job])
    seen, status = natives_until_finished(backend, job, timeout=60)
    assert PENDING in seen and PENDING_SLOW in seen and seen.index(PENDING) < seen.index(PENDING_SLOW), seen
    assert status.state is JobState.CANCELLED and "failed 100" in status.detail, status


CONTINUED = """\
version: 1
stages_dir: stages
backends:
  gridengine: {workspace_dir: ws, poll_seconds: 0.3, poll_max_seconds: 1, accounting_grace_seconds: 3}
pipelines:
  train:
    workspace: {name: main}
    vars: {target: "10"}
    stages:
      pretrain:
        program: trainer.py
        args: ["${workspace}/ckpt", "4", "${target}"]
        continuation: {checkpoints: "${workspace}/ckpt", target_steps: "${target}", max_attempts: 5}
        gridengine: {h_rt: 5s}
"""
# Each job trains 4 steps, then (short of the target) waits until Grid Engine kills it at h_rt.
OUTLASTS_H_RT = TRAINER + "if new < target:\n    import time\n    time.sleep(600)\n"


def test_h_rt_expiry_on_the_cell_is_timed_out_and_a_training_is_continued(slow_accounting, tmp_path: Path) -> None:
    """h_rt 5 s kills each job short of the target (SIGKILL, no exit record; accounting: failed 37, shown 5 s
    late): each is timed out, not cancelled, and the training is submitted again until it reaches its steps."""
    slow_accounting(5)
    config = write_chain_project(tmp_path / "p", CONTINUED)
    (config.parent / "stages/trainer.py").write_text(OUTLASTS_H_RT)
    assert cli(config, "run", "train", "--backend", "gridengine") == 0
    stage = RunStore(config.parent / ".bcp-pipeline").latest().stages["pretrain"]
    jobs = [job for job in stage.jobs if job.kind == "stage"]
    assert [job.state for job in jobs] == ["timed_out", "timed_out", "succeeded"], [
        (job.state, job.native, job.detail) for job in jobs
    ]
    assert all(job.native == "failed 37" and "h_rt" in job.detail for job in jobs[:2]), [j.detail for j in jobs]
    assert stage.status is StageStatus.SUCCEEDED and stage.attempts == 3
    assert sorted(p.name for p in (config.parent / "ws/main/ckpt").iterdir())[-1] == "step=000010-last.pt"


def demo_data_project(root: Path, backend: str, preprocess: dict) -> Path:
    """The bundled demo's data stages (no pretrain) on `backend`, spread as the conformance test spreads them."""
    raw = yaml.safe_load((REPO / "pipelines.yaml").read_text())
    demo = raw["pipelines"]["demo"]
    without_training(demo["stages"])
    for stage, (nodes, per_node) in DEMO_SPREAD.items():
        demo["stages"][stage]["gridengine"] = {"nodes": nodes, "processes_per_node": per_node}
    demo["stages"]["tokenize-preprocess"]["gridengine"].update(preprocess)
    raw = {
        "version": 1,
        "stages_dir": str(REPO / "stages"),
        "backends": {"gridengine": GE_OPTIONS},
        "pipelines": {"demo": {**demo, "backend": backend}},
    }
    root.mkdir(parents=True)
    (root / "pipelines.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return root / "pipelines.yaml"


def workspace_files(config: Path) -> dict[str, bytes]:
    root = config.parent / ".bcp-pipeline/workspaces/demo"
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".completions" not in p.parts
    }


def test_a_data_stage_with_node_scratch_uses_each_host_s_tmpdir_and_lands_its_outputs_in_the_workspace(
    sge_cell: SgeCell, tmp_path: Path
) -> None:
    """tokenize-preprocess over both hosts with node_scratch: each task's BCP_PIPELINE_SCRATCH is Grid Engine's
    $TMPDIR for the job on its own host (the cell's queue tmpdir per host), gone with the job; the outputs are a
    local run's, byte for byte."""
    marker = tmp_path / "scratch-seen"
    reference = demo_data_project(tmp_path / "local", "local", {})
    assert cli(reference, "run", "demo") == 0
    config = demo_data_project(
        tmp_path / "ge",
        "gridengine",
        {"node_scratch": True, "setup": [f'echo "$(hostname) $BCP_PIPELINE_SCRATCH" >> {marker}']},
    )
    assert cli(config, "run", "demo") == 0
    seen = [line.split(" ", 1) for line in marker.read_text().splitlines()]
    assert sorted(host for host, _ in seen) == sorted(sge_cell.hosts), seen
    for host, folder in seen:
        assert Path(folder).parent == sge_cell.base / "tmp" / host, (host, folder)
        assert not Path(folder).exists()  # Grid Engine removed it when the job ended
    assert workspace_files(config) == workspace_files(reference)


def test_a_held_job_shows_held_in_status_and_runs_once_released(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Submitted held (`-h`, as `qhold` leaves a pending job): queued, `status` says held and names `qrls`; a user's
    `qalter` of the pending job and `qrls` are Grid Engine's own, and the run goes on to its end."""
    text = GE_CHAIN.replace("        gridengine: {nodes: 2}\n", "        gridengine: {nodes: 2, extra_args: [-h]}\n")
    config = write_chain_project(tmp_path / "ge", text)
    orchestrator = start_orchestrator(config, "run", "chain", "--backend", "gridengine")
    try:
        store = RunStore(config.parent / ".bcp-pipeline")
        job = wait_for(
            lambda: (
                (state := store.latest())
                and state.stages["first"].jobs
                and "held" in state.stages["first"].jobs[-1].native
                and state.stages["first"].jobs[-1]
            ),
            timeout=60,
            what="the first stage's job seen held",
        )
        assert job.state == "queued" and job.native == f"hqw, held: qrls {job.job_id}", job
        capsys.readouterr()
        assert cli(config, "status") == 0
        assert f"(hqw, held: qrls {job.job_id})" in capsys.readouterr().out
        subprocess.run(["qalter", "-l", "h_rt=0:10:00", job.job_id], check=True, capture_output=True)
        subprocess.run(["qrls", job.job_id], check=True, capture_output=True)
        output, _ = orchestrator.communicate(timeout=180)
        assert orchestrator.returncode == 0, output
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    assert all(stage.status is StageStatus.SUCCEEDED for stage in state.stages.values())
