"""The smoke pretrain on 2 ranks through each backend's own launch: the local backend (1 replica x 2 processes), the
real two-node Slurm (2 nodes x 1 task, each node its own network namespace and address) and the emulated BCP
(2 replicas x 1 process under bcprun, under both of the emulator's commandline models).

What each shows, with nothing but the backend's launch environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK) to find the other rank:
- the ranks hold identical weights after training (each rank's `weights_sha256` line in its log);
- the loss curve equals a one-process run with the same global batch, to LOSS_RTOL (tests/support/
  ddp_pretrain.py states why not bit for bit);
- a rank SIGKILLed mid-run fails the job in about --collective-timeout, no hang (local, Slurm, BCP per-replica);
- `bcp-pipeline resume` then continues from the last checkpoint, and ends on the same curve and equal weights.

The pipeline is the pretrain stage alone, on data the real preprocess stage tokenized (the data stages themselves
run across the backends in the other e2e tests).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import _pretrain_checkpoints
import pytest
from support.bcp_emulation import needs_ngcsdk
from support.cli import cli
from support.ddp_pretrain import (  # noqa: F401
    RUN_NAME,
    STEPS,
    TIMEOUT,
    assert_trained_like_one_process,
    data_dir,  # (fixtures)
    rank_logs,
    reference,
    stage_job,
    write_project,
)
from support.pipeline_fixtures import start_orchestrator, wait_for
from support.slurm_cluster import MultiNodeCluster, two_node_cluster  # noqa: F401 (the fixture)

from bcp_pipeline.engine.state import RunStore, StageStatus

RENDEZVOUS_KEYS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def rank_processes(marker: Path) -> dict[int, tuple[int, dict[str, str]]]:
    """RANK -> (pid, rendezvous variables as the backend's launch set them) of each Python process running
    pretrain_local.py with `marker` on its command line (wrappers, bash and bcprun, carry the same variables but
    are not Python)."""
    ranks = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            len(argv) > 1
            and Path(argv[0].decode()).name.startswith("python")
            and argv[1].endswith(b"pretrain_local.py")
            and str(marker).encode() in b" ".join(argv)
        ):
            env = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
            if "RANK" in env:
                ranks[int(env["RANK"])] = (int(entry.name), {k: env.get(k, "") for k in RENDEZVOUS_KEYS})
    return ranks


def kill_rank_after_a_checkpoint(
    config: Path, results: Path, marker: Path, *args: str, expect_env: dict[int, dict[str, str]]
) -> tuple[str, float, int]:
    """Run the pipeline in a real orchestrator process; once a checkpoint exists, check both ranks' launch
    variables (`expect_env`: rank -> the values known beforehand; both must share MASTER_ADDR and MASTER_PORT),
    then SIGKILL rank 1. Returns the orchestrator's output, the seconds from the kill to its exit, and the checkpoint
    step the run had."""
    orchestrator = start_orchestrator(config, "run", "ddp", *args)
    checkpoints = results / RUN_NAME / "checkpoints"
    try:
        wait_for(lambda: _pretrain_checkpoints.latest_checkpoint(checkpoints), timeout=120, what="a first checkpoint")
        ranks = wait_for(
            lambda: (found := rank_processes(marker)).keys() == {0, 1} and found,
            timeout=10,
            what="both ranks' processes",
        )
        envs = {rank: env for rank, (_pid, env) in ranks.items()}
        for rank, expected in expect_env.items():
            assert {k: envs[rank][k] for k in expected} == expected, envs
        assert envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"] and envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
        assert int(envs[1]["MASTER_PORT"]) > 0 and all(env["WORLD_SIZE"] == "2" for env in envs.values())
        os.kill(ranks[1][0], signal.SIGKILL)
        killed = time.monotonic()
        output, _ = orchestrator.communicate(timeout=TIMEOUT + 90)
        waited = time.monotonic() - killed
    finally:
        orchestrator.kill()
    assert orchestrator.returncode == 1, output
    assert not (results / RUN_NAME / "train_summary.json").exists(), output  # it did not finish anyway
    step = int(_pretrain_checkpoints.latest_checkpoint(checkpoints).name[5:11])
    assert 4 <= step < STEPS
    return output, waited, step


def assert_failed_then_resumed(config: Path, results: Path, reference: dict, step: int, logs_of) -> None:
    """The stage failed; `resume` reran it, and the new job went on from the checkpoint at `step`."""
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    assert state.stages["pretrain"].status is StageStatus.FAILED
    assert cli(config, "resume") == 0
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    stage = state.stages["pretrain"]
    assert stage.status is StageStatus.SUCCEEDED and stage.attempts == 2 and stage.verification["ok"]
    logs = logs_of(stage_job(stage))
    assert any(f"at step {step} of {STEPS}" in text for text in logs), logs
    assert_trained_like_one_process(results / RUN_NAME / "train_summary.json", logs, reference, resumed_from=step)


# ---------------------------------------------------------------- local backend: 1 replica x 2 processes


def test_local_two_processes_train_as_one(tmp_path: Path, data_dir: Path, reference: dict) -> None:
    config = write_project(tmp_path / "p", data_dir)
    assert cli(config, "run", "ddp", "--backend", "local") == 0
    stage = RunStore(config.parent / ".bcp-pipeline").latest().stages["pretrain"]
    assert stage.sharding == {"replicas": 1, "processes": 2}
    logs = rank_logs(config, stage_job(stage))
    assert "rank 1 of 2: met at 127.0.0.1:" in logs[1]
    assert_trained_like_one_process(
        config.parent / "ws/main/results" / RUN_NAME / "train_summary.json", logs, reference
    )


def test_local_rank_killed_fails_the_job_and_resume_continues(tmp_path: Path, data_dir: Path, reference: dict) -> None:
    config = write_project(tmp_path / "p", data_dir)
    results = config.parent / "ws/main/results"
    output, waited, step = kill_rank_after_a_checkpoint(
        config,
        results,
        config.parent,
        "--backend",
        "local",
        expect_env={rank: {"RANK": str(rank), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1"} for rank in (0, 1)},
    )
    assert waited < TIMEOUT + 30, f"the job took {waited:.0f} s to fail after the kill"
    assert "rank 1 exited -9" in output and "another rank died, hangs or cannot be reached" in output, output
    assert_failed_then_resumed(config, results, reference, step, lambda job: rank_logs(config, job))


# ---------------------------------------------------------------- emulated BCP: 2 replicas x 1 process (bcprun)


def bcp_logs(fake, job_id: str) -> list[str]:
    """Every replica's job log (one per replica; under the launcher model replica 0's holds both ranks)."""
    results = fake.home / "jobs" / job_id / "results"
    return [p.read_text(errors="replace") for p in sorted(results.glob("*/joblog.log"))]


@needs_ngcsdk
@pytest.mark.parametrize("fake", ["sdk"], indirect=True)  # the transport changes nothing a job sees
@pytest.mark.parametrize("model", ["per_replica", "launcher"])
def test_bcp_two_replicas_train_as_one_under_both_commandline_models(
    fake, model: str, tmp_path: Path, data_dir: Path, reference: dict
) -> None:
    fake.set_variants(commandline=model)
    config = write_project(tmp_path / "p", data_dir, fake.transport)
    assert cli(config, "run", "ddp", "--backend", "bcp") == 0
    stage = RunStore(config.parent / ".bcp-pipeline").latest().stages["pretrain"]
    job = fake.jobs()[int(stage_job(stage))]["job"]
    assert (
        job["jobDefinition"]["replicaCount"] == 2
        and "bcprun --nnodes 2 --npernode 1" in job["jobDefinition"]["command"]
    )
    logs = bcp_logs(fake, stage_job(stage))
    if model == "per_replica":  # each replica's bcprun started its own node's rank
        assert "rank 1 of 2: met at 127.0.0.1:" in logs[1] and "rank 1 of 2" not in logs[0]
    else:  # replica 0's bcprun started both; replica 1 ran nothing
        assert "rank 1 of 2: met at 127.0.0.1:" in logs[0] and logs[1] == ""
    assert_trained_like_one_process(
        fake.workspace_path("main") / "results" / RUN_NAME / "train_summary.json", logs, reference
    )


@needs_ngcsdk
@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_bcp_rank_killed_fails_the_job_and_resume_continues(
    fake, tmp_path: Path, data_dir: Path, reference: dict
) -> None:
    config = write_project(tmp_path / "p", data_dir, fake.transport)
    results = fake.workspace_path("main") / "results"
    output, waited, step = kill_rank_after_a_checkpoint(  # one rank on each replica: LOCAL_RANK 0 on both
        config,
        results,
        fake.home,
        "--backend",
        "bcp",
        expect_env={rank: {"RANK": str(rank), "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"} for rank in (0, 1)},
    )
    assert waited < TIMEOUT + 45, f"the job took {waited:.0f} s to fail after the kill"
    # The job fails on whichever replica the emulator sees end first: the killed one (137), or its peer, which
    # notices at once that the all-reduce lost its partner (1).
    assert re.search(r"Replica (1 exited with code 137|0 exited with code 1)\b", output), output
    assert_failed_then_resumed(config, results, reference, step, lambda job: bcp_logs(fake, job))


# ---------------------------------------------------------------- real two-node Slurm: 2 nodes x 1 task


def test_slurm_two_nodes_train_as_one(
    two_node_cluster: MultiNodeCluster, tmp_path: Path, data_dir: Path, reference: dict
) -> None:
    config = write_project(tmp_path / "p", data_dir)
    assert cli(config, "run", "ddp", "--backend", "slurm") == 0
    stage = RunStore(config.parent / ".bcp-pipeline").latest().stages["pretrain"]
    assert stage.sharding == {"replicas": 2, "processes": 1}
    logs = rank_logs(config, stage_job(stage))
    # Rank 1 ran on node2 and met rank 0 at node1, the job's first node, across the bridge.
    assert "rank 1 of 2: met at node1:" in logs[1] and "(gloo, cpu)" in logs[1]
    assert_trained_like_one_process(
        config.parent / "ws/main/results" / RUN_NAME / "train_summary.json", logs, reference
    )


def test_slurm_rank_killed_fails_the_job_and_resume_continues(
    two_node_cluster: MultiNodeCluster, tmp_path: Path, data_dir: Path, reference: dict
) -> None:
    config = write_project(tmp_path / "p", data_dir)
    results = config.parent / "ws/main/results"
    output, waited, step = kill_rank_after_a_checkpoint(  # one task on each node, meeting at the first node
        config,
        results,
        config.parent,
        "--backend",
        "slurm",
        expect_env={rank: {"RANK": str(rank), "LOCAL_RANK": "0", "MASTER_ADDR": "node1"} for rank in (0, 1)},
    )
    assert waited < TIMEOUT + 45, f"the job took {waited:.0f} s to fail after the kill"
    assert "ended FAILED" in output, output
    assert_failed_then_resumed(config, results, reference, step, lambda job: rank_logs(config, job))


@needs_ngcsdk
@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
def test_bcp_one_replica_two_processes_meet_on_loopback(fake, tmp_path: Path, data_dir: Path, reference: dict) -> None:
    """One replica x 2 processes: the job's own shell starts the ranks (no bcprun) and gives them MASTER_ADDR and
    MASTER_PORT; without those they would try NGC_MASTER_ADDR (launcher-svc-<id>), which a one-node job cannot use."""
    config = write_project(tmp_path / "p", data_dir, fake.transport)
    assert (
        cli(
            config,
            "run",
            "ddp",
            "--backend",
            "bcp",
            "--set",
            "pretrain.bcp.replicas=1",
            "--set",
            "pretrain.bcp.processes=2",
        )
        == 0
    )
    stage = RunStore(config.parent / ".bcp-pipeline").latest().stages["pretrain"]
    job = fake.jobs()[int(stage_job(stage))]["job"]["jobDefinition"]
    assert job.get("replicaCount", 1) == 1 and "bcprun" not in job["command"]
    (log,) = bcp_logs(fake, stage_job(stage))
    assert "rank 1 of 2: met at 127.0.0.1:" in log
    assert_trained_like_one_process(
        fake.workspace_path("main") / "results" / RUN_NAME / "train_summary.json", [log], reference
    )
