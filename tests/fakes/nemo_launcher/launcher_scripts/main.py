"""STAND-IN for NVIDIA's NeMo launcher (`launcher_scripts/main.py`), NOT NVIDIA's code: for the NGC API emulator,
where no NeMo image exists. It behaves as the facts in tests/fakes/README.md ("The NeMo launcher stand-in") say the
real one does at the 23.11 tag, each with its source there:

- a Hydra application over `conf/config.yaml` whose `training` group holds `gpt3/126m` and `gpt3/7b_improved`
  (`--cfg job` prints the composed config: `check`'s NeMo probe; real hydra-core composes it, so an unknown key or
  a bad override is refused as in the image);
- `cluster_type=bcp stages=[training]`: writes the training config to `<results>/<run>_hydra.yaml` and the
  submission script `<results>/<run>_submission.sh`, whose last line is
  `bcprun --nnodes N --npernode G -no_redirect --cmd "..." 2>&1 | tee -a <results>/log-<run>_<MMDD_HHMMSS>.out`
  with no pipefail, where <results> = base_results_dir/<run> and N, G = trainer.num_nodes, trainer.devices;
- with NEMO_LAUNCHER_DEBUG set it only writes that script and prints a fake job id;
- without it, it runs the script with `bash`, its output captured and never printed, and fails only when the
  script's status (tee's, so 0 after a crashed training) is not 0.
The training the script starts is the stand-in trainer next to this folder (`../NeMo/.../megatron_gpt_pretraining.py`).
"""

import datetime
import os
import random
import subprocess
import sys
from pathlib import Path

import hydra
from omegaconf import OmegaConf

TRAINER = (
    Path(__file__).resolve().parent.parent
    / "NeMo"
    / "examples"
    / "nlp"
    / "language_modeling"
    / "megatron_gpt_pretraining.py"
)


def submission_text(cfg, run: str, results: Path, config_file: Path) -> str:
    training = cfg.training
    command = f"python3 -u {TRAINER} --config-path={results} --config-name={config_file.name}"
    stdout = results / f"log-{run}_{datetime.datetime.now().strftime('%m%d_%H%M%S')}.out"
    return "\n".join(
        [
            "#!/bin/bash",
            "",
            "# command 1",
            f'bcprun --nnodes {training.trainer.num_nodes} --npernode {training.trainer.devices} -no_redirect  --cmd "',
            f'  {command} " 2>&1 | tee -a {stdout}',
            "",
        ]
    )


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg) -> None:
    if cfg.cluster_type != "bcp" or list(cfg.stages) != ["training"]:
        print("NeMo launcher STAND-IN: only cluster_type=bcp stages=[training] is played here", file=sys.stderr)
        sys.exit(2)
    run = str(cfg.training.run.name)
    results = Path(str(cfg.training.run.results_dir))
    results.mkdir(parents=True, exist_ok=True)
    config_file = results / f"{run}_hydra.yaml"
    config_file.write_text(OmegaConf.to_yaml(cfg.training, resolve=True))
    submission = results / f"{run}_submission.sh"
    submission.write_text(submission_text(cfg, run, results, config_file))
    print(f"Job {run} submission file created at '{submission}'")
    if os.environ.get("NEMO_LAUNCHER_DEBUG", "False").lower() in ("true", "t", "1"):
        print(f"[DEBUG] Job {run} submitted with FAKE Job ID {random.randint(10000, 99999)}")
        return
    # As the real launcher's command wrapper: output captured, never shown; only a non-zero status is an error.
    done = subprocess.run(["bash", str(submission)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"command failed with exit code {done.returncode}")


if __name__ == "__main__":
    main()
