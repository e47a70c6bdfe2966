"""The smoke pretrain on 2 ranks, as the distributed tests run it (tests/stages/test_pretrain_distributed.py, and
through each backend's launch: tests/e2e/test_pretrain_backends.py, the Grid Engine and Kubernetes e2e tests): its
arguments, the one-process `reference` run (a module fixture) whose curve 2 ranks must follow to LOSS_RTOL, the
one-stage `ddp` pipeline for every backend, and the checks of a finished 2-rank run (identical weights on both ranks,
the reference's losses and tokens).

Tolerance: a 2-rank run sums each step's loss and gradients in another order than one process (two half batches,
gloo's all-reduce), so its losses equal the one-process run's to LOSS_RTOL, not bit for bit (measured here: ~1e-7).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.smoke_pretrain import child_env, data_dir, summary  # noqa: F401 (data_dir: a fixture)

from bcp_pipeline.engine.state import RunStore

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "stages" / "pretrain_local.py"
STEPS = 12
LOSS_RTOL = 1e-4
# As the one-process smoke run's (support/smoke_pretrain.py: hidden 64, sequence 64) with a global batch of 4:
# 2 samples per rank on 2 ranks.
ARGS = [
    "--steps",
    str(STEPS),
    "--checkpoint-every",
    "4",
    "--seq-length",
    "64",
    "--global-batch-size",
    "4",
    "--hidden",
    "64",
    "--heads",
    "4",
    "--lr",
    "3e-3",
    "--seed",
    "7",
]
TIMEOUT = 8  # --collective-timeout of these runs (s): how long a rank waits for a dead peer
RUN_NAME = "ddp"
DIGEST = re.compile(r"^rank (\d+) of (\d+): weights_sha256 ([0-9a-f]{64})$", re.M)
BCP_DEFAULTS = {
    "image": "nvcr.io/nvaie/nemo-framework-training:23.11",
    "instance": "dgxa100.80g.8.norm",
    "total_runtime": "1h",
    "workspaces": [{"name": "main", "mount": "/mount_workspace", "mode": "RW"}],
}


def command(data: Path, results: Path, run_name: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(SCRIPT),
        "--data-dir",
        str(data),
        "--results",
        str(results),
        "--run-name",
        run_name,
        *ARGS,
        "--collective-timeout",
        str(TIMEOUT),
        *extra,
    ]


def run_one(cmd: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd + ["--threads", "2"], capture_output=True, text=True, timeout=180, env=child_env())
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture(scope="module")
def reference(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One process, the same global batch: the curve the ranks must follow."""
    results = tmp_path_factory.mktemp("one")
    run_one(command(data_dir, results, "one"))
    return summary(results, "one")


def write_project(root: Path, data: Path, transport: str = "sdk") -> Path:
    """A one-stage pipeline `ddp`: pretrain_local.py on 2 ranks, shaped for each backend."""
    stage = {
        "program": "pretrain_local.py",
        "args": [
            "--data-dir",
            str(data),
            "--results",
            "${workspace}/results",
            "--run-name",
            RUN_NAME,
            *ARGS,
            "--collective-timeout",
            str(TIMEOUT),
            "--threads",
            "1",
        ],
        "local": {"replicas": 1, "processes": 2},
        "slurm": {"nodes": 2, "ntasks_per_node": 1},
        "bcp": {"replicas": 2, "processes": 1},
        "verify": [{"glob": f"${{workspace}}/results/{RUN_NAME}/train_summary.json", "expect": 1}],
    }
    raw = {
        "version": 1,
        "stages_dir": str(REPO / "stages"),
        "backends": {
            "local": {"workspace_dir": "ws", "poll_seconds": 0.1},
            "slurm": {"workspace_dir": "ws", "poll_seconds": 0.2, "poll_max_seconds": 1},
            "bcp": {"transport": transport, "poll_min_seconds": 0.1, "poll_max_seconds": 0.3},
        },
        "pipelines": {
            "ddp": {
                "workspace": {"name": "main", "mount": "/mount_workspace"},
                "defaults": {"bcp": BCP_DEFAULTS},
                "verification": {"bcp": {**BCP_DEFAULTS, "instance": "dgxa100.80g.1.norm"}},
                "stages": {"pretrain": stage},
            }
        },
    }
    root.mkdir(parents=True)
    config = root / "pipelines.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def digests(logs: list[str]) -> dict[int, str]:
    """Rank -> its weights digest, from the `rank R of 2: weights_sha256 D` lines of the job's logs."""
    found = {}
    for text in logs:
        for rank, world, digest in DIGEST.findall(text):
            assert world == "2", text
            found[int(rank)] = digest
    return found


def rank_logs(config: Path, job_id: str) -> list[str]:
    """The rank logs of one local or Slurm job (both write RUN/logs/JOB/rank-NNNNN.log)."""
    store = RunStore(config.parent / ".bcp-pipeline")
    run_dir = store.run_dir(store.latest().run_id)
    return [p.read_text(errors="replace") for p in sorted((run_dir / "logs" / job_id).glob("rank-*.log"))]


def assert_trained_like_one_process(
    summary_file: Path, logs: list[str], reference: dict, resumed_from: int = 0
) -> None:
    summary = json.loads(summary_file.read_text())
    assert summary["world_size"] == 2 and summary["steps"] == STEPS
    assert summary["resumed_from_step"] == resumed_from
    # Both ranks printed their digest, and they are the weights rank 0 saved: bit-identical after DDP.
    assert digests(logs) == {0: summary["weights_sha256"], 1: summary["weights_sha256"]}
    assert summary["losses"] == pytest.approx(reference["losses"], rel=LOSS_RTOL)
    assert summary["tokens_seen"] == reference["tokens_seen"]


def stage_job(stage) -> str:
    """The id of the stage's last stage job (not its verification)."""
    return [job for job in stage.jobs if job.kind == "stage"][-1].job_id
