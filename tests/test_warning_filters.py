"""The warning filters of pyproject.toml hide megatron-core's expected notices and nothing of this project's.

A pytest run in a subprocess, with the project's own pyproject.toml as its configuration, runs a test that imports
what the stage tests import from megatron-core (the real notices, from the pinned version) and a test that warns
the way this project's code would, with the same words as megatron-core's notice included.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = """
import warnings

NOTICE = "Transformer Engine and Apex are not installed. Falling back to Torch optimizers."


def test_megatron_imports():
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder  # noqa: F401
    from megatron.core.datasets.gpt_dataset import GPTDataset  # noqa: F401
    from megatron.core.datasets.indexed_dataset import IndexedDataset  # noqa: F401


def test_project_warnings():
    warnings.warn_explicit("PROJECT-1 " + NOTICE, UserWarning, "bcp_pipeline/config/load.py", 1,
                           module="bcp_pipeline.config.load")
    warnings.warn_explicit(NOTICE + " PROJECT-2", UserWarning, "stages/preprocess.py", 1, module="preprocess")
    warnings.warn_explicit(NOTICE + " PROJECT-3", UserWarning, "stages/megatron_index.py", 1, module="megatron_index")
    warnings.warn_explicit("PROJECT-4 deprecated", DeprecationWarning, "stages/pretrain_local.py", 1,
                           module="pretrain_local")
"""


def test_only_the_expected_third_party_warnings_are_filtered(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(REPO / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            "-q",
            str(tmp_path / "test_probe.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "2 passed, 4 warnings" in output, output
    for shown in ("PROJECT-1", "PROJECT-2", "PROJECT-3", "PROJECT-4"):
        assert shown in output
    for hidden in ("site-packages/megatron", "site-packages/torch"):
        assert hidden not in output, output
