"""The command that writes a NeMo launcher training's data list, as every backend's job runs it (pure).

The job runs stages/data_list.py where the data is: it reads the preprocess manifests under `nemo.data_dir` and
writes the launcher's data list file, one Hydra override a line, which the job reads into a bash array (`mapfile`)
and passes to the launcher, an argument a line. Without `nemo.valid_data_dir` that is the one flat list
`training.model.data.data_prefix=[w,prefix,...]`, split 99990,8,2 by NeMo. With it, NeMo's per-split dict
`{train, validation, test}` from the held-out split's own outputs, which takes three overrides (stages/data_list.py
render_nemo_per_split says why). Only the interpreter, the stages/ folder and the file differ by backend: the
caller passes them.
"""

from __future__ import annotations

from bcp_pipeline.config.model import NemoTraining
from bcp_pipeline.config.placeholders import substitute

DATA_PREFIX_KEY = "training.model.data.data_prefix"  # the launcher's key: NeMo's model.data.data_prefix
DATA_LIST_PROGRAM = "data_list.py"  # in stages/


def data_list_argv(section: NemoTraining, values: dict[str, str], *, python: str, code: str, out: str) -> list[str]:
    """`python code/data_list.py ...` writing the data list of the training `section` to `out`; `values`: the
    backend's ${...} values as its job sees them (the data folders are resolved with them)."""
    held_out = (
        ["--valid-data-dir", substitute(section.valid_data_dir, values), "--split-form", "nemo"]
        if section.valid_data_dir
        else []
    )
    return [
        python,
        f"{code}/{DATA_LIST_PROGRAM}",
        "--data-dir",
        substitute(section.data_dir, values),
        *held_out,
        "--format",
        "hydra",
        "--key",
        DATA_PREFIX_KEY,
        "--out",
        out,
    ]
