"""The smoke pretrain on 2 real local ranks (gloo on 127.0.0.1, torchrun-style variables set by the test): equal
weights on every rank, the one-process loss curve, a dead or hung rank fails the job, resume across world sizes.
And the rendezvous that reads torchrun's, Slurm's and BCP's variables.

Tolerance: a 2-rank run sums each step's loss and gradients in another order than one process (two half batches,
gloo's all-reduce), so its losses equal the one-process run's to LOSS_RTOL, not bit for bit (measured here: ~1e-7).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import _pretrain_checkpoints
import _ranks
import pytest
import torch
from _stage_error import StageError
from support.ddp_pretrain import LOSS_RTOL, STEPS, TIMEOUT, command, data_dir, reference, run_one  # noqa: F401 (fixtures)
from support.smoke_pretrain import child_env, logged_steps, summary


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_ranks(cmd: list[str], world: int = 2) -> list[subprocess.Popen]:
    """`world` processes with the variables torchrun sets, one CPU thread each (2 cores here)."""
    port = str(free_port())
    return [
        subprocess.Popen(
            cmd + ["--threads", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(
                RANK=str(rank),
                WORLD_SIZE=str(world),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
            ),
        )
        for rank in range(world)
    ]


def finish(ranks: list[subprocess.Popen], timeout: float = 180) -> list[tuple[int, str, str]]:
    results = []
    try:
        for proc in ranks:
            out, err = proc.communicate(timeout=timeout)
            results.append((proc.returncode, out, err))
    finally:
        for proc in ranks:
            proc.kill()
    return results


def digest_lines(stdout: str) -> list[str]:
    return [line.split()[-1] for line in stdout.splitlines() if "weights_sha256" in line and line.startswith("rank ")]


def wait_for_step(proc: subprocess.Popen, step: int, timeout: float = 120) -> str:
    """Read rank 0's stdout until it logged `step`; returns what it read."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, f"rank exited early ({proc.returncode}): {''.join(seen)}"
        seen.append(line)
        if line.startswith(f"step {step}/"):
            return "".join(seen)
    raise AssertionError(f"no step {step} within {timeout} s")


# ---------------------------------------------------------------- training on 2 ranks


def test_two_ranks_hold_equal_weights_and_follow_the_one_process_curve(
    data_dir: Path, tmp_path: Path, reference: dict
) -> None:
    (code0, out0, err0), (code1, out1, err1) = finish(start_ranks(command(data_dir, tmp_path, "two")))
    assert code0 == 0 and code1 == 0, err0 + err1
    assert "2 rank(s), global batch 4 = micro batch 2 x 2 rank(s) x 1 accumulation step(s)" in out0
    assert logged_steps(out0) == list(range(1, STEPS + 1)) and logged_steps(out1) == []  # rank 0 speaks
    assert "rank 1 of 2: met at 127.0.0.1:" in out1 and "(gloo, cpu)" in out1
    (digest0,), (digest1,) = digest_lines(out0), digest_lines(out1)
    result = summary(tmp_path, "two")
    assert digest0 == digest1 == result["weights_sha256"]  # DDP kept the ranks' weights bit-identical
    assert result["world_size"] == 2 and result["tokens_seen"] == reference["tokens_seen"]
    assert result["losses"] == pytest.approx(reference["losses"], rel=LOSS_RTOL)
    assert result["last_loss"] < result["first_loss"] - 1.0  # it trains (the curve is not flat by accident)
    latest = _pretrain_checkpoints.latest_checkpoint(tmp_path / "two" / "checkpoints")
    checkpoint = _pretrain_checkpoints.load_checkpoint(latest, torch.device("cpu"))
    assert checkpoint["step"] == STEPS and checkpoint["config"]["world_size"] == 2


@pytest.mark.parametrize("how, victim", [("killed", 1), ("hung", 1), ("killed", 0)])
def test_a_dead_or_hung_rank_fails_the_job_within_the_timeout(
    data_dir: Path, tmp_path: Path, how: str, victim: int
) -> None:
    """SIGKILL (connection reset: at once) or SIGSTOP (silence: --collective-timeout) of one rank; rank 0 also
    serves the rendezvous store, so its death is a case of its own."""
    ranks = start_ranks(command(data_dir, tmp_path, how, "--steps", "2000", "--checkpoint-every", "1000"))
    survivor = ranks[1 - victim]
    try:
        wait_for_step(ranks[0], 2)
        ranks[victim].send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        began = time.monotonic()
        _out, err = survivor.communicate(timeout=TIMEOUT + 60)
        waited = time.monotonic() - began
    finally:
        for proc in ranks:
            proc.kill()
            proc.communicate()
    assert survivor.returncode == 1, err
    assert f"rank {1 - victim} of 2:" in err and "another rank died, hangs or cannot be reached" in err
    assert waited < TIMEOUT + 30, f"the surviving rank took {waited:.0f} s to give up"
    assert not (tmp_path / how / "train_summary.json").exists()


def test_resume_across_world_sizes(data_dir: Path, tmp_path: Path, reference: dict) -> None:
    """Stopped on 2 ranks (SIGTERM to rank 1 alone), finished on 1; stopped on 1, finished on 2 (with gradient
    accumulation): both runs end at the same step with the reference's curve."""
    ckpt_dir = tmp_path / "two-then-one" / "checkpoints"
    ranks = start_ranks(command(data_dir, tmp_path, "two-then-one"))
    try:
        wait_for_step(ranks[0], 2)
        ranks[1].send_signal(signal.SIGTERM)  # the other rank stops after the same step
    finally:
        (code0, out0, err0), (code1, _out1, err1) = finish(ranks)
    assert code0 == code1 == 1, err0 + err1
    assert "stopped by signal on another rank" in err0 and "stopped by signal 15" in err1
    stopped_at = int(_pretrain_checkpoints.latest_checkpoint(ckpt_dir).name[5:11])
    assert 2 <= stopped_at < STEPS and f"checkpoint saved: {ckpt_dir}" in out0
    resumed = run_one(command(data_dir, tmp_path, "two-then-one"))
    assert f"at step {stopped_at} of {STEPS}" in resumed.stdout and "checkpoint ran on 2 rank(s)" in resumed.stdout
    assert logged_steps(resumed.stdout) == list(range(stopped_at + 1, STEPS + 1))
    two_then_one = summary(tmp_path, "two-then-one")
    assert two_then_one["resumed_from_step"] == stopped_at and two_then_one["steps"] == STEPS
    assert two_then_one["losses"] == pytest.approx(reference["losses"], rel=LOSS_RTOL)

    one = subprocess.Popen(
        command(data_dir, tmp_path, "one-then-two") + ["--threads", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        wait_for_step(one, 3)
        one.send_signal(signal.SIGTERM)
        one.communicate(timeout=60)
    finally:
        one.kill()
    assert one.returncode == 1
    stopped_at = int(_pretrain_checkpoints.latest_checkpoint(tmp_path / "one-then-two" / "checkpoints").name[5:11])
    # On 2 ranks with 1 sample per forward: 2 accumulation steps per rank, still the same samples per step.
    (code0, out0, err0), (code1, out1, err1) = finish(
        start_ranks(command(data_dir, tmp_path, "one-then-two", "--micro-batch-size", "1"))
    )
    assert code0 == code1 == 0, err0 + err1
    assert f"at step {stopped_at} of {STEPS}" in out0 and "micro batch 1 x 2 rank(s) x 2 accumulation step(s)" in out0
    assert logged_steps(out0) == list(range(stopped_at + 1, STEPS + 1))
    one_then_two = summary(tmp_path, "one-then-two")
    assert digest_lines(out0) == digest_lines(out1) == [one_then_two["weights_sha256"]]
    assert one_then_two["losses"] == pytest.approx(reference["losses"], rel=LOSS_RTOL)


def test_a_world_size_that_does_not_split_the_batch_is_refused(data_dir: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        command(data_dir, tmp_path, "three"),
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(RANK="0", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT="1"),
    )
    assert done.returncode == 1
    assert (
        "--global-batch-size 4 does not split over 3 ranks; run on a world size that divides it (1, 2, 4)"
        in done.stderr
    )
    assert not (tmp_path / "three").exists()


# ---------------------------------------------------------------- rendezvous


def test_rendezvous_torchrun() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "198.18.0.7",
        "MASTER_PORT": "29555",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NODELIST": "other[1-2]",
        "NGC_MASTER_ADDR": "x",
    }
    assert _ranks.rendezvous(env) == _ranks.Rendezvous(3, 8, 1, "198.18.0.7", 29555)  # torchrun's win


def test_rendezvous_slurm_reads_the_job_nodelist() -> None:
    base = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "123456"}
    port = 20000 + 123456 % 20000  # the port the Slurm backend's batch script exports
    assert _ranks.rendezvous({**base, "SLURM_JOB_NODELIST": "gpu-node[07-08]"}) == _ranks.Rendezvous(
        5, 8, 1, "gpu-node07", port
    )
    assert _ranks.rendezvous({**base, "SLURM_NODELIST": "alpha,beta"}).master_addr == "alpha"
    assert _ranks.rendezvous({**base, "SLURM_JOB_NODELIST": "n1", "MASTER_PORT": "4000"}).master_port == 4000


@pytest.mark.parametrize(
    "hostlist, hosts",
    [
        ("node[1-2]", ["node1", "node2"]),
        ("node1,node2", ["node1", "node2"]),
        ("node[01-03,7],gpu5", ["node01", "node02", "node03", "node7", "gpu5"]),
        ("rack[1-2]-n[3-4]", ["rack1-n3", "rack1-n4", "rack2-n3", "rack2-n4"]),
        ("a-b.c[9-10]", ["a-b.c9", "a-b.c10"]),
    ],
)
def test_expand_slurm_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert _ranks.expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("hostlist", ["node[1-", "node[a-b]", "", "a,,b", "x]"])
def test_unreadable_hostlist_is_refused(hostlist: str) -> None:
    with pytest.raises(ValueError, match="cannot read the Slurm host list"):
        _ranks.expand_hostlist(hostlist)


def test_unreadable_nodelist_falls_back_to_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "node[a-b]"}
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StageError, match="no scontrol to expand it; set MASTER_ADDR"):
        _ranks.rendezvous(env)
    # A stand-in for scontrol: prints the expansion `scontrol show hostnames LIST` would, one host a line.
    fake = tmp_path / "scontrol"
    fake.write_text('#!/bin/sh\n[ "$1 $2 $3" = "show hostnames node[a-b]" ] && printf "nodea\\nnodeb\\n"\n')
    fake.chmod(0o755)
    assert _ranks.rendezvous(env).master_addr == "nodea"


def test_rendezvous_bcp_replica() -> None:
    """bcprun's torchrun-style ranks; a replica that has NGC_MASTER_ADDR but no MASTER_ADDR meets there."""
    env = {
        "RANK": "9",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "1",
        "NGC_ARRAY_INDEX": "1",
        "NGC_ARRAY_SIZE": "2",
        "NGC_MASTER_ADDR": "launcher-svc-4242",
        "NGC_JOB_ID": "4242",
    }
    assert _ranks.rendezvous(env) == _ranks.Rendezvous(9, 16, 1, "launcher-svc-4242", 29500)
    assert _ranks.rendezvous({**env, "MASTER_ADDR": "198.18.0.9", "MASTER_PORT": "6000"}).master_addr == "198.18.0.9"


def test_rendezvous_alone_and_bad_values() -> None:
    assert _ranks.rendezvous({}) == _ranks.Rendezvous(0, 1, 0, "127.0.0.1", 29500)
    with pytest.raises(StageError, match="rank 1 of 2: no rendezvous address"):
        _ranks.rendezvous({"RANK": "1", "WORLD_SIZE": "2"})
    with pytest.raises(StageError, match="MASTER_PORT=70000 is not a TCP port"):
        _ranks.rendezvous({"MASTER_PORT": "70000"})
    with pytest.raises(StageError, match="LOCAL_RANK='one' is not an integer"):
        _ranks.rendezvous({"LOCAL_RANK": "one"})
