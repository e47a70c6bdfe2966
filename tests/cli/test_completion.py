"""Shell completion: the candidates (bcp_pipeline/cli/completion.py), the installed command answering argcomplete's
protocol, and the bash and zsh functions that `register-python-argcomplete bcp-pipeline` defines."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bcp_pipeline.cli.completion import override_keys, pipeline_names, run_ids, stage_names

BIN = Path(sys.executable).parent
COMMAND = BIN / "bcp-pipeline"
VERBS = ["run", "plan", "status", "resume", "logs", "cancel", "remove", "list", "report", "profile", "verify", "check"]
CONFIG = """\
version: 1
x-stages: &stages
  fetch: {description: "get the data", program: fetch.py}
  train: {program: train.py, needs: [fetch]}
pipelines:
  alpha:
    description: "the first
      pipeline"
    stages: *stages
  beta:
    vars: {files: 8}
    defaults: {local: {processes: 2}}
    stages:
      <<: *stages
      report: {program: report.py, needs: [train], local: {replicas: 3}}
"""
OTHER_CONFIG = "version: 1\npipelines:\n  gamma: {stages: {only-stage: {program: x.py}}}\n"
RUN_ID = "alpha-20250102-030405-abcd"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder with pipelines.yaml, other.yaml and, in the default state folder, one run of alpha and a folder
    that is no run (no state.json)."""
    (tmp_path / "pipelines.yaml").write_text(CONFIG)
    (tmp_path / "other.yaml").write_text(OTHER_CONFIG)
    run_dir = tmp_path / ".bcp-pipeline" / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    (run_dir / "state.json").write_text(
        json.dumps({"run_id": RUN_ID, "pipeline": "alpha", "stages": {"fetch": {}, "train": {}}})
    )
    (tmp_path / ".bcp-pipeline" / "runs" / "not-a-run").mkdir()
    return tmp_path


def complete(folder: Path, line: str, shell: str = "bash") -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """The candidates `bcp-pipeline` answers for `line` (cursor at its end), as the shell functions ask."""
    answer = folder / ".answer"
    env = dict(
        os.environ,
        _ARGCOMPLETE="1",
        _ARGCOMPLETE_SHELL=shell,
        COMP_LINE=line,
        COMP_POINT=str(len(line)),
        _ARGCOMPLETE_STDOUT_FILENAME=str(answer),
    )
    done = subprocess.run([str(COMMAND)], cwd=folder, env=env, capture_output=True, text=True, timeout=60)
    text = answer.read_text() if answer.exists() else ""
    answer.unlink(missing_ok=True)
    return [c for c in text.split("\013") if c], done


def candidates(folder: Path, line: str) -> list[str]:
    found, done = complete(folder, line)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    return [c.rstrip() for c in found]


def args(folder: Path, **values: object) -> argparse.Namespace:
    values.setdefault("config", str(folder / "pipelines.yaml"))
    values.setdefault("state_dir", None)
    return argparse.Namespace(**values)


# -- the candidates --------------------------------------------------------------------------------------------------
def test_pipelines_with_their_descriptions_on_one_line(project: Path) -> None:
    assert pipeline_names(args(project)) == {"alpha": "the first pipeline", "beta": ""}
    assert list(pipeline_names(args(project, config=str(project / "other.yaml")))) == ["gamma"]


def test_stages_of_the_named_pipeline_or_run(project: Path) -> None:
    assert stage_names(args(project, pipeline="beta")) == {"fetch": "get the data", "train": "", "report": ""}
    assert list(stage_names(args(project, pipeline="beta", only=["train"]))) == ["fetch", "report"]
    assert list(stage_names(args(project, pipeline=None))) == ["fetch", "train", "report"]
    assert list(stage_names(args(project, run=RUN_ID))) == ["fetch", "train"]


def test_runs_of_the_state_folder(project: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    assert list(run_ids(args(project))) == [RUN_ID]
    elsewhere = tmp_path_factory.mktemp("state")
    (elsewhere / "runs" / "beta-1").mkdir(parents=True)
    (elsewhere / "runs" / "beta-1" / "state.json").write_text("{}")
    assert list(run_ids(args(project, state_dir=str(elsewhere)))) == ["beta-1"]


def test_set_offers_the_keys_the_pipeline_writes_with_their_values(project: Path) -> None:
    found = override_keys(args(project, pipeline="beta"))
    assert found["vars.files="] == "now 8"
    assert found["report.local.replicas="] == "now 3" and found["report.local.processes="] == "now 2"
    assert "report.program=" in found and "fetch.description=" in found
    assert found["backends.bcp.driver.total_runtime="] == "the --detach driver job"
    assert candidates(project, "bcp-pipeline run beta --set report.local.") == [
        "report.local.processes=",
        "report.local.replicas=",
    ]


def test_logs_of_a_detached_run_offer_its_driver(project: Path) -> None:
    run_dir = project / ".bcp-pipeline" / "runs" / "alpha-detached"
    run_dir.mkdir()
    (run_dir / "state.json").write_text(
        json.dumps(
            {"run_id": "alpha-detached", "pipeline": "alpha", "detached": {"owner": "driver"}, "stages": {"fetch": {}}}
        )
    )
    assert candidates(project, "bcp-pipeline logs alpha-detached ") == ["fetch", "driver"]
    assert candidates(project, f"bcp-pipeline logs {RUN_ID} ") == ["fetch", "train"]  # not detached: no driver
    assert candidates(project, "bcp-pipeline verify alpha-detached ") == ["fetch"]  # a driver has no verification


# -- the command answering the shell ---------------------------------------------------------------------------------
def test_verbs_options_and_choices(project: Path) -> None:
    assert candidates(project, "bcp-pipeline ") == VERBS
    assert candidates(project, "bcp-pipeline l") == ["logs", "list"]
    # --config and --state-dir are taken after the verb too, as ngc takes its global options anywhere.
    assert set(candidates(project, "bcp-pipeline run alpha --")) == {
        "--help",
        "--backend",
        "--set",
        "--restart",
        "--from",
        "--only",
        "--detach",
        "--config",
        "--state-dir",
    }
    backends = ["local", "bcp", "slurm", "gridengine", "kubernetes", "lepton"]
    assert candidates(project, "bcp-pipeline plan alpha --backend ") == backends
    assert candidates(project, "bcp-pipeline logs x y --tail ") == []


def test_pipeline_names_from_the_default_or_given_config(project: Path) -> None:
    assert candidates(project, "bcp-pipeline run ") == ["alpha", "beta"]
    assert candidates(project, "bcp-pipeline check ") == ["alpha", "beta"]
    assert candidates(project, "bcp-pipeline plan b") == ["beta"]
    assert candidates(project, "bcp-pipeline --config other.yaml run ") == ["gamma"]
    assert candidates(project, "bcp-pipeline --config ") == [".bcp-pipeline/", "other.yaml", "pipelines.yaml"]


def test_stage_names_of_the_chosen_pipeline(project: Path) -> None:
    assert candidates(project, "bcp-pipeline run beta --from ") == ["fetch", "train", "report"]
    assert candidates(project, "bcp-pipeline run alpha --only fetch --only ") == ["train"]
    assert candidates(project, "bcp-pipeline --config other.yaml run gamma --only ") == ["only-stage"]


def test_run_ids_and_the_stages_of_a_run(project: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    for verb in ("status", "resume", "logs", "cancel", "remove", "report", "verify"):
        assert candidates(project, f"bcp-pipeline {verb} ") == [RUN_ID]
    assert candidates(project, f"bcp-pipeline logs {RUN_ID} ") == ["fetch", "train"]
    assert candidates(project, f"bcp-pipeline verify {RUN_ID} t") == ["train"]
    elsewhere = tmp_path_factory.mktemp("state")
    assert candidates(project, f"bcp-pipeline --state-dir {elsewhere} status ") == []


def test_descriptions_for_zsh(project: Path) -> None:
    found, _ = complete(project, "bcp-pipeline run ", shell="zsh")
    assert found == ["alpha:the first pipeline", "beta:"]


@pytest.mark.parametrize(
    ("config", "pipelines"),
    [
        ("pipelines: [not, a, mapping]", []),
        ("pipelines: {a: {stages: 3}, b: 4}", ["a"]),
        (": : :\n\t-", []),
        (None, []),
    ],
)
def test_a_broken_or_missing_file_offers_what_it_can_and_prints_nothing(
    project: Path, config: str | None, pipelines: list[str]
) -> None:
    if config is None:
        (project / "pipelines.yaml").unlink()
    else:
        (project / "pipelines.yaml").write_text(config)
    (project / ".bcp-pipeline" / "runs" / RUN_ID / "state.json").write_text("{not json")
    assert candidates(project, "bcp-pipeline run ") == pipelines
    for line in ("bcp-pipeline run a --from ", f"bcp-pipeline logs {RUN_ID} ", "bcp-pipeline logs no-such-run "):
        assert candidates(project, line) == []


def test_without_argcomplete_a_request_gets_an_empty_answer(project: Path) -> None:
    env = dict(
        os.environ,
        _ARGCOMPLETE="1",
        COMP_LINE="bcp-pipeline run ",
        COMP_POINT="17",
        _ARGCOMPLETE_STDOUT_FILENAME=str(project / ".answer"),
    )
    code = "import sys; sys.modules['argcomplete'] = None; from bcp_pipeline.cli.main import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert not (project / ".answer").exists()


# -- the shells ------------------------------------------------------------------------------------------------------
SHELL_ENV = {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_bash_completes_through_the_registered_function(project: Path) -> None:
    script = """
eval "$(register-python-argcomplete bcp-pipeline)"
complete -p bcp-pipeline >&2
for line in "bcp-pipeline " "bcp-pipeline run b" "bcp-pipeline logs $RUN "; do
  COMP_LINE=$line COMP_POINT=${#line} COMP_TYPE=9
  _python_argcomplete bcp-pipeline
  echo "${COMPREPLY[*]}"
done
"""
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=project,
        env=dict(os.environ, **SHELL_ENV, RUN=RUN_ID),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "-F _python_argcomplete bcp-pipeline" in done.stderr
    assert [line.strip() for line in done.stdout.splitlines()] == [" ".join(VERBS), "beta", "fetch train"]


@pytest.fixture(scope="module")
def zsh() -> str:
    """zsh, installed from Debian's packages where it is missing, as the Slurm tests install Slurm (root and
    apt-get; package lists refreshed once if the install fails); where it cannot be, the test is skipped."""
    if found := shutil.which("zsh"):
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("zsh is not installed and cannot be (needs root and apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "zsh"]
    done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True, timeout=600)
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    if not (found := shutil.which("zsh")):
        pytest.skip(f"zsh could not be installed: {(done.stdout + done.stderr).strip()[-500:]}")
    return found


def test_zsh_completes_through_the_registered_function(project: Path, zsh: str) -> None:
    # zsh's completion widgets run only inside its line editor: compdef and _describe are stood in for, so this
    # runs the registered function with what zsh hands it ($words, $BUFFER, $CURSOR) and prints what it offers.
    script = """
compdef() { print -r -- "compdef $*" >&2 }
_describe() { print -rl -- "${(@P)2}" }
eval "$(register-python-argcomplete bcp-pipeline)"
for line in "bcp-pipeline run " "bcp-pipeline run beta --from r"; do
  BUFFER=$line CURSOR=${#line} words=(${=line} "")
  _python_argcomplete
done
"""
    done = subprocess.run(
        [zsh, "-f", "-c", script],
        cwd=project,
        env=dict(os.environ, **SHELL_ENV),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "compdef _python_argcomplete bcp-pipeline" in done.stderr
    assert done.stdout.splitlines() == ["alpha:the first pipeline", "beta:", "report:"]
