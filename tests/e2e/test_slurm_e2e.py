"""The Slurm backend on a real single-node Slurm cluster (scripts/slurm-cluster via the `slurm_cluster` fixture).

The `chain` pipeline of tests/support/pipeline_fixtures.py runs as real sbatch jobs (the orchestrator as a real
subprocess where a test kills it), in a workspace whose path holds spaces, quotes and ';'. What every backend must do
the same way (the demo, pretrain included here, byte-identical to a local run; a killed orchestrator's job re-attached
by `resume`; one squeue a poll) is tests/e2e/test_backend_conformance.py's `TestSlurm`. Where Slurm cannot be
installed, the fixture skips every test here and prints why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.chaos_backends import processes
from support.cli import cli
from support.pipeline_fixtures import SLURM_CHAIN, stall_stage, start_orchestrator, wait_for, write_chain_project
from support.pipeline_fixtures import SLURM_WORKSPACE_DIR as WORKSPACE_DIR
from support.slurm_cluster import slurm_cluster  # noqa: F401  (the session fixture)

from bcp_pipeline.engine.state import RunStore, StageStatus

pytestmark = pytest.mark.usefixtures("slurm_cluster")


def project(root: Path) -> Path:
    return write_chain_project(root, SLURM_CHAIN)


def run_chain(config: Path, *args: str) -> int:
    return cli(config, "run", "chain", "--backend", "slurm", *args)


def state_of(config: Path):
    return RunStore(config.parent / ".bcp-pipeline").latest()


def workspace_files(config: Path) -> dict[str, str]:
    root = config.parent / WORKSPACE_DIR / "main"
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("item-*.txt"))}


def jobs_named(run_id: str) -> list[tuple[str, str, str]]:
    """(id, name, state) of every Slurm job of the run, as squeue lists them: what was really sbatch'd."""
    out = subprocess.run(
        ["squeue", "--noheader", "--states=all", "--Format=JobID:|,Name:|,State:|"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [tuple(line.split("|")[:3]) for line in out.splitlines()]
    return sorted((r for r in rows if r[1].startswith(run_id + ".")), key=lambda r: int(r[0]))


def stage_job(config: Path, stage: str, state: str = "RUNNING") -> str | None:
    """The id of the stage's job once the run records it and Slurm says it is in `state`."""
    runs = sorted((config.parent / ".bcp-pipeline/runs").glob("*/state.json"))
    try:
        data = json.loads(runs[-1].read_text()) if runs else None
    except ValueError:
        return None
    jobs = data and [j for j in data["stages"][stage]["jobs"] if j["kind"] == "stage"]
    if not jobs:
        return None
    job_id = jobs[-1]["job_id"]
    listed = [r for r in jobs_named(data["run_id"]) if r[0] == job_id]
    return job_id if listed and listed[0][2] == state else None


def stall(config: Path, stage: str) -> Path:
    return stall_stage(config.parent / WORKSPACE_DIR / "main", stage)


def test_chain_runs_as_slurm_jobs_and_status_shows_their_ids(tmp_path, capsys):
    config = project(tmp_path)
    assert run_chain(config) == 0
    state = state_of(config)
    assert [s.status for s in state.stages.values()] == [StageStatus.SUCCEEDED] * 3
    assert state.stages["second"].sharding == {"replicas": 1, "processes": 3}
    files = workspace_files(config)
    assert len(files) == 15
    assert files["first/item-0001.txt"] == "item-0001.txt by rank 1 of 2\n"  # SLURM_PROCID/SLURM_NTASKS -> RANK
    assert files["second/item-0002.txt"] == "item-0002.txt by rank 2 of 3\n"
    listed = jobs_named(state.run_id)
    names = [name for _, name, _ in listed]
    assert names == [f"{state.run_id}.{s}{k}" for s in ("first", "second", "third") for k in ("", ".verify")]
    assert all(slurm_state == "COMPLETED" for _, _, slurm_state in listed)
    recorded = [j.job_id for s in state.stages.values() for j in s.jobs]
    assert recorded == [job_id for job_id, _, _ in listed]
    capsys.readouterr()
    assert cli(config, "status") == 0
    out = capsys.readouterr().out
    assert "backend slurm" in out and f"{recorded[0]}(COMPLETED), {recorded[1]}*(COMPLETED)" in out
    assert cli(config, "logs", state.run_id, "first", "--rank", "1") == 0
    assert '"rank": 1' in capsys.readouterr().out


def items_processes(output_folder: str) -> list[int]:
    """The running items.py programs writing into `output_folder` (not the srun and bash around them)."""
    return [
        pid
        for pid, _group, argv in processes()
        if len(argv) > 3 and argv[1].endswith("/items.py") and argv[2:4] == ["--out", output_folder]
    ]


def slurmctld_pid() -> int:
    """The controller of the session's cluster, from the PID file its slurm.conf names."""
    conf = Path(os.environ["SLURM_CONF"]).read_text()
    pid_file = next(line.split("=", 1)[1] for line in conf.splitlines() if line.startswith("SlurmctldPidFile="))
    return int(Path(pid_file).read_text().split()[0])


def test_a_controller_that_stops_answering_stops_the_run_after_its_outage_limit_and_resume_goes_on(tmp_path):
    """slurmctld stopped (SIGSTOP: a hung controller; every squeue times out) while a stage runs: past
    `status_outage_limit` the run exits 75 (EX_TEMPFAIL) naming the outage and `resume`, leaves the job alone,
    and once the controller answers again `resume` re-attaches to that same job and finishes the run."""
    config = project(tmp_path)
    text = config.read_text().replace("poll_max_seconds: 1}", "poll_max_seconds: 1, status_outage_limit: 3s}")
    assert text != config.read_text()
    config.write_text(text)
    marker = stall(config, "second")
    orchestrator = start_orchestrator(config, "run", "chain", "--backend", "slurm")
    job_id = wait_for(lambda: stage_job(config, "second"), what="stage second's job to run")
    # Its 3 tasks started: an srun still confirming its allocation with a stopped controller fails the job (real
    # Slurm: "Unable to confirm allocation ... Socket timed out"); tasks already running are not touched.
    output_folder = str(config.parent / WORKSPACE_DIR / "main" / "second")
    wait_for(lambda: len(items_processes(output_folder)) == 3, what="the 3 tasks of stage second to run")
    controller = slurmctld_pid()
    os.kill(controller, signal.SIGSTOP)
    try:
        output, _ = orchestrator.communicate(timeout=180)
    finally:
        os.kill(controller, signal.SIGCONT)
    run_id = state_of(config).run_id
    assert orchestrator.returncode == 75, output
    error = output.strip().splitlines()[-1]
    assert error.startswith("bcp-pipeline: error: slurm has not answered a status query for "), error
    assert "calls in a row failed; the last: `squeue` exited " in error
    assert (
        f"left its jobs as they are: they may well be running. Once slurm answers, `bcp-pipeline resume "
        f"{run_id}` re-attaches to them; `backends.slurm.status_outage_limit` in pipelines.yaml sets how long "
        f"a run waits (now 3S; null: for ever)"
    ) in error
    state = state_of(config)
    assert state.stages["second"].status is StageStatus.RUNNING
    assert [j.job_id for j in state.stages["second"].jobs] == [job_id]
    wait_for(lambda: stage_job(config, "second"), what="the controller to answer again")  # the job still runs
    marker.unlink()
    assert cli(config, "resume") == 0
    assert [r[0] for r in jobs_named(run_id) if r[1] == f"{run_id}.second"] == [job_id]  # re-attached, not resubmitted
    assert len(workspace_files(config)) == 15


def test_crash_between_sbatch_and_record_adopts_the_live_job(tmp_path, monkeypatch):
    from bcp_pipeline.backends.slurm.backend import SlurmBackend

    config = project(tmp_path)
    marker = stall(config, "first")
    real_submit = SlurmBackend.submit

    def submit_then_die(self, submission):
        real_submit(self, submission)
        raise KeyboardInterrupt  # the orchestrator dies before it records the job id

    monkeypatch.setattr(SlurmBackend, "submit", submit_then_die)
    assert run_chain(config) == 130
    state = state_of(config)
    assert state.stages["first"].status is StageStatus.SUBMITTING and not state.stages["first"].jobs
    monkeypatch.setattr(SlurmBackend, "submit", real_submit)
    # The job stays stalled until resume has looked for it: released earlier, on a loaded machine it could end
    # before resume looks, and a finished job is not a live one to adopt.
    resume = start_orchestrator(config, "resume")
    try:
        wait_for(lambda: state_of(config).stages["first"].jobs, timeout=120, what="resume to record the first job")
        marker.unlink()
        output, _ = resume.communicate(timeout=300)
    finally:
        if resume.poll() is None:
            resume.kill()
    assert resume.returncode == 0, output
    state = state_of(config)
    adopted = [r[0] for r in jobs_named(state.run_id) if r[1] == f"{state.run_id}.first"]
    assert len(adopted) == 1 and state.stages["first"].jobs[0].job_id == adopted[0]
    assert state.stages["first"].attempts == 1


def test_failing_task_fails_its_stage_with_the_log_tail_and_rerun_continues(tmp_path, capsys):
    config = project(tmp_path)
    second = config.parent / WORKSPACE_DIR / "main/second"
    second.mkdir(parents=True)
    (second / "FAIL-item-0004.txt").touch()  # item 4 belongs to rank 1 of 3
    assert run_chain(config) == 1
    state = state_of(config)
    first_jobs = [j.job_id for j in state.stages["first"].jobs]
    assert state.stages["first"].status is StageStatus.SUCCEEDED
    assert state.stages["second"].status is StageStatus.FAILED
    assert state.stages["third"].status is StageStatus.PENDING and not state.stages["third"].jobs
    error = state.stages["second"].error
    failed_job = state.stages["second"].jobs[-1].job_id
    assert error.startswith(f"job {failed_job} ended FAILED: Slurm reason NonZeroExitCode; exit code 1")
    assert "rank 1 exited 1" in error and "item-0004.txt: told to fail by a FAIL- marker" in error  # the tail
    (second / "FAIL-item-0004.txt").unlink()
    assert run_chain(config) == 0
    state = state_of(config)
    assert len(RunStore(config.parent / ".bcp-pipeline").runs()) == 1  # the same run continued
    assert [j.job_id for j in state.stages["first"].jobs] == first_jobs  # not redone
    assert state.stages["second"].attempts == 2
    assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())


def test_scancel_of_a_stage_job_is_reported_cancelled_and_rerun_continues(tmp_path):
    config = project(tmp_path)
    marker = stall(config, "first")
    orchestrator = start_orchestrator(config, "run", "chain", "--backend", "slurm")
    job_id = wait_for(lambda: stage_job(config, "first"), what="stage first's job to run")
    subprocess.run(["scancel", job_id], check=True)
    output, _ = orchestrator.communicate(timeout=60)
    assert orchestrator.returncode == 1, output
    state = state_of(config)
    assert state.stages["first"].status is StageStatus.CANCELLED
    assert state.stages["first"].error.startswith(f"job {job_id} ended CANCELLED")
    marker.unlink()
    assert run_chain(config) == 0
    state = state_of(config)
    assert [j.job_id for j in state.stages["first"].jobs if j.kind == "stage"][0] == job_id
    assert state.stages["first"].attempts == 2
    assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())


def test_a_job_too_big_for_the_cluster_fails_at_once_instead_of_pending_forever(tmp_path):
    config = project(tmp_path)
    started = time.monotonic()
    assert run_chain(config, "--set", "first.slurm.nodes=2") == 1
    assert time.monotonic() - started < 30
    state = state_of(config)
    job_id = state.stages["first"].jobs[-1].job_id
    assert "can never start" in state.stages["first"].error
    wait_for(
        lambda: [r for r in jobs_named(state.run_id) if r[0] == job_id and r[2] == "CANCELLED"],
        timeout=20,
        what="the job to be cancelled",
    )
