"""A NeMo pretrain project for the Grid Engine test cell (tests/e2e/test_gridengine_e2e.py, the TSUBAME set-up's
tests/e2e/test_gridengine_tsubame_e2e.py): NVIDIA's launcher, NeMo's training script and Apptainer are stand-ins
(tests/fakes/README.md); Grid Engine, the two hosts and PyTorch's torchrun are real."""

from __future__ import annotations

import sys
from pathlib import Path

from support.fake_sif import write_fake_sif
from support.pipeline_fixtures import REPO

# A nemo: pretrain the TSUBAME way on the cell: NVIDIA's launcher composes the config in its debug mode, then one
# torchrun a host runs NeMo's training script, all in the Apptainer image. The launcher, the training script and
# Apptainer are STAND-INS (tests/fakes/README.md): the stand-in apptainer runs the command on this machine with the
# binds applied and Apptainer's clean PATH, so the image's python3 and torchrun are this environment's because the
# fake image says so (its own PATH, as a NeMo image's ENV PATH does; its files read-only), never the job's PATH.
NEMO_STAND_IN = REPO / "tests" / "fakes" / "nemo_launcher"
NEMO_CONFIG = """\
version: 1
stages_dir: {stages}
backends:
  gridengine: {{workspace_dir: ws, container: apptainer, parallel_environment: pe_node, poll_seconds: 0.3,
               poll_max_seconds: 1, accounting_grace_seconds: 3}}
pipelines:
  nemo:
    workspace: {{name: main}}
    defaults:
      bcp: {{image: "nvcr.io/nvaie/nemo-framework-training:23.11", instance: dgxa100.80g.1.norm, total_runtime: 1h}}
    stages:
      pretrain:
        program: pretrain_local.py
        nemo:
          model: gpt3/126m
          run_name: gpt
          data_dir: ${{workspace}}/data/preprocessed
          bpe_dir: ${{workspace}}/data/bpe
          results_dir: ${{workspace}}/results
          launcher_dir: {stand_in}/launcher_scripts
          nemo_dir: {stand_in}/NeMo
          max_steps: {steps}
          time_margin: {margin}
          overrides: [training.trainer.val_check_interval=10, +training.standin.step_seconds=0.02{extra}]
        gridengine: {{nodes: {nodes}, processes_per_node: 1, h_rt: {runtime}, container_image: {image},
                     env: {{PATH: "{path}"}}}}
"""


def nemo_project(root: Path, *, nodes: int = 1, steps: int = 30, runtime: str = "2m", margin: str = "1m",
                 extra: str = "") -> Path:
    from support.manifests import chunk_name, fabricate

    image = write_fake_sif(root / "images" / "nemo-24.05.sif", contents=[sys.prefix, str(NEMO_STAND_IN)],
                           env={"PATH": str(Path(sys.executable).parent)})
    path = f"{REPO / 'tests/fakes/apptainer_bin'}:/usr/local/bin:/usr/bin:/bin"  # the job's: finds apptainer only
    config = root / "pipelines.yaml"
    config.write_text(NEMO_CONFIG.format(stages=REPO / "stages", stand_in=NEMO_STAND_IN, steps=steps, margin=margin,
                                         extra=extra, nodes=nodes, runtime=runtime, image=image, path=path))
    for i, tokens in enumerate((3000, 1000)):
        fabricate(root / "ws/main/data/preprocessed", chunk_name(i), tokens)
    return config
