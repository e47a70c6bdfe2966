"""The bundled demo's pretrain stage on the local backend: each run trains its own model (its NeMo-like run folder
`demo-gpt-<run id>`), so `run --restart` starts at step 0 instead of "resuming" the last run's finished training,
and `resume` of an interrupted run continues its own. Real PyTorch and megatron-core on data the real preprocess
stage tokenized (tests/support/smoke_pretrain.py's make_dataset)."""

from __future__ import annotations

import json
import shutil

from support.golden_files import REPO
from support.smoke_pretrain import make_dataset

from bcp_pipeline.cli.main import main
from bcp_pipeline.engine.state import RunStore, StageStatus

SMALL = [
    "--set",
    "vars.steps=4",
    "--set",
    "pretrain.args=[--data-dir, '${data}/preprocessed', --results, "
    "'${workspace}/results', --run-name, '${train_run}', --steps, '${steps}', --checkpoint-every, '2', "
    "--seq-length, '32', --hidden, '32', --heads, '2', --global-batch-size, '2']",
]


def test_run_restart_trains_a_new_model_from_step_zero(tmp_path, capsys):
    config = tmp_path / "pipelines.yaml"
    config.write_text(
        (REPO / "pipelines.yaml").read_text().replace("stages_dir: stages", f"stages_dir: {REPO / 'stages'}")
    )
    workspace = tmp_path / ".bcp-pipeline/workspaces/demo"
    shutil.copytree(make_dataset(tmp_path / "made"), workspace / "data/slimpajama/preprocessed")
    run = ["--config", str(config), "run", "demo", "--only", "pretrain", *SMALL]
    assert main(run) == 0
    store = RunStore(tmp_path / ".bcp-pipeline")
    first = store.latest()
    assert main([*run, "--restart"]) == 0
    second = store.latest()
    assert second.run_id != first.run_id and second.stages["pretrain"].status is StageStatus.SUCCEEDED
    summaries = {
        run_id: json.loads((workspace / f"results/demo-gpt-{run_id}/train_summary.json").read_text())
        for run_id in (first.run_id, second.run_id)
    }
    # Both trained their 4 steps from step 0: the second did not "resume at step 4 of 4" from the first.
    assert [summaries[r]["resumed_from_step"] for r in (first.run_id, second.run_id)] == [0, 0]
    assert [summaries[r]["steps"] for r in (first.run_id, second.run_id)] == [4, 4]
