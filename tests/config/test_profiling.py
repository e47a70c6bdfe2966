"""`profile`'s job: the pretrain stage rendered as `run` renders it, with its own run name, max_steps past the
window, no checkpoint, and NeMo's profiling keys, which real Hydra (hydra-core) composes with the launcher
stand-in's config (tests/fakes/nemo_launcher) for both training configs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml
from support.pipeline_fixtures import REPO

from bcp_pipeline.cli.main import main
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.config.profiling import ProfileWindow, nemo_profile_overrides, parse_window, profile_overrides

LAUNCHER = REPO / "tests" / "fakes" / "nemo_launcher" / "launcher_scripts" / "main.py"


def test_profile_dry_run_on_bcp_prints_the_job_with_its_own_run_name_and_no_checkpoint(capsys):
    assert (
        main(
            [
                "--config",
                str(REPO / "pipelines.yaml"),
                "profile",
                "slimpajama-8b",
                "--backend",
                "bcp",
                "--steps",
                "10:12",
                "--ranks",
                "0,8",
                "--dry-run",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    job = [line for line in out.splitlines() if line.startswith("ngc base-command job run")]
    assert len(job) == 1  # the pretrain stage only
    # The launcher's overrides, in the job script it prints (backends/shared/nemo_script.py): its own NeMo run name.
    assert "training.run.name=gpt_8b-profile-slimpajama-8b-profile-RUN" in out
    assert "training.run.name=gpt_8b-slimpajama" not in out
    assert "training.trainer.max_steps=13" in out
    for key in (
        "++training.model.nsys_profile.enabled=True",
        "++training.model.nsys_profile.start_step=10",
        "++training.model.nsys_profile.end_step=12",
        "++training.model.enable_megatron_timers=True",
        "++training.model.megatron_timer_kwargs.log_option=max",
        "++training.exp_manager.create_checkpoint_callback=False",
    ):
        assert key in out
    assert "nsys_profile.ranks=[0,8]" in out
    # One job, done when it exits 0: no checkpoint to continue from, so no continuation and no verification job.
    assert "# verification of pretrain" not in out and "pretrain.nemo.checkpoints=false" in out
    config = load_and_check(
        REPO / "pipelines.yaml",
        pipeline="slimpajama-8b",
        overrides=profile_overrides(
            load_and_check(REPO / "pipelines.yaml", pipeline="slimpajama-8b").pipeline("slimpajama-8b"),
            ProfileWindow(10, 12),
        ),
    )
    stage = config.pipeline("slimpajama-8b").stages["pretrain"]
    assert stage.continuation is None and stage.verify == [] and stage.nemo.continue_run is None
    assert "--instance dgxa100.80g.8.norm" in job[0] and "--replicas 8" in job[0]


@pytest.mark.parametrize("model", ["gpt3/7b_improved", "gpt3/126m"])
def test_the_profile_overrides_compose_with_hydra(model):
    pytest.importorskip("hydra", reason="hydra-core is in the test extra")
    overrides = nemo_profile_overrides(ProfileWindow(3, 5, (0, 1)))
    done = subprocess.run(
        [
            sys.executable,
            str(LAUNCHER),
            "--cfg",
            "job",
            f"training={model}",
            "launcher_scripts_path=/opt/launcher",
            *overrides,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    training = yaml.safe_load(done.stdout)["training"]
    assert training["model"]["nsys_profile"] == {
        "enabled": True,
        "trace": ["nvtx", "cuda"],
        "start_step": 3,
        "end_step": 5,
        "ranks": [0, 1],
        "gen_shape": False,
    }
    assert training["model"]["enable_megatron_timers"] is True
    assert training["model"]["megatron_timer_kwargs"] == {"log_option": "max", "log_every_n_steps": 1}
    assert training["exp_manager"]["create_checkpoint_callback"] is False
    assert training["exp_manager"]["resume_if_exists"] is False


def test_a_plain_key_is_refused_where_the_config_has_no_section():
    pytest.importorskip("hydra", reason="hydra-core is in the test extra")
    done = subprocess.run(
        [
            sys.executable,
            str(LAUNCHER),
            "--cfg",
            "job",
            "training=gpt3/7b_improved",
            "launcher_scripts_path=/opt/launcher",
            "training.model.nsys_profile.enabled=True",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "nsys_profile" in done.stderr


def test_a_bad_window_is_one_clear_line(capsys):
    with pytest.raises(ValueError, match=r"--steps '5-8': give A:B with 1 <= A <= B"):
        parse_window("5-8", "0")
    assert main(["--config", str(REPO / "pipelines.yaml"), "profile", "demo", "--ranks", "a", "--dry-run"]) == 2
    assert "--ranks 'a': give the ranks to profile as 0 or 0,1,..." in capsys.readouterr().err


# The launcher's Nsight output name, as its `_make_nsys_command_prefix` writes it into the bcprun command: escaped,
# so each rank's own shell expands it.
NSYS_OUTPUT = "profile_${SLURM_JOB_ID}_node${SLURM_NODEID}_rank${SLURM_PROCID}"


def nsys_name(bash_env: str, env: dict[str, str]) -> str:
    """The name one rank's bash gives the file, started as bcprun starts it: `bash -c CMD` with BASH_ENV set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NGC_", "RANK", "OMPI_", "PMIX_"))}
    done = subprocess.run(
        ["bash", "-c", f"echo {NSYS_OUTPUT}"],
        env={**clean, "BASH_ENV": bash_env, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def test_each_rank_of_a_bcp_profile_job_names_its_nsys_file_uniquely(capsys):
    assert (
        main(["--config", str(REPO / "pipelines.yaml"), "profile", "slimpajama-8b", "--backend", "bcp", "--dry-run"])
        == 0
    )
    job = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("ngc base-command"))
    shipped = re.search(r"--env-var BASH_ENV:(\S+)/nsys_names\.sh", job)
    assert shipped and shipped.group(1).startswith("/mount_workspace/.bcp-pipeline/code/")
    script = str(REPO / "stages" / "nsys_names.sh")  # what the code folder holds
    names = {
        nsys_name(script, {"NGC_JOB_ID": "4242", "NGC_ARRAY_INDEX": str(node), "RANK": str(node * 8 + local)})
        for node in range(8)
        for local in range(8)
    }
    assert len(names) == 64 and "profile_4242_node7_rank63" in names
    assert nsys_name("", {"NGC_JOB_ID": "4242", "RANK": "5"}) == "profile__node_rank"  # what it fixes
    # Where the SLURM_* variables are set (Slurm, or a bcprun that sets them) they are kept.
    assert (
        nsys_name(script, {"SLURM_JOB_ID": "77", "SLURM_NODEID": "1", "SLURM_PROCID": "9", "RANK": "3"})
        == "profile_77_node1_rank9"
    )
