"""config/nemo_data.py: the data list command every backend's NeMo job runs (stages/data_list.py's own tests check
what it writes)."""

from __future__ import annotations

from bcp_pipeline.config.model import NemoTraining
from bcp_pipeline.config.nemo_data import data_list_argv


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
    argv = data_list_argv(training(), {"data": "/ws/d"}, python="python3", code="/ws/code", out="/r/data_prefix.txt")
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
        "/r/data_prefix.txt",
    ]


def test_a_held_out_split_asks_for_nemo_s_per_split_form_from_its_own_folder():
    section = training(valid_data_dir="${data}/validation/preprocessed")
    argv = data_list_argv(section, {"data": "/ws/d"}, python="/venv/python", code="/c", out="/r/f")
    assert argv[:2] == ["/venv/python", "/c/data_list.py"]
    held_out = argv.index("--valid-data-dir")
    assert argv[held_out : held_out + 4] == [
        "--valid-data-dir",
        "/ws/d/validation/preprocessed",
        "--split-form",
        "nemo",
    ]
    assert argv[argv.index("--data-dir") + 1] == "/ws/d/preprocessed" and argv[-2:] == ["--out", "/r/f"]
