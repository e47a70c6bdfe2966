"""`check`'s NeMo probe: the pretrain stage's launcher composes its config (Hydra's `--cfg job`) with the overrides
`run` renders, and the composed values are compared with what `plan` assumed.

On the NGC API EMULATOR the launcher is a STAND-IN (tests/fakes/nemo_launcher/, not NVIDIA's code), composed by
real Hydra; the row readers are also given outputs the stand-in does not produce (pure tests below).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import data_list
import pytest
from support.bcp_emulation import needs_ngcsdk
from support.check_fixtures import REPO, project

from bcp_pipeline.backends.bcp import nemo_probe as bcp_nemo
from bcp_pipeline.backends.checks import lines_of
from bcp_pipeline.check.run import CheckRequest, run_check
from bcp_pipeline.cli.main import main
from bcp_pipeline.engine.selection import RunRequest, choose_run
from bcp_pipeline.engine.state import RunStore
from bcp_pipeline.errors import ConfigError

STAND_IN = REPO / "tests" / "fakes" / "nemo_launcher" / "launcher_scripts"
PIPELINE = "slimpajama-126m"  # NeMo's gpt3/126m on 4 nodes


def nemo_check(tmp_path: Path, fake, launcher: Path, *extra: str):
    fake.create_workspace("nemo-framework")
    config = project(tmp_path / "project", f"  bcp: {{transport: {fake.transport}}}\n")
    overrides = [f"pretrain.nemo.launcher_dir={launcher}", *extra]
    result, _ = run_check(
        CheckRequest(
            config_file=config,
            state_root=config.parent / ".bcp-pipeline",
            pipeline=PIPELINE,
            backend="bcp",
            overrides=overrides,
        ),
        dict(os.environ),
    )
    return config, overrides, {row.topic: row for row in result.rows}, result


@needs_ngcsdk
def test_the_launcher_composes_what_plan_assumed(tmp_path, fake):
    _, _, rows, result = nemo_check(tmp_path, fake, STAND_IN)
    row = rows["nemo config (pretrain)"]
    assert row.verdict.value == "ok", row
    # 126m at the 23.11 launcher: TP 1, PP 1, GBS 256, MBS 4; 4 replicas; 1D runtime less the 45 min margin
    assert (
        "TP 1, PP 1, global batch 256, micro batch 4, num_nodes 4, max_steps 600000, per-run time limit 0:23:15:00"
    ) in row.showed and "data list as given" in row.showed
    fact = result.facts["nemo"][0]
    assert fact["composed"] is True and fact["image"] == "nvcr.io/nvaie/nemo-framework-training:23.11"
    # The probe ran in the pretrain stage's own image, one replica on the ACE's smallest instance, and is gone.
    records = list(fake.jobs().values())
    nemo = [r for r in records if r["job"]["jobDefinition"]["name"] == "bcp-pipeline.check-nemo"]
    assert len(nemo) == 1
    definition = nemo[0]["job"]["jobDefinition"]
    assert definition["dockerImageName"] == "nvaie/nemo-framework-training:23.11"
    assert definition["resources"]["name"] == "dgxa100.80g.1.norm" and definition.get("replicaCount", 1) == 1
    # The stage validates on its held-out split: NeMo's per-split dict was composed, as the job's three overrides.
    assert "~training.model.data.data_prefix" in definition["command"] and fact["data_list_as_given"] is True
    assert all(r["job"]["jobStatus"]["status"] in ("FINISHED_SUCCESS", "KILLED_BY_USER") for r in records)


@needs_ngcsdk
def test_a_refused_override_is_reported_and_run_refuses_that_stage(tmp_path, fake, capsys):
    """A launcher whose training config has no `trainer.devices` (as a release without that key would): Hydra
    refuses the override, `check` says which, and `run` refuses the stage until it changes."""
    launcher = tmp_path / "launcher_scripts"
    shutil.copytree(STAND_IN, launcher)
    conf = launcher / "conf" / "training" / "gpt3" / "126m.yaml"
    conf.write_text(conf.read_text().replace("  devices: 8\n", ""))
    config, overrides, rows, result = nemo_check(tmp_path, fake, launcher)
    row = rows["nemo config (pretrain)"]
    assert row.verdict.value == "different", row
    assert "training.trainer.devices" in row.showed and "refused" in row.showed, row.showed
    assert result.facts["nemo"][0]["composed"] is False
    store = RunStore(config.parent / ".bcp-pipeline")
    run = RunRequest(
        pipeline=PIPELINE,
        config_file=config,
        backend="bcp",
        overrides=overrides,
        from_stage=None,
        only=None,
        restart=False,
        detach=False,
    )
    with pytest.raises(ConfigError, match=r"stage pretrain: the NeMo launcher in \S+ refused its overrides"):
        choose_run(run, store)
    assert store.runs() == []
    assert (
        main(
            [
                "--config",
                str(config),
                "plan",
                PIPELINE,
                "--backend",
                "bcp",
                *[w for o in overrides for w in ("--set", o)],
            ]
        )
        == 1
    )  # plan says what run would refuse
    assert (
        "`run` would refuse, from the saved check profile:\n  stage pretrain: the NeMo launcher"
        in capsys.readouterr().err
    )
    # Another composition (here: the stage's run name) is not judged by that finding.
    changed = RunRequest(
        pipeline=PIPELINE,
        config_file=config,
        backend="bcp",
        overrides=[*overrides, "pretrain.nemo.run_name=gpt_126m_b"],
        from_stage=None,
        only=None,
        restart=False,
        detach=False,
    )
    choose_run(changed, store)


# -- the reader, on outputs the stand-in does not produce ----------------------------------------------------------
def probe() -> bcp_nemo.NemoProbe:
    expected = {
        "model.tensor_model_parallel_size": "4",
        "model.pipeline_model_parallel_size": "1",
        "model.global_batch_size": "512",
        "model.micro_batch_size": "1",
        "trainer.num_nodes": "8",
        "trainer.max_steps": "300000",
        "exp_manager.max_time_per_run": "4:23:15:00",
    }
    return bcp_nemo.NemoProbe(
        stage="pretrain",
        image="nvcr.io/nvidia/nemo:23.08",
        launcher="/l/main.py",
        overrides=["training=gpt3/7b_improved"],
        data_list=["training.model.data.data_prefix=[0.5,/w/a,0.5,/w/b]"],
        expected=expected,
    )


def log(tp: int = 4, data: str = "[0.5, /w/a, 0.5, /w/b]", extra: str = "", status: int = 0) -> str:
    cfg = f"""# @package training
run:
  name: gpt_8b
trainer:
  num_nodes: 8
  max_steps: 300000
exp_manager:
  max_time_per_run: 4:23:15:00
model:
  micro_batch_size: 1
  global_batch_size: 512
  tensor_model_parallel_size: {tp}
  pipeline_model_parallel_size: 1
  data:
    data_prefix: {data}
{extra}"""
    return (
        "BCPP-NEMO-DATA training.model.data.data_prefix=[0.5,/w/a,0.5,/w/b]\n"
        + "".join(f"BCPP-NEMO-CFG {line}\n" for line in cfg.splitlines())
        + f"BCPP-NEMO-EXIT {status}\n"
    )


ENDED = type("Status", (), {"native": "FINISHED_SUCCESS", "detail": ""})()


def test_the_reader_names_each_difference_and_its_fix():
    row, fact = bcp_nemo.nemo_row(probe(), log(), ENDED)
    assert row.verdict.value == "ok", row
    row, fact = bcp_nemo.nemo_row(probe(), log(tp=2), ENDED)  # a 23.08 launcher: TP 2
    assert row.verdict.value == "different" and "TP 2 (plan assumed 4)" in row.showed
    assert "--set pretrain.nemo.tensor_parallel=2" in row.meaning and fact["differences"] == [
        "model.tensor_model_parallel_size"
    ]


def test_a_changed_data_list_a_missing_value_and_a_refusal_are_never_ok():
    row, _ = bcp_nemo.nemo_row(probe(), log(data="[1.0, /pile/my-gpt3_00_text_document]"), ENDED)
    assert row.verdict.value == "different" and "other data than preprocessing wrote" in row.meaning
    row, fact = bcp_nemo.nemo_row(probe(), log(extra="optim:\n  name: ???"), ENDED)
    assert row.verdict.value == "different" and fact["missing"] == ["training.optim.name"]
    refused = log(status=1).replace(
        "BCPP-NEMO-CFG # @package training", "BCPP-NEMO-CFG Could not override 'training.run.time_limit'."
    )
    row, fact = bcp_nemo.nemo_row(probe(), refused, ENDED)
    assert row.verdict.value == "different" and fact["composed"] is False
    row, _ = bcp_nemo.nemo_row(probe(), "BCPP-NEMO-DATA x\n", ENDED)  # the launcher never answered
    assert row.verdict.value == "could not check"
    row, _ = bcp_nemo.nemo_row(probe(), None, None)
    assert row.verdict.value == "could not check"


# -- a held-out split: NeMo's per-split dict, three overrides as the job's data list file holds them ---------------
SPLIT_KEY = "training.model.data.data_prefix"
TRAIN = [0.5, "/w/bcpp-check-a_text_document", 0.5, "/w/bcpp-check-b_text_document"]
HELD_OUT = [1.0, "/v/bcpp-check-v_text_document"]


def test_the_probe_s_data_list_is_what_the_job_s_data_list_py_writes_for_its_samples():
    assert bcp_nemo.sample_data_list("/w", "/v") == data_list.render_nemo_per_split(TRAIN, HELD_OUT, SPLIT_KEY)
    assert bcp_nemo.sample_data_list("/w", None) == [data_list.render_hydra(TRAIN, SPLIT_KEY)]


def test_each_override_reaches_the_launcher_as_one_word_and_is_printed_as_given(tmp_path):
    """`sh` runs the probe's command line with a launcher that prints its arguments: `~` and `{...}` stay
    verbatim (no tilde or brace expansion), one argument each, after the stage's own overrides."""
    launcher = tmp_path / "main.py"
    launcher.write_text("import json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    lines = bcp_nemo.sample_data_list("/w", "/v")
    script = bcp_nemo.nemo_commandline(replace(probe(), launcher=str(launcher), data_list=lines))
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert lines_of(out, "BCPP-NEMO-DATA") == lines
    assert json.loads(lines_of(out, "BCPP-NEMO-CFG")[0]) == [
        "training=gpt3/7b_improved",
        *lines,
        "--cfg",
        "job",
        "--package",
        "training",
        "--resolve",
    ]


def per_split_log(data: str, splits_string: str = "null") -> str:
    """A composed config whose data_prefix is `data` (YAML), given the three per-split overrides."""
    lines = bcp_nemo.sample_data_list("/w", "/v")
    given = "".join(f"BCPP-NEMO-DATA {line}\n" for line in lines)
    composed = log(data=f"{data}\n    splits_string: {splits_string}").split("\n", 1)[1]  # its DATA line dropped
    return given + composed


def test_the_reader_accepts_the_per_split_dict_as_given_and_nothing_else():
    split_probe = replace(probe(), data_list=bcp_nemo.sample_data_list("/w", "/v"))
    train, held_out = f"[{', '.join(map(str, TRAIN))}]", f"[{', '.join(map(str, HELD_OUT))}]"
    as_given = f"{{train: {train}, validation: {held_out}, test: {held_out}}}"
    row, fact = bcp_nemo.nemo_row(split_probe, per_split_log(as_given), ENDED)
    assert row.verdict.value == "ok" and fact["data_list_as_given"] is True, row
    for composed, splits_string in (
        (train, "null"),  # the flat list left in place: the launcher would split data_dir 99990,8,2
        (f"{{train: {train}, validation: {held_out}}}", "null"),  # no test split: NeMo refuses the dict
        (f"{{train: {train}, validation: {train}, test: {held_out}}}", "null"),  # validating on training data
        (as_given, "99990,8,2"),  # splits_string not nulled as given
    ):
        row, fact = bcp_nemo.nemo_row(split_probe, per_split_log(composed, splits_string), ENDED)
        assert row.verdict.value == "different" and fact["data_list_as_given"] is False, composed
        assert "other data than preprocessing wrote" in row.meaning
