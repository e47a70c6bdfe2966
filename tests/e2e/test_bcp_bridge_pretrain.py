"""A Megatron-Bridge pretrain stage on the emulated BCP, through the job script the BCP backend renders and this
project's entry program (an EMULATOR of the NGC API, and a STAND-IN for Megatron-Bridge: tests/fakes/README.md,
"The Megatron-Bridge stand-in"; the entry program's use of the real Bridge is tests/bridge/).

What these show: a crashed training fails its job and stage with its traceback in `status`; a job that stops at its
time limit (exit 0 short of train_iters) is continued until the training is done, each job training; the step lines
of the last rank (on the last node, under bcprun) are in `logs`, `status` and the report.
"""

from __future__ import annotations

import pytest
from support.bcp_emulation import needs_ngcsdk
from support.cli import cli, latest
from support.golden_files import REPO
from support.manifests import chunk_name, fabricate
from support.pipeline_fixtures import logs_and_status

from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.engine.selection import open_run
from bcp_pipeline.engine.state import RunStore, StageStatus
from bcp_pipeline.report.data import report_data
from bcp_pipeline.report.gather import training_logs

pytestmark = needs_ngcsdk
ONE_TRANSPORT = pytest.mark.parametrize("fake", ["sdk"], indirect=True)  # what a job does: the same on both

STAND_IN = REPO / "tests" / "fakes" / "megatron_bridge"
CONFIG = """\
version: 1
stages_dir: @STAGES@
backends:
  bcp: {transport: @TRANSPORT@, poll_min_seconds: 0.1, poll_max_seconds: 0.3, training_log_seconds: 0}
pipelines:
  bridge:
    workspace: {name: main}
    defaults:
      bcp: {image: "nvcr.io/nvidia/nemo:26.08", instance: dgxa100.80g.1.norm, total_runtime: 1h,
            workspaces: [{name: main, mount: /mount_workspace, mode: RW}]}
    verification:
      bcp: {instance: dgxa100.80g.1.norm}
    stages:
      pretrain:
        program: pretrain_local.py
        megatron_bridge:
          model: gpt3/126m
          run_name: gpt
          data_dir: ${workspace}/data/preprocessed
          bpe_dir: ${workspace}/data/bpe
          results_dir: ${workspace}/results
          train_iters: @STEPS@
          time_margin: @MARGIN@
          save_interval: 10
          max_attempts: 40                 # a loaded machine trains fewer steps in a job's minute
          overrides: [logger.log_interval=1]
        bcp:
          replicas: @REPLICAS@
          total_runtime: @RUNTIME@
          env: {PYTHONPATH: "@STAND_IN@", BCPP_BRIDGE_STANDIN_STEP_SECONDS: "@STEP_SECONDS@",
                BCPP_BRIDGE_STANDIN_SECONDS_PER_MINUTE: "@MINUTE@", BCPP_BRIDGE_STANDIN_CRASH_AT_STEP: "@CRASH@"}
"""


def project(
    tmp_path,
    fake,
    *,
    steps: int = 30,
    runtime: str = "1h",
    margin: str = "20m",
    replicas: int = 1,
    minute: float = 60,
    step_seconds: float = 0.02,
    crash: int = 0,
):
    text = CONFIG
    for key, value in (
        ("@TRANSPORT@", fake.transport),
        ("@STAND_IN@", STAND_IN),
        ("@STAGES@", REPO / "stages"),
        ("@STEPS@", steps),
        ("@RUNTIME@", runtime),
        ("@MARGIN@", margin),
        ("@REPLICAS@", replicas),
        ("@MINUTE@", minute),
        ("@STEP_SECONDS@", step_seconds),
        ("@CRASH@", crash),
    ):
        text = text.replace(key, str(value))
    config = tmp_path / "project" / "pipelines.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(text)
    workspace = fake.workspace_path("main")
    for i, tokens in enumerate((3000, 1000)):
        fabricate(workspace / "data" / "preprocessed", chunk_name(i), tokens)
    (workspace / "data" / "bpe").mkdir(parents=True)
    for name in ("vocab.json", "merges.txt"):  # Bridge opens both when it builds the tokenizer
        (workspace / "data" / "bpe" / name).write_text("{}\n" if name.endswith(".json") else "#version: 0.2\n")
    return config


def report_points(config, run_id: str) -> list[dict]:
    store = RunStore(config.parent / ".bcp-pipeline")
    chosen = open_run(store, run_id)
    backend = make_backend("bcp", chosen.config, chosen.pipeline, store.run_dir(run_id))
    notes: list[str] = []
    logs = training_logs(chosen.state, chosen.pipeline, backend, notes)
    data = report_data(chosen.state, now=0.0, training_logs=logs)
    assert not notes
    [series] = data["training"]
    return [p for attempt in series["attempts"] for p in attempt["points"]]


@pytest.mark.parametrize("replicas", [1, 2], ids=["torchrun-1-node", "bcprun-2-nodes"])
@ONE_TRANSPORT
def test_the_last_rank_s_step_lines_are_in_logs_status_and_the_report(fake, tmp_path, capsys, replicas):
    """On 2 replicas the last rank runs on the second node, and the emulator keeps each replica's output in its own
    log (the stricter of the two ways an ACE may): `logs`, `status` and the report still find its lines, in the
    last replica's log after replica 0's."""
    config = project(tmp_path, fake, replicas=replicas)
    assert cli(config, "run", "bridge", "--backend", "bcp") == 0
    state = latest(config)
    stage = state.stages["pretrain"]
    assert stage.status is StageStatus.SUCCEEDED and stage.attempts == 1
    assert (stage.progress["done"], stage.progress["total"], stage.progress["unit"]) == (30, 30, "steps")
    assert stage.verification["steps"] == 30  # the tracker file Bridge writes after its last save
    log, status = logs_and_status(config, state.run_id, "pretrain", capsys)
    assert "iteration       30/      30 |" in log and "throughput per GPU (TFLOP/s/GPU): 123.4" in log
    if replicas > 1:  # the second replica's ranks waited for the rendezvous at replica 0 (stages/rank_start.py)
        assert "node 1 waiting up to 300 s for the rendezvous" in log and "answered after" in log, log[-3000:]
    assert f"30/30 steps, loss {stage.progress['loss']:.3g}" in status, status
    assert [p["step"] for p in report_points(config, state.run_id)] == list(range(1, 31))
    run_folder = fake.workspace_path("main") / "results" / f"gpt-{state.run_id}"
    assert sorted(p.name for p in (run_folder / "checkpoints").iterdir()) == [
        "iter_0000020",
        "iter_0000030",
        "latest_checkpointed_iteration.txt",
    ]  # most_recent_k 2


@ONE_TRANSPORT
def test_a_crashed_training_fails_its_stage_with_its_traceback_in_status(fake, tmp_path, capsys):
    config = project(tmp_path, fake, crash=12)
    assert cli(config, "run", "bridge", "--backend", "bcp") == 1
    stage = latest(config).stages["pretrain"]
    jobs = [job for job in stage.jobs if job.kind == "stage"]
    assert stage.status is StageStatus.FAILED and [job.native for job in jobs] == ["FAILED"]
    assert stage.attempts == 1 and "steps_after_attempt" not in stage.extra  # a crash is no per-run stop
    assert "RuntimeError: CUDA error: an illegal memory access" in stage.error
    capsys.readouterr()
    assert cli(config, "status") == 0
    out = capsys.readouterr().out
    assert "Traceback (most recent call last)" in out and "RuntimeError: CUDA error" in out, out


@ONE_TRANSPORT
def test_a_job_stopped_by_its_time_limit_is_continued_until_train_iters(fake, tmp_path):
    """Each job's limit is 1 minute (3m less the 2m margin), a stand-in minute lasting 20 s: at most 200 steps of
    0.1 s a job, so 450 steps take three jobs or more, each exiting 0 after its save, and each one trains. The limit
    counts from Bridge's start, before its rendezvous and checkpoint load, which a loaded 2-core machine (CI's)
    stretched past a 3 s minute: every job then trained one step and 200 steps outran max_attempts. With 20 s
    the start takes a part of each job's minute, not all of it."""
    config = project(tmp_path, fake, steps=450, runtime="3m", margin="2m", minute=20, step_seconds=0.1)
    assert cli(config, "run", "bridge", "--backend", "bcp") == 0
    stage = latest(config).stages["pretrain"]
    history = stage.extra["steps_after_attempt"]
    assert stage.status is StageStatus.SUCCEEDED and len(history) >= 2, history
    assert all(after > before for before, after in zip([0, *history], history)), history
    assert stage.verification["steps"] == 450 and stage.attempts == len(history) + 1
    assert all(job.native == "FINISHED_SUCCESS" for job in stage.jobs if job.kind == "stage")


EVALUATED = """\
          valid_data_dir: ${workspace}/data/validation
          most_recent_k: 5                 # the stand-in trains faster than an evaluation starts
"""
EVALUATE_STAGE = """\
      evaluate:
        program: evaluate.py
        evaluate_of: pretrain
        needs: [{stage: pretrain, stream: true}]
        bcp:
          env: {PYTHONPATH: "@STAND_IN@", BCPP_BRIDGE_STANDIN_EVAL_SECONDS: "0.5"}
"""


@ONE_TRANSPORT
def test_each_checkpoint_is_evaluated_beside_the_training_and_shown_in_status(fake, tmp_path, capsys):
    """`evaluate_of: pretrain` (config/evaluate.py) on the emulated BCP: the evaluate job starts while the training
    runs, scores each checkpoint of the schedule through the entry program with `validation.skip_train` (the
    stand-in prints Bridge's validation line), and its verification counts one result per checkpoint: 10, 20, 30."""
    config = project(tmp_path, fake)
    text = config.read_text().replace("          train_iters:", EVALUATED + "          train_iters:", 1)
    config.write_text(text + EVALUATE_STAGE.replace("@STAND_IN@", str(STAND_IN)))
    fabricate(fake.workspace_path("main") / "data" / "validation", "validation_chunk_0.jsonl_text_document", 500)
    assert cli(config, "run", "bridge", "--backend", "bcp") == 0
    state = latest(config)
    stage = state.stages["evaluate"]
    assert stage.status is StageStatus.SUCCEEDED and stage.verification
    results = fake.workspace_path("main") / "results" / f"gpt-{state.run_id}" / "evaluate"
    assert sorted(p.name for p in results.glob("step-*.json")) == [f"step-{s:08d}.json" for s in (10, 20, 30)]
    [training] = [job for job in state.stages["pretrain"].jobs if job.kind == "stage"]
    first = [job for job in stage.jobs if job.kind == "stage"][0]
    assert training.submitted_at <= first.submitted_at < training.ended_at  # beside the training, not after it
    log, status = logs_and_status(config, state.run_id, "evaluate", capsys)
    assert "validation loss at iteration 30 on validation set" in log
    assert "held-out loss" in status and "at step 30; 3 checkpoint(s) evaluated" in status, status


@ONE_TRANSPORT
def test_an_evaluation_its_job_limit_ends_goes_on_from_its_last_result(fake, tmp_path):
    """The evaluate job's limit (30 s) is shorter than the training (30 steps of 1.5 s, checkpoints every 10): the
    emulator ends it FAILED_RUN_LIMIT_EXCEEDED while the training goes on, and the stage is submitted again
    (config/evaluate.py's derived continuation), each job going on from the last result, until the training's last
    step is evaluated. A job that found nothing new to evaluate while the training ran is no failure."""
    config = project(tmp_path, fake, step_seconds=1.5)
    text = config.read_text().replace("          train_iters:", EVALUATED + "          train_iters:", 1)
    stage = EVALUATE_STAGE.replace("@STAND_IN@", str(STAND_IN)).replace(
        "        bcp:\n", "        bcp:\n          total_runtime: 30s\n"
    )
    config.write_text(text + stage)
    fabricate(fake.workspace_path("main") / "data" / "validation", "validation_chunk_0.jsonl_text_document", 500)
    assert cli(config, "run", "bridge", "--backend", "bcp") == 0
    state = latest(config)
    evaluate = state.stages["evaluate"]
    jobs = [job for job in evaluate.jobs if job.kind == "stage"]
    assert evaluate.status is StageStatus.SUCCEEDED and len(jobs) >= 2, [job.native for job in jobs]
    # The last job may end at its limit too (CI, 2026-12-06: on a loaded machine it wrote step 30's result and was
    # ended before it exited); the stage goes by what its verification finds, below, not by how its last job ended.
    assert jobs[0].native == "FAILED_RUN_LIMIT_EXCEEDED", [job.native for job in jobs]
    history = evaluate.extra["steps_after_attempt"]  # after each job but the last, which verified as done
    assert history == sorted(history) and history[-1] < 30 and len(history) == len(jobs) - 1, history
    assert evaluate.progress == {"done": 30, "total": 30, "unit": "steps"}
    results = fake.workspace_path("main") / "results" / f"gpt-{state.run_id}" / "evaluate"
    assert sorted(p.name for p in results.glob("step-*.json")) == [f"step-{s:08d}.json" for s in (10, 20, 30)]
    assert evaluate.verification["steps"] == 30 and evaluate.verification["ok"]
    assert state.stages["pretrain"].status is StageStatus.SUCCEEDED
