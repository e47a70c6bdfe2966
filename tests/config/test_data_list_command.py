"""config/data_list_command.py: the data list command every backend's training job runs, in each engine's form
(stages/data_list.py's own tests check what it writes)."""

from __future__ import annotations

from bcp_pipeline.config import bridge, nemo
from bcp_pipeline.config.model import MegatronBridgeTraining, NemoTraining


def training(**extra: str) -> NemoTraining:
    return NemoTraining(
        model="gpt3/126m",
        run_name="gpt",
        data_dir="${data}/preprocessed",
        bpe_dir="${data}/bpe",
        results_dir="${workspace}/results",
        **extra,
    )


def test_without_a_held_out_split_the_command_writes_the_flat_list():
    argv = nemo.DATA_LIST.argv(training(), {"data": "/ws/d"}, python="python3", code="/ws/code", out="/r/p.txt")
    assert argv == [
        "python3",
        "/ws/code/data_list.py",
        "--data-dir",
        "/ws/d/preprocessed",
        "--format",
        "hydra",
        "--key",
        "training.model.data.data_prefix",
        "--out",
        "/r/p.txt",
    ]


def test_a_held_out_split_asks_for_nemo_s_per_split_form_from_its_own_folder():
    section = training(valid_data_dir="${data}/validation/preprocessed")
    argv = nemo.DATA_LIST.argv(section, {"data": "/ws/d"}, python="/venv/python", code="/c", out="/r/f")
    assert argv[:2] == ["/venv/python", "/c/data_list.py"]
    held_out = argv.index("--valid-data-dir")
    assert argv[held_out : held_out + 4] == [
        "--valid-data-dir",
        "/ws/d/validation/preprocessed",
        "--split-form",
        "nemo",
    ]
    assert argv[argv.index("--data-dir") + 1] == "/ws/d/preprocessed" and argv[-2:] == ["--out", "/r/f"]


def test_bridge_s_held_out_split_takes_data_list_py_s_default_form_under_its_own_key():
    section = MegatronBridgeTraining(
        run_name="gpt", data_dir="${data}/pre", valid_data_dir="${data}/held", bpe_dir="/b", results_dir="/r"
    )
    argv = bridge.DATA_LIST.argv(section, {"data": "/ws/d"}, python="py", code="/c", out="/r/f")
    assert argv == [
        "py",
        "/c/data_list.py",
        "--data-dir",
        "/ws/d/pre",
        "--valid-data-dir",
        "/ws/d/held",
        "--format",
        "hydra",
        "--key",
        "dataset.data_path",
        "--out",
        "/r/f",
    ]
