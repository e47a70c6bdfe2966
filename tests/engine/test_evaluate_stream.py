"""The streamed edge pretrain -> evaluate on the local backend, through the real orchestrator: the evaluate job starts
beside the training and evaluates each checkpoint as it lands; the run cancelled while both run (the training
stops at a checkpoint between the schedule's, the evaluation in the middle of its wait) and resumed ends with
every scheduled checkpoint evaluated exactly once, the results byte for byte those of one undisturbed evaluation
of the same checkpoints, its verification counting one result per checkpoint, and `status` naming the latest
held-out loss.

One run of a tiny smoke training (a few seconds of steps; the cost is the processes' torch and megatron imports).
The kill in the middle of a checkpoint's result, and checkpoints landing while the evaluation waits, are
tests/stages/test_evaluate_stage.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import evaluate
import yaml
from support.heldout_data import heldout_split  # noqa: F401 (a fixture)
from support.pipeline_fixtures import wait_for
from support.smoke_pretrain import REPO, TRAIN_ARGS, child_env, data_dir  # noqa: F401 (data_dir: a fixture)

from bcp_pipeline.engine.state import RunStore

STEPS, EVERY = 24, 4
SCHEDULE = list(range(EVERY, STEPS + 1, EVERY))


def project(folder: Path, data: Path, heldout: Path) -> Path:
    run_dir = "${workspace}/results/gpt-${run_id}"
    train_args = list(TRAIN_ARGS)
    train_args[train_args.index("--steps") + 1] = str(STEPS)
    train_args[train_args.index("--checkpoint-every") + 1] = str(EVERY)
    raw = {
        "version": 1,
        "stages_dir": str(REPO / "stages"),
        "backends": {"local": {"poll_seconds": 0.1}},
        "pipelines": {
            "ev": {
                "backend": "local",
                "workspace": {"name": "ev", "mount": "/mount_workspace"},
                "stages": {
                    "pretrain": {
                        "program": "pretrain_local.py",
                        "args": [
                            "--data-dir",
                            str(data),
                            "--results",
                            "${workspace}/results",
                            "--run-name",
                            "gpt-${run_id}",
                            *train_args,
                            "--valid-data-dir",
                            str(heldout),
                            "--eval-iters",
                            "2",
                            "--keep-checkpoints",
                            "20",
                        ],
                        "continuation": {"checkpoints": f"{run_dir}/checkpoints", "target_steps": STEPS},
                        "verify": [{"glob": f"{run_dir}/train_summary.json", "expect": 1}],
                    },
                    "evaluate": {
                        "program": "evaluate.py",
                        "args": [
                            "--checkpoints",
                            f"{run_dir}/checkpoints",
                            "--valid-data-dir",
                            str(heldout),
                            "--out",
                            f"{run_dir}/evaluate",
                            "--every",
                            str(EVERY),
                            "--target-step",
                            str(STEPS),
                            "--poll",
                            "0.1",
                        ],
                        "needs": [{"stage": "pretrain", "stream": True}],
                        "verify": [{"glob": f"{run_dir}/evaluate/step-*.json", "expect": len(SCHEDULE)}],
                    },
                },
            }
        },
    }
    (folder / "pipelines.yaml").write_text(yaml.safe_dump(raw, sort_keys=False, width=120))
    return folder / "pipelines.yaml"


def cli(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "bcp_pipeline", "--config", str(config), *args]


def test_a_cancelled_and_resumed_run_evaluates_every_checkpoint_once(data_dir, heldout_split, tmp_path):
    config = project(tmp_path, data_dir, heldout_split)
    env = {**child_env(), "PYTHONPATH": f"{REPO}:{REPO / 'stages'}"}
    first = subprocess.Popen(
        cli(config, "run", "ev"), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    workspace = tmp_path / ".bcp-pipeline" / "workspaces" / "ev" / "results"
    try:
        # The evaluation has a result while the training still runs: the two overlap.
        wait_for(
            lambda: list(workspace.glob("gpt-*/evaluate/step-00000004.json")),
            timeout=600,
            what="the first checkpoint's result",
        )
        run_id = RunStore(tmp_path / ".bcp-pipeline").latest().run_id
        assert not (workspace / f"gpt-{run_id}" / "train_summary.json").exists()
        cancel = subprocess.run(
            cli(config, "cancel", run_id), cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env
        )
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        output, _ = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode != 0, output
    run_dir = workspace / f"gpt-{run_id}"
    assert not (run_dir / "train_summary.json").exists(), output  # cancelled before the training ended
    before = sorted(p.name for p in (run_dir / "evaluate").glob("step-*.json"))
    resumed = subprocess.run(
        cli(config, "resume", run_id), cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env
    )
    assert resumed.returncode == 0, output + resumed.stdout + resumed.stderr
    assert "evaluate: succeeded (verified: 6/6 step-*.json)" in resumed.stdout
    results = {p.name: p.read_bytes() for p in sorted((run_dir / "evaluate").glob("step-*.json"))}
    assert list(results) == [f"step-{step:08d}.json" for step in SCHEDULE]
    # Exactly once: the resumed job evaluated only what the first had not (its log says how many it did itself).
    last_job = RunStore(tmp_path / ".bcp-pipeline").load(run_id).stages["evaluate"].jobs
    last_job = [job for job in last_job if job.kind == "stage"][-1].job_id
    logs = tmp_path / ".bcp-pipeline" / "runs" / run_id / "logs" / last_job
    last_log = "".join(p.read_text() for p in sorted(logs.iterdir()))
    assert f"{len(SCHEDULE)} checkpoint(s) evaluated ({len(SCHEDULE) - len(before)} by this job)" in last_log
    # The same bytes as one undisturbed evaluation of the same checkpoints.
    reference = tmp_path / "reference"
    args = evaluate.parse_args(
        [
            "--checkpoints",
            str(run_dir / "checkpoints"),
            "--valid-data-dir",
            str(heldout_split),
            "--out",
            str(reference),
            "--every",
            str(EVERY),
            "--target-step",
            str(STEPS),
            "--stall-seconds",
            "5",
        ]
    )
    reference.mkdir()
    assert evaluate.evaluate_all(args, evaluate.Evaluator(args)) == SCHEDULE
    assert {p.name: p.read_bytes() for p in sorted(reference.glob("step-*.json"))} == results
    status = subprocess.run(
        cli(config, "status", run_id), cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env
    )
    last = json.loads(results[f"step-{STEPS:08d}.json"])
    assert f"evaluate: held-out loss {last['loss']:.4f}" in status.stdout and f"at step {STEPS}" in status.stdout
