"""The time limits the BCP pretrain job renders, run through NVIDIA's REAL NeMo `exp_manager` (nemo_toolkit 1.22.0)
and PyTorch Lightning 2.0.7, the 23.11 image's versions (scripts/setup --test installs them, with their own numpy
1.x, into .venv/nemo-1.22.0; tests/support/real_nemo_train.py is the training job).

A tiny LightningModule trains twice in the same run folder, as two BCP jobs of one run do: the second job must
train too. Lightning's Timer (`trainer.max_time`) keeps its elapsed time in the checkpoint and counts it on resume,
so a limit given that way stops the second job at once (the control below shows it); NeMo's per-run timer
(`exp_manager.max_time_per_run`) does not.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bcp_pipeline.backends.bcp.render import job_files
from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.config.resources import BcpOptions

REPO = Path(__file__).resolve().parents[2]
NEMO = REPO / ".venv" / "nemo-1.22.0"
LAUNCHER_CONFIG = REPO / "tests/fakes/nemo_launcher/launcher_scripts/conf/training/gpt3/7b_improved.yaml"
PER_RUN = 6  # seconds each job may train: total_runtime 60 s less a 54 s margin


def rendered_overrides(*sets: str) -> list[str]:
    """The launcher overrides of slimpajama-8b's pretrain job, read back from the script the BCP backend renders."""
    config = load_and_check(REPO / "pipelines.yaml", pipeline="slimpajama-8b", overrides=list(sets))
    pipeline = config.pipeline("slimpajama-8b")
    stage = pipeline.stages["pretrain"]
    request = JobRequest(
        run_id="r", pipeline=pipeline, stage=stage, kind="stage", program=stage.program, args=tuple(stage.args)
    )
    [script] = job_files(request, BcpOptions(), REPO / "stages").values()
    block = script.split("overrides=(\n", 1)[1].split("\n)\n", 1)[0]
    return [word for line in block.splitlines() for word in shlex.split(line) if not word.startswith("$(")]


def time_settings(overrides: list[str]) -> tuple[dict, dict]:
    """The trainer's and exp_manager's time settings: the launcher config's own trainer.max_time (7b_improved has
    one), then what the overrides set."""
    trainer = {"max_time": yaml.safe_load(LAUNCHER_CONFIG.read_text())["trainer"]["max_time"]}
    manager = {}
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        if key == "training.trainer.max_time":
            trainer["max_time"] = value
        elif key.startswith("training.exp_manager.") and "time" in key:
            manager[key.removeprefix("training.exp_manager.")] = value
    return trainer, manager


def train(log_dir: Path, trainer: dict, manager: dict) -> dict:
    if not NEMO.is_dir():
        pytest.fail(f"{NEMO} is missing: scripts/setup --test installs NeMo 1.22.0 and Lightning 2.0.7 there")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(NEMO), str(REPO / "tests/fakes/python")])}
    spec = {"log_dir": str(log_dir), "max_steps": 1_000_000, "trainer": trainer, "exp_manager": manager}
    done = subprocess.run(
        [sys.executable, str(REPO / "tests/support/real_nemo_train.py"), json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    started = result["start_step"]  # None: the job stopped before its first step
    result["trained"] = result["end_step"] - (result["end_step"] if started is None else started)
    return result


def test_every_job_of_a_run_trains_with_the_rendered_time_limits(tmp_path):
    overrides = rendered_overrides("pretrain.bcp.total_runtime=60s", "pretrain.nemo.time_margin=54s")
    trainer, manager = time_settings(overrides)
    assert manager == {"max_time_per_run": f"0:00:00:{PER_RUN:02d}"}, overrides  # with its `+`: see below
    assert f"+training.exp_manager.max_time_per_run=0:00:00:{PER_RUN:02d}" in overrides
    first = train(tmp_path / "run", trainer, manager)
    second = train(tmp_path / "run", trainer, manager)
    # Each job trains until its per-run limit stops it (max_steps is out of reach). How many steps fit in the limit
    # depends on how loaded the machine is (a CI machine under a cold build: a tenth of a quiet one's), so the
    # assertions are on what the limit does, not on a rate: the first trains, the second resumes and trains too.
    assert first["trained"] >= 5 and first["seconds"] < PER_RUN + 60, first
    assert second["start_step"] == first["end_step"], (first, second)  # it resumed the first job's checkpoint
    assert second["trained"] >= 1, (first, second)


def test_control_a_limit_in_trainer_max_time_alone_stops_the_second_job_at_once(tmp_path):
    """What the renderer did before: the limit as `trainer.max_time`. Real Lightning stops the resumed job at once,
    which is why the per-run key is needed (and why the test above fails without it)."""
    trainer, manager = {"max_time": f"0:00:00:{PER_RUN:02d}"}, {}
    first = train(tmp_path / "run", trainer, manager)
    second = train(tmp_path / "run", trainer, manager)
    assert first["trained"] >= 5, first
    assert second["trained"] == 0 and second["end_step"] == first["end_step"], (first, second)
