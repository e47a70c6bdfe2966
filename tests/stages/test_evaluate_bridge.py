"""evaluate.py --from bridge on the Megatron-Bridge STAND-IN (tests/fakes/megatron_bridge): a training through the
entry program saves `iter_NNNNNNN/` checkpoints and Bridge's tracker; each scheduled checkpoint is then scored by
the entry program under torchrun with `validation.skip_train` (the stand-in prints Bridge's validation line and
fails, as Bridge does, on a checkpoint folder that is not there). What Bridge's real config code and print format
make of the same overrides and line: tests/bridge/test_bridge_evaluate.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import _bridge_evaluate
import pytest
from support.heldout_data import heldout_split  # noqa: F401 (a fixture)
from support.smoke_pretrain import REPO, data_dir  # noqa: F401 (a fixture)

STAGES = REPO / "stages"
STAND_IN = REPO / "tests" / "fakes" / "megatron_bridge"
STEPS, EVERY = 6, 2
TRAINING = [
    f"train.train_iters={STEPS}",
    "train.global_batch_size=4",
    "model.seq_length=64",
    "dataset.seq_length=64",
    "validation.eval_iters=3",
    "logger.log_interval=1",
]
EVALUATION = [
    "validation.skip_train=true",
    "checkpoint.save=null",
    "checkpoint.load_optim=false",
    "checkpoint.load_rng=false",
]


def env() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("BCP_PIPELINE_", "RANK", "WORLD_SIZE"))}
    return {**base, "PYTHONPATH": str(STAND_IN), "BCPP_BRIDGE_STANDIN_STEP_SECONDS": "0.01"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path, heldout_split: Path) -> dict[str, Path]:  # noqa: F811
    """A stand-in training of 6 steps, a checkpoint every 2, and its per-split data list."""
    folder = tmp_path_factory.mktemp("bridge-run")
    data_list = folder / "data_path.txt"
    subprocess.run(
        [
            sys.executable,
            str(STAGES / "data_list.py"),
            "--data-dir",
            str(data_dir),
            "--valid-data-dir",
            str(heldout_split),
            "--format",
            "hydra",
            "--key",
            "dataset.data_path",
            "--out",
            str(data_list),
        ],
        check=True,
    )
    checkpoints = folder / "checkpoints"
    trained = subprocess.run(
        [
            sys.executable,
            str(STAGES / "bridge_pretrain.py"),
            "--overrides-file",
            str(data_list),
            *TRAINING,
            f"checkpoint.save={checkpoints}",
            f"checkpoint.load={checkpoints}",
            f"checkpoint.save_interval={EVERY}",
        ],
        capture_output=True,
        text=True,
        env=env(),
        timeout=300,
    )
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert sorted(p.name for p in checkpoints.glob("iter_*")) == ["iter_0000002", "iter_0000004", "iter_0000006"]
    return {"checkpoints": checkpoints, "data_list": data_list, "valid": heldout_split, "folder": folder}


def evaluate_argv(run: dict[str, Path], out: Path, *extra: str) -> list[str]:
    """The stage's command line as its job gives it (config/evaluate.py derives it), over the stand-in's run."""
    return [
        *(sys.executable, "-u", str(STAGES / "evaluate.py"), "--from", "bridge"),
        *("--checkpoints", str(run["checkpoints"]), "--valid-data-dir", str(run["valid"]), "--out", str(out)),
        *("--every", str(EVERY), "--target-step", str(STEPS), "--recipe", "vanilla_gpt_pretrain_config"),
        *("--world-size", "1", "--data-list", str(run["data_list"]), "--poll", "0.1", "--stall-seconds", "60"),
        *extra,
        "--",
        *TRAINING,
        *EVALUATION,
    ]


def evaluate(run: dict[str, Path], out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(evaluate_argv(run, out, *extra), capture_output=True, text=True, env=env(), timeout=600)


def results(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("step-*.json"))}


@pytest.fixture(scope="module")
def undisturbed_run(run, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The evaluation as its job runs it, after the training ended: its results folder and output."""
    out = tmp_path_factory.mktemp("undisturbed") / "evaluate"
    result = evaluate(run, out)
    assert result.returncode == 0, result.stdout + result.stderr
    return out, result.stdout


@pytest.fixture(scope="module")
def undisturbed(undisturbed_run) -> dict[str, bytes]:
    return results(undisturbed_run[0])


def test_each_checkpoint_is_scored_by_bridge_s_own_evaluation_line(run, undisturbed_run, tmp_path):
    finished, stdout = undisturbed_run
    out = tmp_path / "evaluate"
    shutil.copytree(finished, out)
    assert sorted(p.name for p in out.glob("step-*.json")) == [f"step-{s:08d}.json" for s in (2, 4, 6)]
    printed = {  # the stand-in's own validation lines, as Bridge prints them, read back independently
        int(line.split("iteration ")[1].split()[0]): float(line.split("lm loss value: ")[1].split()[0])
        for line in stdout.splitlines()
        if "validation loss at iteration" in line
    }
    for step in (2, 4, 6):
        saved = json.loads((out / f"step-{step:08d}.json").read_text())
        assert saved["loss"] == printed[step] and saved["step"] == step
        assert saved["checkpoint"] == str(run["checkpoints"] / f"iter_{step:07d}")
        assert (saved["tokens"], saved["samples"], saved["eval_iters"]) == (3 * 4 * 64, 12, 3)
        assert saved["engine"] == "megatron-bridge" and saved["data"][0][1].endswith(
            "validation_chunk_0.jsonl_text_document"
        )
    assert printed[2] > printed[4] > printed[6]  # the stand-in's loss falls with the step: each step its own
    assert "##bcp-pipeline evaluation" in stdout

    again = evaluate(run, out)  # a rerun after it finished: nothing evaluated twice
    assert again.returncode == 0 and "validation loss at iteration" not in again.stdout
    assert "3 checkpoint(s) evaluated (0 by this job)" in again.stdout


def progress(out: Path, target: int) -> tuple[int, dict]:
    """verify.py --progress on a results folder, as the stage's continuation runs it after each job."""
    done = subprocess.run(
        [sys.executable, str(STAGES / "verify.py"), "--progress", f"{out}={target}"], capture_output=True, text=True
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("##bcp-pipeline verify "))
    return done.returncode, json.loads(line.split(" ", 2)[2])


def test_a_job_its_limit_ended_is_measured_by_its_last_result_and_the_next_goes_on_from_it(
    run, undisturbed_run, tmp_path
):
    """The continuation's reading (config/evaluate.py derived_continuation): a job killed at its limit while it
    evaluated step 6 left the results of 2 and 4 and a temporary; verify.py reads step 4 of 6 (the stage is
    submitted again), the next job evaluates step 6 alone, and verify.py then reads the target."""
    finished, _ = undisturbed_run
    out = tmp_path / "evaluate"
    shutil.copytree(finished, out)
    (out / "step-00000006.json").rename(out / ".step-00000006.json.tmp-4242")  # killed before its rename
    assert progress(out, STEPS) == (1, {"ok": False, "checks": [], "steps": 4, "target": STEPS})
    again = evaluate(run, out)
    assert again.returncode == 0 and "3 checkpoint(s) evaluated (1 by this job)" in again.stdout, again.stdout
    assert results(out) == results(finished)  # the same bytes as the job that was never stopped
    assert progress(out, STEPS) == (0, {"ok": True, "checks": [], "steps": STEPS, "target": STEPS})


def test_with_a_test_split_in_the_data_list_each_result_has_its_test_loss_too(run, undisturbed, data_dir, tmp_path):  # noqa: F811
    from support.heldout_data import make_heldout_split

    test = make_heldout_split(tmp_path / "test", 10, split="test", seed=5)
    data_list = tmp_path / "data_path.txt"
    argv = ["--data-dir", str(data_dir), "--valid-data-dir", str(run["valid"]), "--test-data-dir", str(test)]
    argv += ["--key", "dataset.data_path", "--out", str(data_list)]
    subprocess.run([sys.executable, str(STAGES / "data_list.py"), *argv], check=True)
    out = tmp_path / "evaluate"
    result = evaluate({**run, "data_list": data_list}, out)
    assert result.returncode == 0, result.stdout + result.stderr
    printed = {  # the stand-in's lines, as Bridge's pretrain.py prints them: validation, then test
        (line.split(" on ")[1].split()[0], int(line.split("iteration ")[1].split()[0])): float(
            line.split("lm loss value: ")[1].split()[0]
        )
        for line in result.stdout.splitlines()
        if "validation loss at iteration" in line
    }
    for step in (2, 4, 6):
        saved = json.loads((out / f"step-{step:08d}.json").read_text())
        assert saved["loss"] == printed["validation", step] and saved["test_loss"] == printed["test", step]
    assert printed["test", 6] != printed["validation", 6]  # each split's own files
    assert len(undisturbed) == 3 and all("test_loss" not in json.loads(r) for r in undisturbed.values())  # none


def test_a_save_under_way_is_not_evaluated_until_the_tracker_names_it(run, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(run["checkpoints"], checkpoints)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("4")  # iter_0000006: a save not finished
    assert sorted(_bridge_evaluate.complete_checkpoints(checkpoints)) == [2, 4]
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("6")
    assert sorted(_bridge_evaluate.complete_checkpoints(checkpoints)) == [2, 4, 6]
    (checkpoints / "latest_checkpointed_iteration.txt").unlink()
    assert _bridge_evaluate.complete_checkpoints(checkpoints) == {}  # no tracker: no save has completed


def test_an_evaluation_bridge_fails_fails_the_stage_naming_the_step_and_its_lines(run, tmp_path):
    broken = dict(run)
    broken["valid"] = run["valid"]
    data_list = tmp_path / "data_path.txt"  # a held-out prefix whose files are gone
    data_list.write_text(run["data_list"].read_text().replace(str(run["valid"]), str(tmp_path / "gone")))
    broken["data_list"] = data_list
    result = evaluate(broken, tmp_path / "evaluate")
    assert result.returncode == 1
    assert "the evaluation of step 2" in result.stderr and "exited with status" in result.stderr
    assert "No such file or directory" in result.stderr  # Bridge's own error, in the stage's message
    assert not list((tmp_path / "evaluate").glob("step-*.json"))


def test_a_pruned_checkpoint_fails_the_stage_before_any_other_is_skipped(run, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(run["checkpoints"], checkpoints)
    shutil.rmtree(checkpoints / "iter_0000002")  # most_recent_k pruned it before it was read
    result = evaluate({**run, "checkpoints": checkpoints}, tmp_path / "evaluate")
    assert result.returncode == 1
    assert "the checkpoint of step 2 is gone" in result.stderr
    assert not list((tmp_path / "evaluate").glob("step-*.json"))


def test_overrides_are_refused_without_from_bridge(run, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(STAGES / "evaluate.py"),
            "--checkpoints",
            str(tmp_path),
            "--valid-data-dir",
            str(tmp_path),
            "--out",
            str(tmp_path / "o"),
            "--every",
            "2",
            "--target-step",
            "4",
            "--",
            "a=1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "overrides are for --from bridge: a=1" in result.stderr


def test_killed_mid_checkpoint_and_rerun_every_checkpoint_is_evaluated_once_with_the_same_bytes(
    run, undisturbed, tmp_path
):
    out = tmp_path / "evaluate"
    slow = {**env(), "BCPP_BRIDGE_STANDIN_EVAL_SECONDS": "3"}
    proc = subprocess.Popen(
        evaluate_argv(run, out),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=slow,
        start_new_session=True,
    )
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:  # the kill lands inside step 4's evaluation: step 2's result is written
        seen.append(line)
        if "evaluate: step 4: " in line:
            break
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)  # the job's whole process tree, torchrun and Bridge's rank with it
    proc.wait(timeout=60)
    assert sorted(results(out)) == ["step-00000002.json"], "".join(seen)

    again = evaluate(run, out)
    assert again.returncode == 0, again.stdout + again.stderr
    evaluated = [line for line in again.stdout.splitlines() if line.startswith("evaluate: step ") and "loss" in line]
    assert [line.split()[2] for line in evaluated] == ["4:", "6:"]  # step 2 was not evaluated again
    assert results(out) == undisturbed


def test_checkpoints_landing_while_it_runs_are_each_evaluated_once(run, undisturbed, tmp_path):
    checkpoints, out = tmp_path / "checkpoints", tmp_path / "evaluate"
    checkpoints.mkdir()
    tracker = checkpoints / "latest_checkpointed_iteration.txt"

    def land(step: int) -> None:  # as Bridge saves: the folder, then the tracker
        shutil.copytree(run["checkpoints"] / f"iter_{step:07d}", checkpoints / f"iter_{step:07d}")
        tracker.write_text(str(step))

    land(2)
    proc = subprocess.Popen(
        evaluate_argv({**run, "checkpoints": checkpoints}, out),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    deadline = time.monotonic() + 120
    for step in (4, 6):
        while not (out / f"step-{step - 2:08d}.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        land(step)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout + stderr
    assert stdout.count("validation loss at iteration") == 3
    # the same bytes as the undisturbed run's, but for the checkpoint folder each names
    assert {name: json.loads(data) | {"checkpoint": None} for name, data in results(out).items()} == {
        name: json.loads(data) | {"checkpoint": None} for name, data in undisturbed.items()
    }
