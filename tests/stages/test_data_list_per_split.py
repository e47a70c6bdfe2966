"""data_list.py --valid-data-dir [--test-data-dir]: megatron-core's per-split blends (train from --data-dir,
validation and test from the held-out splits' own outputs, test null without one), as the Megatron-Bridge job's
data list file holds them; the real preprocess stage's outputs read back. (Real Bridge resolving the line:
tests/bridge/test_bridge_real.py.)"""

from __future__ import annotations

import json

import data_list
import pytest
from support.heldout_data import make_heldout_split
from support.smoke_pretrain import make_dataset


def test_the_per_split_line_names_each_split_s_own_outputs(tmp_path):
    train, held_out = make_dataset(tmp_path / "train", chunks=(30, 10)), make_heldout_split(tmp_path / "held", 10)
    out = tmp_path / "data_path.txt"
    assert data_list.main(["--data-dir", str(train), "--valid-data-dir", str(held_out), "--out", str(out)]) == 0
    key, value = out.read_text().rstrip("\n").split("=", 1)
    assert key == "dataset.blend_per_split"
    train_blend = data_list.split_blend(data_list.blend(data_list.build_data_list(train)))
    expected = (
        f"[[[{','.join(train_blend[0])}],[{','.join(map(repr, train_blend[1]))}]],"
        f"[[{held_out}/validation_chunk_0.jsonl_text_document],[1.0]],null]"
    )
    assert value == expected and abs(sum(train_blend[1]) - 1) < 1e-9


def test_a_test_split_is_the_third_blend_and_in_nemo_s_dict_its_test(tmp_path):
    train = make_dataset(tmp_path / "train", chunks=(30, 10))
    valid = make_heldout_split(tmp_path / "valid", 10)
    test = make_heldout_split(tmp_path / "test", 12, split="test", seed=7)
    out = tmp_path / "data_path.txt"
    argv = ["--data-dir", str(train), "--valid-data-dir", str(valid), "--test-data-dir", str(test)]
    assert data_list.main([*argv, "--out", str(out)]) == 0
    assert (
        out.read_text()
        .rstrip("\n")
        .endswith(
            f"[[{valid}/validation_chunk_0.jsonl_text_document],[1.0]],[[{test}/test_chunk_0.jsonl_text_document],[1.0]]]"
        )
    )
    assert data_list.main([*argv, "--split-form", "nemo", "--key", NEMO_KEY, "--out", str(out)]) == 0
    added = out.read_text().splitlines()[1]
    assert added.endswith(
        f"validation:[1.0,{valid}/validation_chunk_0.jsonl_text_document],"
        f"test:[1.0,{test}/test_chunk_0.jsonl_text_document]}}"
    )


def test_a_test_split_alone_or_of_another_tokenizer_is_refused_naming_it(tmp_path, capsys):
    train = make_dataset(tmp_path / "train", chunks=(5,))
    test = make_heldout_split(tmp_path / "test", 5, split="test")
    with pytest.raises(SystemExit) as exit_:
        data_list.main(["--data-dir", str(train), "--test-data-dir", str(test)])
    assert exit_.value.code == 2 and "--test-data-dir needs --valid-data-dir" in capsys.readouterr().err
    manifest = test / "test_chunk_0.jsonl_text_document.manifest.json"
    fields = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**fields, "tokenizer": {**fields["tokenizer"], "vocab_sha256": "0" * 64}}))
    argv = ["--data-dir", str(train), "--valid-data-dir", str(train), "--test-data-dir", str(test)]
    assert data_list.main(argv) == 1
    err = capsys.readouterr().err
    assert f"{manifest}: tokenizer" in err and "differs from the training data's" in err, err


def test_a_held_out_split_renders_the_hydra_form_only(tmp_path, capsys):
    train = make_dataset(tmp_path / "train", chunks=(5,))
    with pytest.raises(SystemExit) as exit_:
        data_list.main(["--data-dir", str(train), "--valid-data-dir", str(train), "--format", "json"])
    assert exit_.value.code == 2
    assert "--valid-data-dir renders the hydra format only" in capsys.readouterr().err


NEMO_KEY = "training.model.data.data_prefix"


def test_the_nemo_form_is_three_overrides_with_the_held_out_split_as_validation_and_test(tmp_path):
    train, held_out = make_dataset(tmp_path / "train", chunks=(30, 10)), make_heldout_split(tmp_path / "held", 10)
    out = tmp_path / "data_prefix.txt"
    argv = ["--data-dir", str(train), "--valid-data-dir", str(held_out), "--split-form", "nemo", "--key", NEMO_KEY]
    assert data_list.main([*argv, "--out", str(out)]) == 0
    train_list = data_list.hydra_list(data_list.blend(data_list.build_data_list(train)))
    held_out_list = f"[1.0,{held_out}/validation_chunk_0.jsonl_text_document]"
    assert out.read_text().splitlines() == [
        f"~{NEMO_KEY}",
        f"+{NEMO_KEY}={{train:{train_list},validation:{held_out_list},test:{held_out_list}}}",
        "training.model.data.splits_string=null",
    ]


def test_the_nemo_form_composes_over_the_launcher_s_flat_list_in_real_hydra(tmp_path):
    """The three lines, given to the launcher stand-in's Hydra config (conf/ as the launcher's: a flat
    data_prefix and a splits_string), compose NeMo's dict; `KEY={...}` alone is refused."""
    hydra = pytest.importorskip("hydra", reason="hydra-core is in the test extra")
    from omegaconf import OmegaConf
    from support.nemo_project import NEMO_STAND_IN

    lines = data_list.render_nemo_per_split([0.75, "/d/a", 0.25, "/d/b"], [1.0, "/v/h"], NEMO_KEY)
    with hydra.initialize_config_dir(str(NEMO_STAND_IN / "launcher_scripts/conf"), version_base=None):
        composed = hydra.compose("config", ["launcher_scripts_path=/opt/launcher", *lines])
        with pytest.raises(Exception, match="Error merging override"):
            hydra.compose("config", ["launcher_scripts_path=/opt/launcher", lines[1].removeprefix("+")])
    data = OmegaConf.to_container(composed.training.model.data)
    assert data["data_prefix"] == {
        "train": [0.75, "/d/a", 0.25, "/d/b"],
        "validation": [1.0, "/v/h"],
        "test": [1.0, "/v/h"],
    }
    assert data["splits_string"] is None
