"""The evaluate stage (stages/evaluate.py) on a real smoke training's checkpoints and a real held-out split.

One training (pretrain_local.py with --valid-data-dir, its own validation lines) and one undisturbed evaluation
(the program as a job runs it) are shared by the module; the faults run the same evaluation loop in this process:
checkpoints landing while it runs, a kill in the middle of a checkpoint's result, a rerun after it finished, and a
checkpoint pruned before it was evaluated. Each ends with every scheduled checkpoint evaluated exactly once and the
results byte for byte the undisturbed run's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import _common
import evaluate
import pytest
from support.heldout_data import heldout_split  # noqa: F401 (a fixture)
from support.smoke_pretrain import REPO, child_env, command, data_dir  # noqa: F401 (data_dir: a fixture)
from support.stage_fixtures import gpt2_vocab_merges

STEPS, EVERY = 16, 4
SCHEDULE = [4, 8, 12, 16]


@pytest.fixture(scope="module")
def heldout_dir(heldout_split: Path) -> Path:
    assert [p.name for p in sorted(heldout_split.glob("*.bin"))] == ["validation_chunk_0.jsonl_text_document.bin"]
    return heldout_split


@pytest.fixture(scope="module")
def trained(data_dir: Path, heldout_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A training that validates on the held-out split and keeps every checkpoint."""
    results = tmp_path_factory.mktemp("results")
    cmd = command(
        data_dir, results, "run", "--valid-data-dir", str(heldout_dir), "--keep-checkpoints", "10", "--eval-iters", "2"
    )
    cmd[cmd.index("--steps") + 1] = str(STEPS)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=child_env())
    assert done.returncode == 0, done.stdout + done.stderr
    return results / "run" / "checkpoints", done.stdout


def evaluate_args(checkpoints: Path, heldout: Path, out: Path) -> list[str]:
    return [
        "--checkpoints",
        str(checkpoints),
        "--valid-data-dir",
        str(heldout),
        "--out",
        str(out),
        "--every",
        str(EVERY),
        "--target-step",
        str(STEPS),
        "--poll",
        "0.01",
        "--stall-seconds",
        "5",
    ]


@pytest.fixture(scope="module")
def undisturbed(trained: tuple[Path, str], heldout_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The evaluation as a job runs it: the program, after the training ended; its results and stdout."""
    out = tmp_path_factory.mktemp("undisturbed") / "evaluate"
    done = subprocess.run(
        [sys.executable, str(REPO / "stages/evaluate.py"), *evaluate_args(trained[0], heldout_dir, out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {path.name: path.read_bytes() for path in sorted(out.glob("step-*.json"))}, done.stdout


def validation_losses(stdout: str) -> dict[int, str]:
    """The training's own `validation loss at iteration N | lm loss value: X` lines (Megatron's format)."""
    return {
        int(m[1]): m[2] for m in re.finditer(r"validation loss at iteration (\d+) \| lm loss value: (\S+) \|", stdout)
    }


def test_each_checkpoint_has_one_result_matching_the_trainings_validation_line(trained, undisturbed) -> None:
    results, stdout = undisturbed
    assert list(results) == [f"step-{step:08d}.json" for step in SCHEDULE]
    training = validation_losses(trained[1])
    assert sorted(training) == SCHEDULE  # every --eval-interval (= --checkpoint-every) steps and the last
    for step in SCHEDULE:
        result = json.loads(results[f"step-{step:08d}.json"])
        assert {"step", "split", "loss", "perplexity", "tokens", "checkpoint", "tasks"} <= set(result)
        assert result["step"] == step and result["split"] == "validation" and result["tasks"] == {}
        assert result["tokens"] == 2 * 4 * 64  # --eval-iters 2 x global batch 4 x sequence 64, none masked
        assert f"{result['loss']:.6E}" == training[step]  # the training's own number
        assert result["checkpoint"].endswith(f"step={step:06d}.pt")
    losses = [json.loads(results[f"step-{step:08d}.json"])["loss"] for step in SCHEDULE]
    assert losses[-1] < losses[0]  # the model learns the held-out text's structure too
    assert "4 checkpoint(s) evaluated (4 by this job)" in stdout
    assert stdout.count("##bcp-pipeline evaluation ") == 4


class Killed(BaseException):
    """What SIGKILL does to the loop: it stops wherever it is (here with a result's temporary half written)."""


class Recording(evaluate.Evaluator):
    """The real evaluator, counting what it evaluates; `kill_at` dies in the middle of that step's result."""

    def __init__(self, args, kill_at: int | None = None) -> None:
        super().__init__(args)
        self.kill_at, self.evaluated = kill_at, []

    def evaluate(self, step: int, path: Path) -> dict:
        result = super().evaluate(step, path)
        self.evaluated.append(step)
        if step == self.kill_at:
            temp = _common.temp_path_for(evaluate.result_path(self.args.out, step))
            temp.write_text(json.dumps(result)[:20])
            raise Killed()
        return result


def test_checkpoints_landing_a_kill_mid_checkpoint_and_a_rerun_evaluate_each_exactly_once(
    trained, heldout_dir, undisturbed, tmp_path: Path
) -> None:
    source = sorted(trained[0].iterdir())
    assert [int(p.name[5:11]) for p in source] == SCHEDULE
    checkpoints, out = tmp_path / "checkpoints", tmp_path / "evaluate"
    checkpoints.mkdir()
    shutil.copy2(source[0], checkpoints)
    pending = list(source[1:])

    def training_goes_on(_seconds: float) -> None:  # the evaluator waits: the training saves its next checkpoint
        if pending:
            shutil.copy2(pending.pop(0), checkpoints)

    args = evaluate.parse_args(evaluate_args(checkpoints, heldout_dir, out))
    out.mkdir()
    first = Recording(args, kill_at=8)
    with pytest.raises(Killed):
        evaluate.evaluate_all(args, first, sleep=training_goes_on)
    assert first.evaluated == [4, 8] and [p.name for p in out.glob(".step-*")][0].startswith(".step-00000008.json.tmp-")
    assert sorted(p.name for p in out.glob("step-*.json")) == ["step-00000004.json"]
    # The job runs again (the orchestrator's resume): the partial result is removed, step 8 redone, 4 kept.
    assert _common.remove_stale_temporaries(out) == 1
    second = Recording(args)
    assert evaluate.evaluate_all(args, second, sleep=training_goes_on) == [8, 12, 16]
    assert second.evaluated == [8, 12, 16] and not pending
    # A finished evaluation run again (a cancelled job's resume after it had finished) evaluates nothing.
    third = Recording(args)
    assert evaluate.evaluate_all(args, third, sleep=training_goes_on) == [] and third.evaluated == []
    assert {p.name: p.read_bytes() for p in sorted(out.glob("step-*.json"))} == {
        name: data.replace(str(trained[0]).encode(), str(checkpoints).encode()) for name, data in undisturbed[0].items()
    }


def test_a_stop_checkpoint_between_the_schedules_is_not_a_result(trained, heldout_dir, tmp_path: Path) -> None:
    checkpoints, out = tmp_path / "checkpoints", tmp_path / "evaluate"
    checkpoints.mkdir()
    out.mkdir()
    for path in sorted(trained[0].iterdir()):
        shutil.copy2(path, checkpoints)
    # A SIGTERM at step 6 saved a checkpoint there (renamed from a real one: its step is only in the name).
    shutil.copy2(checkpoints / "step=000004.pt", checkpoints / "step=000006.pt")
    args = evaluate.parse_args(evaluate_args(checkpoints, heldout_dir, out))
    assert evaluate.evaluate_all(args, evaluate.Evaluator(args)) == SCHEDULE


def test_a_checkpoint_pruned_before_its_evaluation_fails_naming_it(heldout_dir, tmp_path: Path) -> None:
    checkpoints, out = tmp_path / "checkpoints", tmp_path / "evaluate"
    checkpoints.mkdir()
    out.mkdir()
    (checkpoints / "step=000012-last.pt").write_bytes(b"")  # 4 and 8 were pruned (--keep-checkpoints 1)
    args = evaluate.parse_args(evaluate_args(checkpoints, heldout_dir, out))
    with pytest.raises(_common.StageError, match="checkpoint of step 4 is gone"):
        evaluate.evaluate_all(args, evaluate.Evaluator(args))


def test_no_checkpoint_for_the_stall_time_fails(heldout_dir, tmp_path: Path) -> None:
    args = evaluate.parse_args(evaluate_args(tmp_path / "none", heldout_dir, tmp_path / "out"))
    args.stall_seconds = 3.0
    clock = iter(range(100))
    with pytest.raises(_common.StageError, match="no checkpoint landed for 3 s, waiting for step 4"):
        evaluate.evaluate_all(args, evaluate.Evaluator(args), sleep=lambda _s: None, clock=lambda: next(clock))


def test_tasks_are_scored_on_each_checkpoint_as_the_export_scores_the_last(trained, heldout_dir, tmp_path) -> None:
    """`--tasks`: lm-evaluation-harness itself on each checkpoint, loaded as the export writes it; the last
    checkpoint's scores are those the export stage's own scoring of that checkpoint finds."""
    vocab, merges = gpt2_vocab_merges()
    bpe = tmp_path / "bpe"
    bpe.mkdir()
    shutil.copy(vocab, bpe / "vocab.json")
    shutil.copy(merges, bpe / "merges.txt")
    checkpoints, out = trained[0], tmp_path / "evaluate"
    arguments = evaluate_args(checkpoints, heldout_dir, out)
    arguments[arguments.index("--every") + 1] = str(2 * EVERY)  # steps 8 and 16: a scoring costs seconds
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "stages/evaluate.py"),
            *arguments,
            "--tasks",
            "demo_cloze,demo_lastword",
            "--bpe-dir",
            str(bpe),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = {step: json.loads((out / f"step-{step:08d}.json").read_text()) for step in (2 * EVERY, STEPS)}
    assert sorted(p.name for p in out.glob("step-*.json")) == [f"step-{s:08d}.json" for s in (2 * EVERY, STEPS)]
    for result in results.values():
        assert set(result["tasks"]) == {"demo_cloze", "demo_lastword"}
        assert 0.0 <= result["tasks"]["demo_cloze"]["acc"] <= 1.0
        assert result["tasks"]["demo_lastword"]["perplexity"] > 1.0
    assert not (out / evaluate.TASKS_SCRATCH).exists() or not any((out / evaluate.TASKS_SCRATCH).iterdir())
    assert "demo_cloze acc" in done.stdout  # the status line's source: the evaluation line carries the tasks
    last = json.loads(
        next(line for line in reversed(done.stdout.splitlines()) if "##bcp-pipeline evaluation" in line).split(" ", 2)[
            2
        ]
    )
    assert last["tasks"] == results[STEPS]["tasks"]

    export = subprocess.run(
        [
            sys.executable,
            str(REPO / "stages/export_hf.py"),
            "--from",
            "smoke",
            "--checkpoints",
            str(checkpoints),
            "--bpe-dir",
            str(bpe),
            "--out",
            str(tmp_path / "export"),
            "--tasks",
            "demo_cloze,demo_lastword",
            "--scores-dir",
            str(tmp_path / "scores"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(),
    )
    assert export.returncode == 0, export.stdout + export.stderr
    exported = json.loads((tmp_path / "scores" / f"step-{STEPS:08d}.json").read_text())
    assert exported["tasks"] == results[STEPS]["tasks"]


def test_an_unknown_task_is_refused_before_anything_runs(tmp_path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "stages/evaluate.py"),
            *evaluate_args(tmp_path, tmp_path, tmp_path / "o"),
            "--tasks",
            "demo_cloze,hellaswag",
            "--bpe-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "unknown task(s) hellaswag; the shipped ones: demo_cloze" in done.stderr
