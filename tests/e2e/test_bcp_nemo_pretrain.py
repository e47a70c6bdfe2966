"""A NeMo pretrain stage on the emulated BCP, through the job script the BCP backend renders (an EMULATOR of the NGC
API, and a STAND-IN for NVIDIA's NeMo launcher and training script: tests/fakes/README.md, "The NeMo launcher
stand-in", which behaves as NVIDIA's code does: its output captured, `bcprun ... | tee` without pipefail, the
debug mode, Lightning's Timer against NeMo's per-run timer).

What these show: a crashed training fails its job and stage, is not counted as progress, and its error lines are in
`status`; a good one shows its loss lines in `logs`, `status` and the report; every continuation trains (the
per-run time limit); `run --restart` starts a new training at step 0.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.bcp_emulation import needs_ngcsdk
from support.cli import cli
from support.nemo_project import fabricate_nemo_data, nemo_pipelines_yaml
from support.pipeline_fixtures import logs_and_status

from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.engine.selection import open_run
from bcp_pipeline.engine.state import RunStore, StageStatus
from bcp_pipeline.report.data import report_data
from bcp_pipeline.report.gather import training_logs

pytestmark = needs_ngcsdk
ONE_TRANSPORT = pytest.mark.parametrize("fake", ["sdk"], indirect=True)  # what a job does: the same on both


def project(
    tmp_path: Path, fake, *, steps: int = 30, runtime: str = "1h", margin: str = "45m", extra: str = ""
) -> Path:
    # No nemo_dir: on BCP the launcher runs the training itself; the stage's NeMo folder is not read.
    options = f"{{transport: {fake.transport}, poll_min_seconds: 0.1, poll_max_seconds: 0.3, training_log_seconds: 0}}"
    text = nemo_pipelines_yaml(
        "bcp",
        options,
        f"{{replicas: 1, total_runtime: {runtime}, launcher: none}}",
        bcp_workspaces="[{name: main, mount: /mount_workspace, mode: RW}]",
        bcp_verification="{instance: dgxa100.80g.1.norm}",
        nemo_dir=False,
        steps=steps,
        margin=margin,
        extra_overrides=extra,
    )
    config = tmp_path / "project" / "pipelines.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(text)
    fabricate_nemo_data(fake.workspace_path("main") / "data" / "preprocessed")
    return config


def latest(config: Path):
    return RunStore(config.parent / ".bcp-pipeline").latest()


def nemo_runs(fake) -> list[str]:
    return sorted(p.name for p in (fake.workspace_path("main") / "results").iterdir() if p.is_dir())


def test_a_good_pretrain_shows_its_loss_in_logs_status_and_the_report(fake, tmp_path, capsys):
    config = project(tmp_path, fake)
    assert cli(config, "run", "nemo", "--backend", "bcp") == 0
    state = latest(config)
    stage = state.stages["pretrain"]
    assert stage.status is StageStatus.SUCCEEDED and stage.attempts == 1
    assert stage.progress["done"] == 30 and stage.progress["total"] == 30 and stage.progress["unit"] == "steps"
    # The NeMo run is this run's own: RUN_NAME-RUN_ID.
    assert nemo_runs(fake) == [f"gpt-{state.run_id}"]
    log, status = logs_and_status(config, state.run_id, "pretrain", capsys)
    assert "reduced_train_loss=" in log and "global_step=29.000" in log
    # 126m: 256 x 2,048 tokens a step at the stand-in's 0.02 s a step (its train_step_timing)
    assert f"30/30 steps, loss {stage.progress['loss']:.3g}, 26.2 M tokens/s" in status, status
    # The report reads the same log: its loss chart has the 30 steps.
    store = RunStore(config.parent / ".bcp-pipeline")
    chosen = open_run(store, state.run_id)
    backend = make_backend("bcp", chosen.config, chosen.pipeline, store.run_dir(state.run_id))
    notes: list[str] = []
    logs = training_logs(chosen.state, chosen.pipeline, backend, notes)
    data = report_data(chosen.state, now=0.0, training_logs=logs)
    [series] = data["training"]
    points = series["attempts"][0]["points"]
    assert not notes and [p["step"] for p in points] == list(range(30))
    assert stage.progress["loss"] == points[-1]["loss"]  # status showed the last loss line of the job log


@ONE_TRANSPORT
def test_a_crashed_training_fails_its_stage_with_the_trainings_own_error(fake, tmp_path, capsys):
    config = project(tmp_path, fake, extra=", +training.standin.crash_at_step=12")
    assert cli(config, "run", "nemo", "--backend", "bcp") == 1
    stage = latest(config).stages["pretrain"]
    jobs = [job for job in stage.jobs if job.kind == "stage"]
    assert stage.status is StageStatus.FAILED and [job.native for job in jobs] == ["FAILED"]
    # Not progress: no verification counted steps, no attempt was resubmitted.
    assert stage.attempts == 1 and "steps_after_attempt" not in stage.extra
    assert "RuntimeError: CUDA error: an illegal memory access" in stage.error
    capsys.readouterr()
    assert cli(config, "status") == 0
    assert "RuntimeError: CUDA error: an illegal memory access" in capsys.readouterr().out


@ONE_TRANSPORT
def test_every_continuation_trains_under_the_per_run_limit(fake, tmp_path, capsys):
    """Each job may run 20 s and trains 8 s of it (margin 12 s): 0.02 s a step, so about 400 steps a job on an idle
    machine; 1,500 steps take several jobs, each of which must train (Lightning's total budget would let only the
    first train)."""
    config = project(tmp_path, fake, steps=1500, runtime="20s", margin="12s")
    assert cli(config, "run", "nemo", "--backend", "bcp") == 0
    stage = latest(config).stages["pretrain"]
    history = stage.extra["steps_after_attempt"]
    assert stage.status is StageStatus.SUCCEEDED and len(history) >= 2
    gains = [after - before for before, after in zip([0, *history], history)]
    assert all(gain > 0 for gain in gains), history
    assert stage.verification["steps"] == 1500 and stage.attempts == len(history) + 1
    assert all(job.native == "FINISHED_SUCCESS" for job in stage.jobs if job.kind == "stage")  # stopped cleanly


@ONE_TRANSPORT
def test_run_restart_trains_from_step_zero_and_resume_continues(fake, tmp_path, capsys):
    config = project(tmp_path, fake, steps=20)
    assert cli(config, "run", "nemo", "--backend", "bcp") == 0
    first = latest(config).run_id
    assert cli(config, "run", "nemo", "--backend", "bcp", "--restart") == 0
    second = latest(config).run_id
    assert second != first and nemo_runs(fake) == sorted([f"gpt-{first}", f"gpt-{second}"])
    capsys.readouterr()
    assert cli(config, "logs", second, "pretrain") == 0
    log = capsys.readouterr().out
    assert "Resuming training from checkpoint" not in log and "global_step=0.000" in log
    checkpoints = fake.workspace_path("main") / "results" / f"gpt-{first}" / "results" / "checkpoints"
    assert {int(re.search(r"-step=(\d+)-", p.name).group(1)) for p in checkpoints.iterdir()} == {10, 20}


@pytest.mark.both_transports
def test_the_job_script_is_uploaded_and_the_commandline_is_one_short_line(fake, tmp_path):
    config = project(tmp_path, fake, steps=10)
    assert cli(config, "run", "nemo", "--backend", "bcp") == 0
    run_id = latest(config).run_id
    job = [r["job"] for r in fake.jobs().values() if r["job"]["jobDefinition"]["name"] == "nemo.pretrain"][0]
    command = job["jobDefinition"]["command"]
    script = f".bcp-pipeline/jobs/{run_id}/"
    assert len(command) < 200 and command.startswith(f"bash /mount_workspace/{script}pretrain-"), command
    uploaded = list((fake.workspace_path("main") / script).glob("pretrain-*.sh"))
    assert len(uploaded) == 1 and command.split()[1].endswith(uploaded[0].name)
    text = uploaded[0].read_text()
    assert "NEMO_LAUNCHER_DEBUG=1 python3" in text and "bash -o pipefail" in text
