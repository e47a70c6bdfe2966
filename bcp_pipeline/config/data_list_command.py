"""The command that writes a training's data list, as every backend's job runs it, for either engine (pure).

The job runs stages/data_list.py where the data is: it reads the preprocess manifests under the section's
`data_dir` and writes the data list file, one Hydra override a line. Without `valid_data_dir` that is one flat list
`KEY=[w,prefix,...]`. With it, per-split data from the held-out split's own outputs, in the split form the engine
reads: megatron-core's `dataset.blend_per_split` (Megatron-Bridge; data_list.py's default form) or NeMo's dict
`{train, validation, test}`, which takes three overrides (stages/data_list.py render_nemo_per_split says why).
A `test_data_dir` beside it is the test split (else megatron-core has none and NeMo tests on the validation split).

Each engine declares its form once (config/nemo.py and config/bridge.py `DATA_LIST`); the backend passes what
differs by backend: the interpreter, the stages/ folder and the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from bcp_pipeline.config.model import MegatronBridgeTraining, NemoTraining
from bcp_pipeline.config.placeholders import substitute

DATA_LIST_PROGRAM = "data_list.py"  # in stages/


@dataclass(frozen=True, kw_only=True)
class DataListForm:
    """How an engine reads its data list: the override's key, and the split form for a held-out split."""

    key: str  # the flat list's Hydra key (data_list.py --key)
    split_form: str | None  # data_list.py --split-form with valid_data_dir; None: its default (megatron)

    def argv(
        self,
        section: NemoTraining | MegatronBridgeTraining,
        values: dict[str, str],
        *,
        python: str,
        code: str,
        out: str,
    ) -> list[str]:
        """`python code/data_list.py ...` writing the data list of the training `section` to `out`; `values`: the
        backend's ${...} values as its job sees them (the data folders are resolved with them)."""
        held_out = held_out_flags(section, values)
        if held_out and self.split_form:
            held_out += ["--split-form", self.split_form]
        return [
            python,
            f"{code}/{DATA_LIST_PROGRAM}",
            "--data-dir",
            substitute(section.data_dir, values),
            *held_out,
            "--format",
            "hydra",
            "--key",
            self.key,
            "--out",
            out,
        ]


def held_out_flags(section: NemoTraining | MegatronBridgeTraining, values: dict[str, str] | None = None) -> list[str]:
    """data_list.py's (and bridge_index.py's) `--valid-data-dir DIR [--test-data-dir DIR]` of the training
    `section`, resolved with `values` (placeholders kept without); none without a validation split (held_out_error
    refuses a test split alone at load)."""
    if not section.valid_data_dir:
        return []
    flags = ["--valid-data-dir", substitute(section.valid_data_dir, values or {})]
    if section.test_data_dir:
        flags += ["--test-data-dir", substitute(section.test_data_dir, values or {})]
    return flags


def held_out_error(section: NemoTraining | MegatronBridgeTraining, engine: str) -> str | None:
    """A test split is held out beside a validation split: alone it has no place in either engine's data list."""
    if section.test_data_dir and not section.valid_data_dir:
        return (
            f"{engine}.test_data_dir is given without {engine}.valid_data_dir: a test split is the third of the "
            f"per-split data lists; give the validation split's folder too (or drop test_data_dir)"
        )
    return None
