"""One training job of a tiny LightningModule under NVIDIA's real NeMo `exp_manager` (nemo_toolkit 1.22.0) and
PyTorch Lightning 2.0.7, the 23.11 image's versions: run by tests/config/test_nemo_timer_real.py in a subprocess
whose PYTHONPATH puts those packages (scripts/setup --test installs them into .venv/nemo-1.22.0) first.

    python tests/support/real_nemo_train.py '{"log_dir": ..., "max_steps": N, "trainer": {...}, "exp_manager": {...}}'

`trainer` and `exp_manager` hold the overrides under `training.trainer.` and `training.exp_manager.` that the
project renders, keys without their prefix. The job resumes from the run's `-last` checkpoint as the launcher's
configs ask (`resume_if_exists`, `resume_ignore_no_checkpoint`) and prints one JSON line: the step it started at, the
step it ended at, and its seconds.
"""

import json
import sys
import time
import warnings

import pytorch_lightning as pl
import torch
from nemo.utils.exp_manager import exp_manager
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, Dataset


class Endless(Dataset):
    """Random regression samples, as many as max_steps asks for."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        generator = torch.Generator().manual_seed(index)
        x = torch.randn(16, generator=generator)
        return x, x.sum().reshape(1)


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)

    def training_step(self, batch, _index):
        time.sleep(0.005)  # a step of a few milliseconds: a 6 s job trains hundreds of them, not millions
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class FirstStep(pl.Callback):
    """The step this job started at (after exp_manager's resume restored the checkpoint)."""

    step: int | None = None

    def on_train_start(self, trainer, _module) -> None:
        self.step = trainer.global_step


def main() -> None:
    spec = json.loads(sys.argv[1])
    warnings.filterwarnings("ignore")
    first = FirstStep()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=spec["max_steps"],
        logger=False,
        callbacks=[first],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **spec["trainer"],
    )
    checkpoints = {
        "save_last": True,
        "every_n_train_steps": 100,
        "monitor": "step",
        "mode": "max",
        "save_top_k": 1,
        "always_save_nemo": False,
        "save_nemo_on_train_end": False,
        "every_n_epochs": None,
    }
    config = OmegaConf.create(
        {
            "explicit_log_dir": spec["log_dir"],
            "resume_if_exists": True,
            "resume_ignore_no_checkpoint": True,
            "create_tensorboard_logger": False,
            "checkpoint_callback_params": checkpoints,
            **spec["exp_manager"],
        }
    )
    exp_manager(trainer, config)
    model = Tiny()
    started = time.monotonic()
    trainer.fit(model, DataLoader(Endless(spec["max_steps"] * 4), batch_size=4, num_workers=0))
    print(
        json.dumps(
            {"start_step": first.step, "end_step": trainer.global_step, "seconds": round(time.monotonic() - started, 2)}
        )
    )


if __name__ == "__main__":
    main()
