"""The data behind `bcp-pipeline report`'s charts and tables (report_data.py, pure), against golden files; the
training-log parser on the three log forms it reads; secrets redacted from the commands.

The run is a stored state with fixed times (a retried pretrain: a first attempt that timed out, a second that
finished, a failed verification of another stage), so the data is the same on every machine. Rewrite the golden
files after an intended change with `UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/report/test_report_data.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.golden_files import assert_golden

from bcp_pipeline.config.instances import instances_table
from bcp_pipeline.config.load import load_config
from bcp_pipeline.engine.state import JobRecord, RunState, StageState, StageStatus
from bcp_pipeline.redact import REDACTED, redact, secret_values
from bcp_pipeline.report.data import SubmittedCommand, report_data
from bcp_pipeline.report.estimates import estimate_pipeline
from bcp_pipeline.training_log import TrainingPoint, parse_training_log

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000.0  # the run's creation; every time below is T0 + seconds

LOCAL_LOG_ATTEMPT_1 = """\
no checkpoint in /ws/results/demo-gpt/checkpoints: starting at step 0 of 6
data: 2 output(s), 123456 tokens; model: ...
step 1/6 loss 10.8200 lr 1.000e-03 0.50 steps/s
step 2/6 loss 10.1000 lr 1.000e-03 0.50 steps/s
step 3/6 loss 9.4000 lr 1.000e-03 0.60 steps/s
checkpoint saved: /ws/results/demo-gpt/checkpoints/step=000003-last.pt
"""
LOCAL_LOG_ATTEMPT_2 = """\
resuming from /ws/results/demo-gpt/checkpoints/step=000003-last.pt at step 3 of 6
step 4/6 loss 8.9000 lr 1.000e-03 1.00 steps/s
step 5/6 loss 8.1000 lr 1.000e-03 1.00 steps/s
step 6/6 loss 7.7500 lr 1.000e-03 1.00 steps/s
done: 6 steps, loss 10.8200 -> 7.7500
"""
# PyTorch Lightning's progress bar as NeMo prints it: updates separated by carriage returns, a step redrawn.
NEMO_LOG = (
    "Epoch 0: :   0%|          | 1/300000 [00:02<?, reduced_train_loss=10.90, global_step=0.000, "
    "consumed_samples=512.0, train_step_timing in s=2.000]\r"
    "Epoch 0: :   0%|          | 2/300000 [00:04<?, reduced_train_loss=10.50, global_step=1.000, "
    "consumed_samples=1024.0, train_step_timing in s=2.500]\r"
    "Epoch 0: :   0%|          | 2/300000 [00:04<?, reduced_train_loss=10.40, global_step=1.000, "
    "consumed_samples=1024.0, train_step_timing in s=2.500]\r"
    "Epoch 0: :   0%|          | 11/300000 [00:24<?, reduced_train_loss=9.700, global_step=10.00, "
    "consumed_samples=5632.0, train_step_timing in s=2.200]\n"
)
MEGATRON_LOG = (
    " iteration       10/  500000 | consumed samples:         5120 | elapsed time per iteration (ms): "
    "2345.6 | learning rate: 1.500E-05 | global batch size:   512 | lm loss: 1.083120E+01 | "
    "loss scale: 1.0 |\n"
    " iteration       20/  500000 | consumed samples:        10240 | elapsed time per iteration (ms): "
    "2000.0 | learning rate: 3.000E-05 | global batch size:   512 | lm loss: 9.912000E+00 |\n"
)


def test_the_smoke_pretrains_elapsed_time_never_runs_backwards():
    """Times rebuilt from a rounded average rate can step back (step 32 at 131.5 s, then step 33 at 131.0 s, as the
    newcomer trial saw): the later step keeps the earlier time instead."""
    log = (
        "starting at step 0 of 60\n"
        "step 32/60 loss 6.1000 lr 1.000e-03 0.2433 steps/s\n"
        "step 33/60 loss 6.0000 lr 1.000e-03 0.2519 steps/s\n"
        "step 34/60 loss 5.9000 lr 1.000e-03 0.2520 steps/s\n"
    )
    seconds = [p.seconds for p in parse_training_log(log)]
    assert seconds[0] == pytest.approx(131.52, abs=0.01) and seconds == sorted(seconds), seconds
    assert seconds[2] == pytest.approx(134.92, abs=0.01)  # later points keep the rate's own reading


def test_parses_the_local_smoke_pretrain_log_with_elapsed_from_its_rate():
    assert parse_training_log(LOCAL_LOG_ATTEMPT_1) == [
        TrainingPoint(1, 10.82, 2.0),
        TrainingPoint(2, 10.1, 4.0),
        TrainingPoint(3, 9.4, 5.0),
    ]
    # A resumed attempt counts its time from the step it resumed at.
    assert [p.seconds for p in parse_training_log(LOCAL_LOG_ATTEMPT_2)] == [1.0, 2.0, 3.0]


def test_parses_nemo_progress_bars_keeping_the_last_value_of_a_redrawn_step():
    assert parse_training_log(NEMO_LOG) == [
        TrainingPoint(0, 10.9, 2.0),
        TrainingPoint(1, 10.4, 7.0),
        TrainingPoint(10, 9.7, 26.8),
    ]


def test_parses_megatron_lm_iteration_lines():
    points = parse_training_log(MEGATRON_LOG)
    assert [(p.step, p.loss) for p in points] == [(10, 10.8312), (20, 9.912)]
    assert points[0].seconds == pytest.approx(2.3456) and points[1].seconds == pytest.approx(22.3456)


def test_a_log_without_training_lines_gives_no_points():
    assert parse_training_log("Traceback (most recent call last):\n  ...\nRuntimeError: CUDA out of memory\n") == []


def test_redaction_removes_secret_values_and_secret_assignments_only():
    text = "HF_TOKEN=hf_abc MY_API_KEY='a b' max_tokens=8 --secret hf-token:HF_TOKEN:HF_TOKEN nvapi-0123456789"
    assert redact(text, ["nvapi-0123456789"]) == (
        f"HF_TOKEN={REDACTED} MY_API_KEY={REDACTED} max_tokens=8 --secret hf-token:HF_TOKEN:HF_TOKEN {REDACTED}"
    )
    assert secret_values(
        {
            "NGC_CLI_API_KEY": "nvapi-0123456789",
            "WANDB_API_KEY": "short",
            "PATH": "/usr/bin:/bin",
            "GITHUB_TOKEN": "ghp_0123456789",
        }
    ) == ["nvapi-0123456789", "ghp_0123456789"]


def job(
    job_id: str,
    kind: str,
    attempt: int,
    submitted: float,
    started: float | None,
    ended: float | None,
    state: str,
    native: str = "",
) -> JobRecord:
    return JobRecord(
        job_id=job_id,
        kind=kind,
        attempt=attempt,
        submitted_at=T0 + submitted,
        state=state,
        native=native,
        started_at=None if started is None else T0 + started,
        ended_at=None if ended is None else T0 + ended,
    )


def stored_run() -> RunState:
    """A BCP run of slimpajama-126m's last stages (at toy scale): preprocess verified, pretrain retried once."""
    stages = {
        "tokenize-preprocess": StageState(
            status=StageStatus.SUCCEEDED,
            sharding={"replicas": 1, "processes": 2},
            attempts=1,
            started_at=T0 + 1,
            finished_at=T0 + 40,
            jobs=[
                job("1001", "stage", 1, 1, 6, 30, "succeeded", "FINISHED_SUCCESS"),
                job("1002", "verify", 1, 30.5, None, 40, "succeeded", "FINISHED_SUCCESS"),
            ],
            verification={
                "ok": True,
                "checks": [
                    {"glob": "/ws/pre/*.bin", "expected": 2, "found": 2, "bytes": 4_000_000},
                    {"glob": "/ws/pre/*.idx", "expected": 2, "found": 2, "bytes": 1_000},
                ],
            },
        ),
        "pretrain": StageState(
            status=StageStatus.SUCCEEDED,
            sharding={"replicas": 1, "processes": 1},
            attempts=2,
            started_at=T0 + 41,
            finished_at=T0 + 100,
            jobs=[
                job("1003", "stage", 1, 41, 50, 60, "timed_out", "FAILED_RUN_LIMIT_EXCEEDED"),
                job("1004", "verify", 1, 60.2, 61, 65, "succeeded", "FINISHED_SUCCESS"),
                job("1005", "stage", 2, 65.5, 70, 90, "succeeded", "FINISHED_SUCCESS"),
                job("1006", "verify", 2, 90.1, 91, 100, "succeeded", "FINISHED_SUCCESS"),
            ],
            verification={
                "ok": True,
                "checks": [{"glob": "/ws/results/train_summary.json", "expected": 1, "found": 1, "bytes": 300}],
                "steps": 6,
                "target": 6,
            },
            extra={"summary": "loss 10.82 -> 7.75 over 6 steps"},
        ),
    }
    return RunState(
        run_id="slimpajama-126m-20231114-221320-abcd",
        pipeline="slimpajama-126m",
        backend="bcp",
        config_file="pipelines.yaml",
        created_at=T0,
        stages=stages,
        updated_at=T0 + 100,
    )


def test_report_data_of_a_finished_run_matches_the_golden_file():
    state = stored_run()
    pipeline = load_config(REPO / "pipelines.yaml").pipeline("slimpajama-126m")  # one with estimates
    estimate = estimate_pipeline(pipeline, instances_table({}))
    actual = {
        "tokenize-preprocess": {"elapsed_s": 39.0, "items_per_s": 2 / 39, "mb_per_s": 4.0 / 39},
        "pretrain": {"elapsed_s": 59.0, "items_per_s": 1 / 59, "steps_per_s": 6 / 59},
    }
    commands = {
        "1003": SubmittedCommand(
            "ngc base-command job run --name demo.pretrain --env-var WANDB_API_KEY:wandb-0123456789 ...",
            "recorded at submission",
        ),
        "1005": SubmittedCommand(
            "ngc base-command job run --name demo.pretrain ... nvapi-0123456789", "recorded at submission"
        ),
    }
    data = report_data(
        state,
        now=T0 + 500,
        estimate=estimate,
        actual=actual,
        training_logs={"1003": LOCAL_LOG_ATTEMPT_1, "1005": LOCAL_LOG_ATTEMPT_2},
        commands=commands,
        secrets=["nvapi-0123456789", "wandb-0123456789"],
        notes=["job states as last recorded"],
    )
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    assert "0123456789" not in text
    assert_golden("report/data-finished.json", text)
    # The charts' essentials, spelled out (the golden file has the rest):
    timeline = {row["job_id"]: row for row in data["timeline"]}
    assert list(timeline) == ["1001", "1002", "1003", "1004", "1005", "1006"]
    first_try = timeline["1003"]
    assert (first_try["queued_s"], first_try["running_s"], first_try["state"]) == (9, 10, "timed_out")
    assert timeline["1002"]["start_observed"] is False and timeline["1002"]["queued_s"] == 0
    attempts = data["training"][0]["attempts"]
    assert [[p["step"] for p in a["points"]] for a in attempts] == [[1, 2, 3], [4, 5, 6]]
    assert [p["run_s"] for p in attempts[1]["points"]] == [71, 72, 73]  # job 1005 started at 70


def test_report_data_of_a_failed_and_a_running_run_matches_the_golden_file():
    """A failed stage with no training log, a stage still running (its bar ends at `now`), a job never submitted."""
    state = RunState(
        run_id="chain-20231114-221320-ef01",
        pipeline="chain",
        backend="slurm",
        config_file="pipelines.yaml",
        created_at=T0,
        updated_at=T0 + 30,
        stages={
            "first": StageState(
                status=StageStatus.FAILED,
                sharding={"replicas": 2, "processes": 1},
                attempts=1,
                started_at=T0 + 1,
                finished_at=T0 + 12,
                jobs=[job("77", "stage", 1, 1, 3, 12, "failed", "FAILED")],
                error="job 77 ended FAILED: rank 1 exited 1",
            ),
            "side": StageState(
                status=StageStatus.RUNNING,
                sharding={"replicas": 1, "processes": 1},
                attempts=1,
                started_at=T0 + 2,
                jobs=[job("78", "stage", 1, 2, None, None, "queued", "PENDING")],
            ),
            "second": StageState(),
        },
    )
    data = report_data(state, now=T0 + 30)
    assert_golden("report/data-failed.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
    assert data["run"]["status"] == "failed" and data["training"] == [] and data["estimates"] == []
    assert data["timeline"][1]["ended_s"] == 30 and data["timeline"][1]["finished"] is False
