"""An evaluation (`evaluate_of:`) that its site's job limit ends is continued from its last result
(config/evaluate.py derived_continuation; engine/outcomes.py): what the bundled slimpajama-8b-bridge derives, and
how a job that found nothing new to evaluate is judged. The whole loop on the emulated BCP, with the Bridge
stand-in's checkpoints and evaluations: tests/e2e/test_bcp_bridge_pretrain.py; the results' reading by
stages/verify.py: tests/stages/test_evaluate_bridge.py."""

from __future__ import annotations

import pytest
from support.golden_files import REPO

from bcp_pipeline.config.evaluate import results_dir
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.engine.outcomes import Outcomes
from bcp_pipeline.engine.poller import is_training
from bcp_pipeline.engine.state import RunState, StageState, StageStatus

PIPELINE = "slimpajama-8b-bridge"


@pytest.fixture(scope="module")
def pipeline():
    return load_and_check(REPO / "pipelines.yaml", pipeline=PIPELINE).pipelines[PIPELINE]


class Events:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def event(self, text: str) -> None:
        self.lines.append(text)


def test_the_evaluation_continues_toward_the_training_s_last_step_from_its_results(pipeline):
    evaluate, pretrain = pipeline.stages["evaluate"], pipeline.stages["pretrain"]
    continuation = evaluate.continuation
    assert continuation is not None and continuation.checkpoints == results_dir(pretrain)
    assert continuation.checkpoints.endswith("/results/gpt_8b-${run_id}/evaluate")
    assert int(continuation.target_steps) == int(pretrain.continuation.target_steps) == 300000
    assert continuation.max_attempts == pretrain.megatron_bridge.max_attempts
    # the key that raises it is the training's, as the training's own continuation says of itself
    assert continuation.attempts_key == pretrain.continuation.attempts_key == "pretrain.megatron_bridge.max_attempts"
    nemo = load_and_check(REPO / "pipelines.yaml", pipeline="slimpajama-8b").pipelines["slimpajama-8b"]
    assert nemo.stages["pretrain"].continuation.attempts_key == "pretrain.nemo.max_attempts"
    assert "timed_out" in continuation.resubmit_on and "failed" not in continuation.resubmit_on
    # continued, yet no training: no stall guard watches it for step lines, and its log is read as a job's
    assert evaluate.trains is False and not is_training(evaluate)
    assert pretrain.trains is True and is_training(pretrain)


def after_attempts(pipeline, training: StageStatus, steps: list[int]) -> tuple[StageState, Events]:
    """The evaluate stage after a job ended short of the target at each of `steps`, its training `training`."""
    state = RunState(run_id="r", pipeline=PIPELINE, backend="bcp", config_file="", created_at=0.0)
    state.stages = {"pretrain": StageState(status=training), "evaluate": StageState(status=StageStatus.VERIFYING)}
    events = Events()
    outcomes = Outcomes(pipeline=pipeline, backend=None, store=None, state=state, progress=events)
    evaluate = state.stages["evaluate"]
    for attempt, step in enumerate(steps, 1):
        evaluate.attempts = attempt
        assert outcomes.continue_stage("evaluate", evaluate, {"ok": False, "steps": step, "target": 300000})
        if evaluate.status is not StageStatus.SUBMITTING:
            break
    return evaluate, events


@pytest.mark.parametrize("training", [StageStatus.RUNNING, StageStatus.SUBMITTING, StageStatus.PENDING])
def test_jobs_with_nothing_new_to_evaluate_are_no_fault_while_the_training_goes_on(pipeline, training):
    evaluate, events = after_attempts(pipeline, training, [2000, 2000, 2000])
    assert evaluate.status is StageStatus.SUBMITTING and evaluate.error is None
    assert events.lines[-1] == (
        "evaluate: at step 2000 of 300000 after attempt 3; resubmitting to continue from its last result"
    )
    assert evaluate.progress == {"done": 2000, "total": 300000, "unit": "steps"}


@pytest.mark.parametrize("training", [StageStatus.SUCCEEDED, StageStatus.FAILED, StageStatus.CANCELLED])
def test_two_jobs_without_a_new_result_fail_it_once_the_training_has_ended(pipeline, training):
    evaluate, _ = after_attempts(pipeline, training, [2000, 2000, 2000])
    assert evaluate.status is StageStatus.FAILED and evaluate.attempts == 3
    assert evaluate.error.startswith(
        "no progress in the last two attempts (evaluated to step 2000 of 300000, and stage pretrain has ended): "
        "the evaluation is not advancing; read `bcp-pipeline logs r evaluate`"
    ), evaluate.error


def test_max_attempts_bounds_an_evaluation_that_waits(pipeline):
    limit = pipeline.stages["evaluate"].continuation.max_attempts
    evaluate, _ = after_attempts(pipeline, StageStatus.RUNNING, [0] * (limit + 1))
    assert evaluate.status is StageStatus.FAILED and evaluate.attempts == limit
    assert evaluate.error == (
        f"reached max_attempts ({limit}) at step 0 of 300000; raise it and run again to continue "
        f"(--set pretrain.megatron_bridge.max_attempts={2 * limit})"
    )
    # the key it names is one `--set` takes, and the evaluation follows it
    raised = load_and_check(
        REPO / "pipelines.yaml", pipeline=PIPELINE, overrides=[f"pretrain.megatron_bridge.max_attempts={2 * limit}"]
    )
    assert raised.pipelines[PIPELINE].stages["evaluate"].continuation.max_attempts == 2 * limit
