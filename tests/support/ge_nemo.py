"""A NeMo pretrain project for the Grid Engine test cell (tests/e2e/test_gridengine_e2e.py, the TSUBAME set-up's
tests/e2e/test_gridengine_tsubame_e2e.py): NVIDIA's launcher, NeMo's training script and Apptainer are stand-ins
(tests/fakes/README.md); Grid Engine, the two hosts and PyTorch's torchrun are real. The pipelines.yaml and the data
list are every backend's NeMo test project (tests/support/nemo_project.py); the image and the job's PATH are the
cell's own."""

from __future__ import annotations

import sys
from pathlib import Path

from support.fake_sif import write_fake_sif
from support.nemo_project import NEMO_STAND_IN, fabricate_nemo_data, nemo_pipelines_yaml
from support.pipeline_fixtures import REPO

# A nemo: pretrain the TSUBAME way on the cell: NVIDIA's launcher composes the config in its debug mode, then one
# torchrun a host runs NeMo's training script, all in the Apptainer image. The launcher, the training script and
# Apptainer are STAND-INS (tests/fakes/README.md): the stand-in apptainer runs the command on this machine with the
# binds applied and Apptainer's clean PATH, so the image's python3 and torchrun are this environment's because the
# fake image says so (its own PATH, as a NeMo image's ENV PATH does; its files read-only), never the job's PATH.
GRIDENGINE_OPTIONS = (
    "{workspace_dir: ws, container: apptainer, parallel_environment: pe_node, poll_seconds: 0.3,\n"
    "poll_max_seconds: 1, accounting_grace_seconds: 3}"
)


def nemo_project(
    root: Path, *, nodes: int = 1, steps: int = 30, runtime: str = "2m", margin: str = "1m", extra: str = ""
) -> Path:
    """`root`/pipelines.yaml: the pipeline `nemo` on `nodes` hosts of the cell, one torchrun each, in the fake
    image `root`/images/nemo-24.05.sif; its data list in the workspace `root`/ws/main."""
    image = write_fake_sif(
        root / "images" / "nemo-24.05.sif",
        contents=[sys.prefix, str(NEMO_STAND_IN)],
        env={"PATH": str(Path(sys.executable).parent)},
    )
    path = f"{REPO / 'tests/fakes/apptainer_bin'}:/usr/local/bin:/usr/bin:/bin"  # the job's: finds apptainer only
    stage = (
        f"{{nodes: {nodes}, processes_per_node: 1, h_rt: {runtime}, container_image: {image},\n"
        f'env: {{PATH: "{path}"}}}}'
    )
    config = root / "pipelines.yaml"
    config.write_text(
        nemo_pipelines_yaml("gridengine", GRIDENGINE_OPTIONS, stage, steps=steps, margin=margin, extra_overrides=extra)
    )
    fabricate_nemo_data(root / "ws/main/data/preprocessed")
    return config
