"""On the emulated BCP, on both transports: training that hits its runtime is resubmitted with identical arguments;
the demo runs end to end with --backend bcp. (tests/fakes/ngc_api.py is an EMULATOR of the NGC API that NVIDIA's
client talks to; see tests/fakes/README.md.)"""

from __future__ import annotations

import shutil

import pytest
from support.bcp_emulation import jobs_by_stage, needs_ngcsdk
from support.golden_files import REPO
from support.pipeline_fixtures import TRAINER, write_chain_project

from bcp_pipeline.cli.main import main
from bcp_pipeline.engine.state import RunStore, StageStatus

pytestmark = needs_ngcsdk

CONFIG = """\
version: 1
stages_dir: stages
backends:
  bcp: {transport: TRANSPORT, poll_min_seconds: 0.1, poll_max_seconds: 0.3}
pipelines:
  train:
    workspace: {name: main}
    vars: {target: "10"}
    defaults:
      bcp: {image: "nvcr.io/nvaie/nemo-framework-training:23.11", instance: dgxa100.80g.8.norm, total_runtime: 1h,
            workspaces: [{name: main, mount: /mount_workspace, mode: RW}]}
    verification:
      bcp: {instance: dgxa100.80g.1.norm}
    stages:
      pretrain:
        program: trainer.py
        args: ["${workspace}/ckpt", "ADVANCE", "${target}"]
        continuation: {checkpoints: "${workspace}/ckpt", target_steps: "${target}", max_attempts: 5}
"""


def project(tmp_path, advance: int, transport: str):
    config = write_chain_project(
        tmp_path / "project", CONFIG.replace("ADVANCE", str(advance)).replace("TRANSPORT", transport)
    )
    (config.parent / "stages/trainer.py").write_text(TRAINER)
    return config


def latest(config):
    return RunStore(config.parent / ".bcp-pipeline").latest()


def test_run_limit_exceeded_is_resubmitted_with_identical_arguments(fake, tmp_path, capsys):
    config = project(tmp_path, advance=4, transport=fake.transport)
    fake.inject("FAILED_RUN_LIMIT_EXCEEDED", name="train.pretrain", times=2)
    assert main(["--config", str(config), "run", "train", "--backend", "bcp"]) == 0
    stage = latest(config).stages["pretrain"]
    assert stage.status is StageStatus.SUCCEEDED and stage.attempts == 3
    assert [j.native for j in stage.jobs if j.kind == "stage"] == [
        "FAILED_RUN_LIMIT_EXCEEDED",
        "FAILED_RUN_LIMIT_EXCEEDED",
        "FINISHED_SUCCESS",
    ]
    definitions = [job["jobDefinition"] for job in jobs_by_stage(fake)["train.pretrain"]]
    assert len(definitions) == 3
    assert all(d["command"] == definitions[0]["command"] for d in definitions)
    assert all(d["runPolicy"] == definitions[0]["runPolicy"] for d in definitions)
    out = capsys.readouterr().out
    assert "ended FAILED_RUN_LIMIT_EXCEEDED; checking how far it got" in out
    assert "at step 8 of 10 after attempt 2; resubmitting to continue from its last checkpoint" in out


def test_two_attempts_without_progress_stop_with_a_clear_message(fake, tmp_path):
    config = project(tmp_path, advance=0, transport=fake.transport)
    fake.inject("FAILED_RUN_LIMIT_EXCEEDED", name="train.pretrain", times=None)
    assert main(["--config", str(config), "run", "train", "--backend", "bcp"]) == 1
    stage = latest(config).stages["pretrain"]
    assert stage.attempts == 2
    assert stage.error.startswith("no progress in the last two attempts (still at step 0 of 10)")


@pytest.mark.both_transports
def test_demo_runs_end_to_end_on_emulated_bcp(fake, tmp_path):
    """The bundled demo pipeline, every stage as an emulated `ngc base-command job run`."""
    missing = [
        p
        for p in ("sample", "download", "extract", "concat", "preprocess", "pretrain_local")
        if not (REPO / "stages" / f"{p}.py").is_file()
    ]
    if missing:
        pytest.skip(f"stage programs not present: {missing}")
    pytest.importorskip("megatron.core", reason="the demo's smoke pretrain needs the [pretrain] extra")
    project_dir = tmp_path / "demo"
    shutil.copytree(REPO / "stages", project_dir / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    text = (REPO / "pipelines.yaml").read_text()
    config = project_dir / "pipelines.yaml"
    config.write_text(
        text.replace(
            "\nbackends:\n",
            f"\nbackends:\n  bcp: {{transport: {fake.transport}, poll_min_seconds: 0.2, poll_max_seconds: 0.5}}\n",
            1,
        )
    )
    fake.create_workspace("demo")
    assert (
        main(
            [
                "--config",
                str(config),
                "run",
                "demo",
                "--backend",
                "bcp",
                "--set",
                "vars.steps=6",
                "--set",
                "pretrain.args=[--data-dir, '${data}/preprocessed', --results, '${workspace}/results', "
                "--run-name, '${train_run}', --steps, '${steps}', --checkpoint-every, '3', --hidden, '64']",
            ]
        )
        == 0
    )
    state = latest(config)
    assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())
    counts = {name: [c["found"] for c in s.verification["checks"]] for name, s in state.stages.items()}
    assert counts["download"] == [8] and counts["extract"] == [8] and counts["concat"] == [2]
    assert counts["tokenize-preprocess"] == [2, 2]
    assert state.stages["pretrain"].verification["steps"] == 6
    ws = fake.workspace_path("demo")
    assert len(list((ws / "data/slimpajama/preprocessed").glob("*.manifest.json"))) == 2
