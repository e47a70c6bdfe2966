"""The evaluate stage's streamed edge at load time: accepted from the smoke pretrain (the bundled demo's), refused
from a training whose checkpoints evaluate.py cannot read (NeMo's, Megatron-Bridge's) at its line; and its
verification's count, `expect: ${steps}, group: ${every}`, one result per checkpoint interval and the last."""

from __future__ import annotations

from pathlib import Path

import evaluate
import pytest
from support.pipeline_fixtures import REPO

from bcp_pipeline.config.load import load_config
from bcp_pipeline.config.model import expected_count
from bcp_pipeline.errors import ConfigError

PIPELINE = """\
version: 1
stages_dir: {stages}
pipelines:
  p:
    workspace: {{name: w}}
    vars: {{steps: "STEPS", every: "EVERY"}}
    stages:
      pretrain:
        program: pretrain_local.py
        args: [--data-dir, d, --results, "${{workspace}}/r", --run-name, x]
SECTION        verify: [{{glob: "${{workspace}}/r/x/train_summary.json", expect: 1}}]
      evaluate:
        program: evaluate.py
        args: [--checkpoints, "${{workspace}}/r/x/checkpoints", --valid-data-dir, v, --out, "${{workspace}}/r/x/e",
               --every, "${{every}}", --target-step, "${{steps}}"]
        needs: [{{stage: pretrain, stream: true}}]
        verify: [{{glob: "${{workspace}}/r/x/e/step-*.json", expect: "${{steps}}", group: "${{every}}"}}]
"""
NEMO = """\
        nemo: {model: gpt3/126m, run_name: x, data_dir: d, bpe_dir: b, results_dir: r}
"""


def load(tmp_path: Path, steps: int = 60, every: int = 20, section: str = ""):
    path = tmp_path / "pipelines.yaml"
    text = PIPELINE.format(stages=REPO / "stages").replace("STEPS", str(steps)).replace("EVERY", str(every))
    path.write_text(text.replace("SECTION", section))
    return load_config(path, pipeline="p").pipeline("p")


@pytest.mark.parametrize(("steps", "every"), [(60, 20), (6, 20), (61, 20), (1, 1), (24, 4)])
def test_the_verification_counts_the_schedule_evaluate_keeps(tmp_path, steps, every):
    pipeline = load(tmp_path, steps, every)
    assert pipeline.stages["evaluate"].streamed == ["pretrain"]
    count = expected_count(pipeline, "evaluate", pipeline.stages["evaluate"].verify[0])
    assert count == len(evaluate.scheduled_steps(every, steps))


def test_an_evaluation_streamed_from_a_nemo_training_is_refused_at_its_line(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, section=NEMO)
    message = str(info.value)
    assert "pipelines.yaml:" in message and "evaluates the smoke pretrain's checkpoints (step=N.pt) only" in message
    assert "the NeMo launcher's are not read" in message


def test_the_bundled_demo_evaluates_each_checkpoint_as_it_lands():
    demo = load_config(REPO / "pipelines.yaml", pipeline="demo").pipeline("demo")
    evaluate_stage, pretrain = demo.stages["evaluate"], demo.stages["pretrain"]
    assert evaluate_stage.streamed == ["pretrain"] and "tokenize-validation" in evaluate_stage.needs
    assert expected_count(demo, "evaluate", evaluate_stage.verify[0]) == 3  # steps 20, 40, 60
    valid = pretrain.args[pretrain.args.index("--valid-data-dir") + 1]
    assert valid == evaluate_stage.args[evaluate_stage.args.index("--valid-data-dir") + 1]
    assert valid.endswith("/validation/preprocessed")
