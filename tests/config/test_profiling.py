"""`profile`'s job: the pretrain stage rendered as `run` renders it, with its own run name, max_steps past the
window, no checkpoint, and NeMo's profiling keys, which real Hydra (hydra-core) composes with the launcher
stand-in's config (tests/fakes/nemo_launcher) for both training configs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from bcp_pipeline.cli.main import main
from bcp_pipeline.config.profiling import ProfileWindow, nemo_profile_overrides, parse_window
from pipeline_fixtures import REPO

LAUNCHER = REPO / "tests" / "fakes" / "nemo_launcher" / "launcher_scripts" / "main.py"


def test_profile_dry_run_on_bcp_prints_the_job_with_its_own_run_name_and_no_checkpoint(capsys):
    assert main(["--config", str(REPO / "pipelines.yaml"), "profile", "slimpajama-8b", "--backend", "bcp",
                 "--steps", "10:12", "--ranks", "0,8", "--dry-run"]) == 0
    out = capsys.readouterr().out
    job = [line for line in out.splitlines() if line.startswith("ngc base-command job run")]
    assert len(job) == 1  # the pretrain stage only
    assert "training.run.name=gpt_8b-profile" in job[0] and "training.run.name=gpt_8b " not in job[0]
    assert "training.trainer.max_steps=13" in job[0]
    for key in ("++training.model.nsys_profile.enabled=True", "++training.model.nsys_profile.start_step=10",
                "++training.model.nsys_profile.end_step=12", "++training.model.enable_megatron_timers=True",
                "++training.model.megatron_timer_kwargs.log_option=max",
                "++training.exp_manager.create_checkpoint_callback=False"):
        assert key in job[0]
    assert "nsys_profile.ranks=[0,8]" in job[0]
    assert "--instance dgxa100.80g.8.norm" in job[0] and "--replicas 8" in job[0]


@pytest.mark.parametrize("model", ["gpt3/7b_improved", "gpt3/126m"])
def test_the_profile_overrides_compose_with_hydra(model):
    pytest.importorskip("hydra", reason="hydra-core is in the test extra")
    overrides = nemo_profile_overrides(ProfileWindow(3, 5, (0, 1)))
    done = subprocess.run([sys.executable, str(LAUNCHER), "--cfg", "job", f"training={model}",
                           "launcher_scripts_path=/opt/launcher", *overrides], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    training = yaml.safe_load(done.stdout)["training"]
    assert training["model"]["nsys_profile"] == {"enabled": True, "trace": ["nvtx", "cuda"], "start_step": 3,
                                                 "end_step": 5, "ranks": [0, 1], "gen_shape": False}
    assert training["model"]["enable_megatron_timers"] is True
    assert training["model"]["megatron_timer_kwargs"] == {"log_option": "max", "log_every_n_steps": 1}
    assert training["exp_manager"]["create_checkpoint_callback"] is False
    assert training["exp_manager"]["resume_if_exists"] is False


def test_a_plain_key_is_refused_where_the_config_has_no_section():
    pytest.importorskip("hydra", reason="hydra-core is in the test extra")
    done = subprocess.run([sys.executable, str(LAUNCHER), "--cfg", "job", "training=gpt3/7b_improved",
                           "launcher_scripts_path=/opt/launcher", "training.model.nsys_profile.enabled=True"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "nsys_profile" in done.stderr


def test_a_bad_window_is_one_clear_line(capsys):
    with pytest.raises(ValueError, match=r"--steps '5-8': give A:B with 1 <= A <= B"):
        parse_window("5-8", "0")
    assert main(["--config", str(REPO / "pipelines.yaml"), "profile", "demo", "--ranks", "a", "--dry-run"]) == 2
    assert "--ranks 'a': give the ranks to profile as 0 or 0,1,..." in capsys.readouterr().err
