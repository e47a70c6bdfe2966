"""The local supervisor records the ranks it starts, and a job it was given runs to its end without the orchestrator
that submitted it (issue 50, item 1: an unbounded count is refused at load, config/bounds.py, not half-started).
Real supervisors and real rank processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bcp_pipeline.backends.contract import JobRequest, JobState, Submission
from bcp_pipeline.backends.local.backend import LocalBackend
from bcp_pipeline.config.model import PipelineConfig, StageConfig, Workspace
from bcp_pipeline.config.resources import LocalOptions
from bcp_pipeline.procs import is_alive, process_start_ticks

REPO = Path(__file__).resolve().parents[3]
# A rank: leaves a mark, then waits as a long stage would.
RANK = (
    "import os, time; open(os.path.join(os.environ['MARKS'], 'rank-' + os.environ['RANK']), 'w').close(); "
    "time.sleep(float(os.environ['RANK_SECONDS']))"
)


def a_dead_process() -> dict:
    """The pid and start time of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    record = {"pid": child.pid, "start_ticks": process_start_ticks(child.pid)}
    child.wait()
    return record


def write_job(run_dir: Path, orchestrator: dict, replicas: int, processes: int, seconds: float = 0.0) -> Path:
    """A job folder as LocalBackend.submit writes it (run_dir/jobs/STAGE.1/spec.json)."""
    job_dir = run_dir / "jobs" / "download.1"
    job_dir.mkdir(parents=True)
    marks = run_dir / "marks"
    marks.mkdir()
    spec = {
        "argv": [sys.executable, "-c", RANK],
        "env": {"MARKS": str(marks), "RANK_SECONDS": str(seconds)},
        "replicas": replicas,
        "processes": processes,
        "cwd": str(run_dir),
        "log_dir": str(run_dir / "logs"),
        "master_port": 20001,
        "job_id": "download.1",
        "orchestrator": orchestrator,
        "labels": {"run": "r", "stage": "download", "kind": "stage"},
    }
    (job_dir / "spec.json").write_text(json.dumps(spec))
    return job_dir


def backend(run_dir: Path) -> LocalBackend:
    return LocalBackend(LocalOptions(), config_dir=run_dir, stages_dir=run_dir, run_dir=run_dir, workspace_name="ws")


def test_a_supervisor_whose_orchestrator_is_gone_starts_every_rank_and_its_job_runs_to_its_end(tmp_path):
    """A submitted job outlives its orchestrator however far it had got (resume re-attaches to it); the bound on
    the count, at load, is what keeps a mistaken count from forking without end (test_bounds.py)."""
    job_dir = write_job(tmp_path, a_dead_process(), replicas=2, processes=2)
    done = subprocess.run(
        [sys.executable, "-m", "bcp_pipeline.backends.local.supervisor", str(job_dir)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "marks").iterdir()) == ["rank-0", "rank-1", "rank-2", "rank-3"]
    status = backend(tmp_path).poll(["download.1"])["download.1"]
    assert status.state is JobState.SUCCEEDED, status
    record = json.loads((job_dir / "status.json").read_text())
    assert len(record["ranks"]) == 4 and not any(is_alive(r["pid"], r["start_ticks"]) for r in record["ranks"])


def test_a_submitted_job_names_its_orchestrator_for_the_supervisor(tmp_path):
    local = backend(tmp_path)
    stage = StageConfig(program="items.py", name="download")
    request = JobRequest(
        run_id="r",
        pipeline=PipelineConfig(workspace=Workspace(name="ws"), stages={"download": stage}, name="p"),
        stage=stage,
        kind="stage",
        program="items.py",
        args=(),
    )
    marks = tmp_path / "marks"
    marks.mkdir()
    payload = {
        "argv": [sys.executable, "-c", RANK],
        "env": {"MARKS": str(marks), "RANK_SECONDS": "0"},
        "replicas": 1,
        "processes": 1,
        "labels": {"run": "r", "stage": "download", "kind": "stage"},
    }
    job_id = local.submit(Submission(request=request, printable="", payload=payload))
    spec = json.loads((tmp_path / "jobs" / job_id / "spec.json").read_text())
    assert spec["orchestrator"] == {"pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid())}
    deadline = time.monotonic() + 60
    while (status := local.poll([job_id])[job_id]).state is not JobState.SUCCEEDED:
        assert not status.state.finished and time.monotonic() < deadline, status
        time.sleep(0.1)
    assert sorted(p.name for p in marks.iterdir()) == ["rank-0"]
