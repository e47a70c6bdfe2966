"""The command line's edges: a reader that leaves a pipe early, `--from` with `--only`, the
help of every argument, numbers argparse must refuse, a driver's log for people, and `check` without Slurm.

The commands run through the CLI's `main` in-process, or as real subprocesses where the pipe or PATH matters.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import cli
from support.pipeline_fixtures import write_chain_project

from bcp_pipeline.cli.main import build_parser
from bcp_pipeline.cli.runs import without_state_lines
from bcp_pipeline.detach.protocol import SNAPSHOT_PREFIX, snapshot_lines


@pytest.fixture
def chain(tmp_path: Path) -> Path:
    return write_chain_project(tmp_path)


def test_from_with_only_is_refused_naming_both_and_records_nothing(chain, capsys):
    assert cli(chain, "run", "chain", "--from", "second", "--only", "first") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "--from second and --only first select stages two ways; use one" in err
    assert not (chain.parent / ".bcp-pipeline" / "runs").exists()


def command_into_a_closed_pipe(config: Path, *args: str) -> subprocess.CompletedProcess:
    """`bcp-pipeline ARGS` whose stdout reader is gone before it writes (as `| head -1` once head has its line)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "bcp_pipeline", "--config", str(config), *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)


def test_output_piped_into_a_reader_that_left_ends_quietly(chain):
    assert cli(chain, "run", "chain", "--only", "first") == 0
    for args in (("plan", "chain"), ("status",), ("status", "--json"), ("list",)):
        done = command_into_a_closed_pipe(chain, *args)
        assert (done.returncode, done.stderr) == (141, ""), (args, done.stderr)


def test_every_argument_of_every_verb_has_help():
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [
        f"{verb} {action.dest}"
        for verb, sub in verbs.choices.items()
        for action in sub._actions
        if not isinstance(action, argparse._HelpAction) and not action.help
    ]
    assert missing == []


def test_check_help_says_what_check_alone_does(chain, capsys):
    with pytest.raises(SystemExit):
        cli(chain, "check", "--help")
    help_text = " ".join(capsys.readouterr().out.split())
    assert "without one, only the service named by --backend is checked" in help_text
    assert cli(chain, "check") == 2
    assert "name a pipeline (`bcp-pipeline check PIPELINE`) or a backend" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [
        ("logs", "RUN", "first", "--tail", "-1"),
        ("logs", "RUN", "first", "--tail", "0"),
        ("logs", "RUN", "first", "--rank", "-1"),
    ],
)
def test_a_count_below_its_least_is_a_usage_error(chain, capsys, args):
    with pytest.raises(SystemExit) as exit_info:
        cli(chain, *args)
    assert exit_info.value.code == 2
    assert "expected a whole number >=" in capsys.readouterr().err


def test_a_driver_log_shows_its_human_lines_and_counts_the_state_lines_it_hides():
    snapshot = snapshot_lines({"run_id": "r", "stages": {f"stage{i}": {"note": "x" * 300} for i in range(30)}}, 1)
    assert len(snapshot) > 1 and all(len(line) > 1000 for line in snapshot[:-1])
    log = "\n".join(
        ["driver job 7: took the lease", *snapshot, "download: submitted job 8", *snapshot, "download: succeeded"]
    )
    shown = without_state_lines(log, None).splitlines()
    assert shown == [
        "driver job 7: took the lease",
        "download: submitted job 8",
        "download: succeeded",
        f"({2 * len(snapshot)} BCPP-STATE line(s) hidden: --state-lines shows them)",
    ]
    assert without_state_lines(log, 1).splitlines()[0] == "download: succeeded"
    assert not any(line.startswith(SNAPSHOT_PREFIX) for line in shown)


def test_check_slurm_without_slurm_names_the_install_script_and_saves_no_profile(chain, tmp_path):
    # No controller to reach: where Slurm's commands are installed (the Slurm tests install them), they are
    # pointed at a slurm.conf whose controller's port nobody listens on, and the real scontrol fails as it does
    # with the controller down (at once; with no slurm.conf at all, it retries for 60 s before it fails).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conf = tmp_path / "no-cluster" / "slurm.conf"
    conf.parent.mkdir()
    conf.write_text(
        f"ClusterName=none\nSlurmctldHost=localhost\nSlurmctldPort={port}\nNodeName=localhost\n"
        "PartitionName=p Nodes=localhost\n"
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    done = subprocess.run(
        [sys.executable, "-m", "bcp_pipeline", "--config", str(chain), "check", "chain", "--backend", "slurm"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "Slurm's controller does not answer" in done.stderr and "`scripts/slurm-cluster install`" in done.stderr
    assert "No profile was saved" in done.stderr and done.stderr.count("\n") == 1
    assert not (chain.parent / ".bcp-pipeline" / "checks").exists()


def test_a_bcp_job_without_an_instance_is_a_config_error_in_plan_and_run(chain, capsys):
    """The chain pipeline has no bcp sections at all: plan and run on BCP say where to set them, exit 2."""
    for verb in ("plan", "run"):
        assert cli(chain, verb, "chain", "--backend", "bcp") == 2, verb
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert "stage first: a BCP job needs an `instance` and an `image`" in err
        assert "--set first.bcp.instance=INSTANCE --set first.bcp.image=IMAGE" in err
    assert not (chain.parent / ".bcp-pipeline" / "runs").exists()
