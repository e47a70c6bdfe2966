"""The stall guard on the emulated BCP (tests/fakes/ngc_api.py, an EMULATOR of the NGC API that NVIDIA's client talks
to): a training that stops printing steps is killed through NVIDIA's client and submitted again, its reason and last
lines in `status`; while it runs, `status` shows each replica's GPU utilization from `ngc base-command job
telemetry` (the emulator's model: busy while a replica's log grows, idle once it stops: tests/fakes/ngc_telemetry.py).
"""

from __future__ import annotations

import json

from support.bcp_emulation import needs_ngcsdk
from support.pipeline_fixtures import STALLING_TRAINER, start_orchestrator, wait_for, write_chain_project

from bcp_pipeline.cli.main import main
from bcp_pipeline.engine.state import RunStore, StageStatus

pytestmark = needs_ngcsdk

CONFIG = """\
version: 1
stages_dir: stages
backends:
  bcp: {transport: TRANSPORT, poll_min_seconds: 0.1, poll_max_seconds: 0.3, training_log_seconds: 0.2,
        telemetry_seconds: 0.3}
pipelines:
  train:
    workspace: {name: main}
    defaults:
      bcp: {image: "nvcr.io/nvaie/nemo-framework-training:23.11", instance: dgxa100.80g.8.norm, total_runtime: 1h,
            workspaces: [{name: main, mount: /mount_workspace, mode: RW}]}
    verification:
      bcp: {instance: dgxa100.80g.1.norm}
    stages:
      pretrain:
        program: trainer.py
        args: ["${workspace}/ckpt", "10", "STALL_AT", "0.3"]
        continuation: {checkpoints: "${workspace}/ckpt", target_steps: 10}
        stall_guard: {at_least: 3s, first_step: 4s, max_restarts: RESTARTS}
"""


def project(tmp_path, fake, *, stall_at: int, stalls: int, restarts: int = 2):
    config = write_chain_project(
        tmp_path / "project",
        CONFIG.replace("TRANSPORT", fake.transport)
        .replace("STALL_AT", str(stall_at))
        .replace("RESTARTS", str(restarts)),
    )
    (config.parent / "stages/trainer.py").write_text(STALLING_TRAINER)
    (fake.workspace_path("main") / "stalls").write_text(str(stalls))
    return config


def latest(config):
    return RunStore(config.parent / ".bcp-pipeline").latest()


def first_job(config) -> dict | None:
    try:
        state = json.loads(next((config.parent / ".bcp-pipeline/runs").glob("*/state.json")).read_text())
        return state["stages"]["pretrain"]["jobs"][0]
    except (StopIteration, ValueError, KeyError, IndexError):
        return None


def test_a_stalled_training_is_killed_and_submitted_again_with_its_gpu_utilization_shown(fake, tmp_path, capsys):
    config = project(tmp_path, fake, stall_at=6, stalls=1)
    orchestrator = start_orchestrator(config, "run", "train", "--backend", "bcp")
    try:
        # While it trains, its replica reads busy, and `status` shows it.
        wait_for(
            lambda: ((first_job(config) or {}).get("gpu_utilization") or {}).get("replicas") == {"0": 97.0},
            timeout=60,
            what="a busy GPU utilization sample of the running training",
        )
        assert main(["--config", str(config), "status"]) == 0
        shown = capsys.readouterr().out
        job_id = first_job(config)["job_id"]
        assert f"pretrain: job {job_id} GPU utilization: replica 0 97% (at " in shown
        output, _ = orchestrator.communicate(timeout=180)
    finally:
        orchestrator.kill()
    assert orchestrator.returncode == 0, output
    stage = latest(config).stages["pretrain"]
    assert stage.status is StageStatus.SUCCEEDED and stage.verification["steps"] == 10
    jobs = [job for job in stage.jobs if job.kind == "stage"]
    assert [job.state for job in jobs] == ["stalled", "succeeded"]
    stalled = jobs[0]
    assert stalled.native == "KILLED_BY_USER"  # killed through NVIDIA's client: `job kill`
    assert stalled.stall["reason"].startswith("no new step for ") and "after step 6" in stalled.stall["reason"]
    assert stalled.gpu_utilization["replicas"] == {"0": 0.0}  # it stopped printing: the emulator reads it idle
    assert f"{stalled.job_id} stalled (no new step for" in output
    assert "submitting it again (stall restart 1 of 2)" in output
    definitions = [
        record["job"]["jobDefinition"]
        for record in fake.jobs().values()
        if record["job"]["jobDefinition"]["name"] == "train.pretrain"
    ]
    assert len(definitions) == 2 and definitions[0]["command"] == definitions[1]["command"]

    assert main(["--config", str(config), "status"]) == 0
    shown = capsys.readouterr().out
    assert f"pretrain: job {stalled.job_id} stalled: no new step for" in shown
    assert "waiting in all_reduce after step 6" in shown and "step 6/10 loss" in shown
    assert "hf_secretvalue123" not in shown

    # The report shows the stall, its last lines and each replica's last GPU utilization sample.
    assert main(["--config", str(config), "report"]) == 0
    page = (config.parent / ".bcp-pipeline/runs" / latest(config).run_id / "report.html").read_text()
    assert "<h2>Stalls and GPU utilization</h2>" in page
    assert f'<td>{stalled.job_id}</td><td class="st-stalled">stalled</td><td>replica 0 0% (at ' in page
    assert "waiting in all_reduce after step 6" in page and "hf_secretvalue123" not in page


def test_a_training_that_hangs_before_its_first_step_fails_once_its_restarts_are_spent(fake, tmp_path, capsys):
    config = project(tmp_path, fake, stall_at=0, stalls=5, restarts=1)
    assert main(["--config", str(config), "run", "train", "--backend", "bcp"]) == 1
    stage = latest(config).stages["pretrain"]
    jobs = [job for job in stage.jobs if job.kind == "stage"]
    assert [job.state for job in jobs] == ["stalled", "stalled"]
    assert all("(limit: stall_guard.first_step 4s)" in job.stall["reason"] for job in jobs)
    assert stage.error.startswith(f"job {jobs[1].job_id} stalled: no step line in ")
    assert "(stall_guard.max_restarts: 1)" in stage.error
    capsys.readouterr()
    assert main(["--config", str(config), "status"]) == 0
    shown = capsys.readouterr().out
    assert "waiting in all_reduce after step 0" in shown
    assert len(fake.jobs()) == 4  # two training jobs and their verifications; none left running
    assert all(record["job"]["jobStatus"]["status"] != "RUNNING" for record in fake.jobs().values())
