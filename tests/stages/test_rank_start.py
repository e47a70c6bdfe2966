"""stages/rank_start.py, the training rank's starter: its NUMA choice on made-up /sys and /proc trees (a DGX A100's
layout, a container's own GPUs, CUDA_VISIBLE_DEVICES, a host that does not say), the binding really applied to a
started process, a numactl that may not set a memory policy, and the wait for the rendezvous on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import rank_start

STAGES = Path(rank_start.__file__).resolve().parent
# A DGX A100 (NPS4): 8 NUMA nodes, GPUs 0-7 on nodes 3, 3, 1, 1, 7, 7, 5, 5 (NVIDIA's launcher's dgxa100 table).
DGX_GPUS = {
    "0000:07:00.0": 3,
    "0000:0f:00.0": 3,
    "0000:47:00.0": 1,
    "0000:4e:00.0": 1,
    "0000:87:00.0": 7,
    "0000:90:00.0": 7,
    "0000:b7:00.0": 5,
    "0000:bd:00.0": 5,
}


def fake_host(root: Path, nodes: dict[int, str], gpus: dict[str, int], *, proc_gpus: list[str] | None = None) -> Path:
    """A /sys with `nodes` {node: cpulist} and NVIDIA 3D controllers {address: numa_node} (plus a NIC, which must be
    left out), and /proc/driver/nvidia/gpus with `proc_gpus` where given."""
    for node, cpus in nodes.items():
        folder = root / f"sys/devices/system/node/node{node}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpus + "\n")
    for address, node in {**gpus, "0000:0c:00.0": 3}.items():
        device = root / "sys/bus/pci/devices" / address
        device.mkdir(parents=True)
        nic = address == "0000:0c:00.0"
        (device / "vendor").write_text("0x15b3\n" if nic else "0x10de\n")
        (device / "class").write_text("0x020700\n" if nic else "0x030200\n")
        (device / "numa_node").write_text(f"{node}\n")
    for address in proc_gpus or []:
        (root / "proc/driver/nvidia/gpus" / address).mkdir(parents=True)
    return root


def dgx(root: Path) -> Path:
    return fake_host(root, {n: f"{n * 16}-{n * 16 + 15}" for n in range(8)}, DGX_GPUS)


@pytest.mark.parametrize(("local", "node"), [(0, 3), (1, 3), (2, 1), (3, 1), (4, 7), (5, 7), (6, 5), (7, 5)])
def test_each_rank_of_a_dgx_goes_to_its_gpu_s_numa_node_not_to_its_rank_s_order(tmp_path, local, node):
    chosen = rank_start.choose_node(dgx(tmp_path), {"LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": "8"})
    assert chosen is not None
    assert chosen[0] == node and chosen[1] == set(range(node * 16, node * 16 + 16))
    assert "GPU 0000:" in chosen[2]


def test_cuda_visible_devices_and_the_container_s_own_gpus_are_followed(tmp_path):
    host = dgx(tmp_path / "a")
    # Slurm gave the job GPUs 4 and 6: local rank 1 drives GPU 6, on node 5.
    assert rank_start.choose_node(host, {"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "4,6"})[0] == 5
    # A pod given GPUs 4-7 sees only those in /proc/driver/nvidia/gpus: its local rank 0 drives 0000:87:00.0.
    pod = fake_host(
        tmp_path / "b",
        {n: f"{n * 16}-{n * 16 + 15}" for n in range(8)},
        DGX_GPUS,
        proc_gpus=["0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0"],
    )
    assert [rank_start.choose_node(pod, {"LOCAL_RANK": str(r)})[0] for r in range(4)] == [7, 7, 5, 5]


def test_without_gpu_locality_the_nodes_are_shared_out_in_rank_order_and_one_node_binds_nothing(tmp_path):
    host = fake_host(tmp_path / "two", {0: "0-7", 1: "8-15"}, {"0000:07:00.0": -1})  # numa_node -1: unknown
    assert [rank_start.choose_node(host, {"LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "4"})[0] for r in range(4)] == [
        0,
        0,
        1,
        1,
    ]
    assert "rank order" in rank_start.choose_node(host, {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"})[2]
    one = fake_host(tmp_path / "one", {0: "0-63"}, DGX_GPUS)
    assert rank_start.choose_node(one, {"LOCAL_RANK": "3"}) is None


def fake_numactl(folder: Path, code: int) -> str:
    """A STAND-IN numactl (this machine has none): exits `code` for the probe; otherwise runs what follows `--`."""
    path = folder / "numactl"
    path.write_text(
        f'#!/bin/bash\nwhile [ "$1" != -- ]; do shift; done; shift\n[ "$1" = true ] && exit {code}\nexec "$@"\n'
    )
    path.chmod(0o755)
    return str(path)


def test_numactl_sets_the_memory_policy_only_where_it_may_and_its_absence_is_said(tmp_path):
    assert rank_start.memory_prefix(3, fake_numactl(tmp_path, 0)) == (
        [str(tmp_path / "numactl"), "--preferred=3", "--"],
        "memory preferred there (numactl)",
    )
    refused = tmp_path / "refused"
    refused.mkdir()
    assert rank_start.memory_prefix(3, fake_numactl(refused, 1))[0] == []  # set_mempolicy: Operation not permitted
    assert rank_start.memory_prefix(3, None) == ([], "memory not (no numactl)")


def start(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """rank_start's main in a fresh process (it binds and execs itself) over the made-up host `root`; the command
    prints the CPUs it was left with."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import rank_start; from pathlib import Path; "
        "sys.exit(rank_start.main(sys.argv[3:], root=Path(sys.argv[2])))"
    )
    report = "import json, os; print(json.dumps(sorted(os.sched_getaffinity(0))))"
    return subprocess.run(
        [sys.executable, "-c", code, str(STAGES), str(root), *args, "--", sys.executable, "-c", report],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="binding is seen only with two CPUs to choose from")
def test_the_started_command_runs_on_its_node_s_cpus_and_numa_off_leaves_them(tmp_path):
    mine = sorted(os.sched_getaffinity(0))
    host = fake_host(tmp_path, {0: str(mine[0]), 1: ",".join(map(str, mine[1:]))}, {"0000:07:00.0": 1})
    env = {"RANK": "0", "LOCAL_RANK": "0", "PATH": str(tmp_path / "nowhere")}  # no numactl: CPUs only
    bound = start(host, env)
    assert bound.returncode == 0, bound.stderr
    assert json.loads(bound.stdout) == mine[1:]
    assert "bound to NUMA node 1, the NUMA node of its GPU 0000:07:00.0" in bound.stderr
    assert "memory not (no numactl)" in bound.stderr
    left = start(host, env, "--gpu-numa", "off")
    assert left.returncode == 0 and json.loads(left.stdout) == mine, left.stderr


def test_a_rank_on_a_later_node_waits_for_the_rendezvous_to_answer(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]  # bound but not listening yet: connections are refused
    env = {"GROUP_RANK": "1", "RANK": "8", "MASTER_ADDR": "localhost", "MASTER_PORT": str(port)}
    threading.Timer(3.0, listener.listen).start()  # the master's store comes up 3 s later
    started = time.monotonic()
    assert rank_start.wait_for_master(env, 60)
    assert 2.5 < time.monotonic() - started < 30
    listener.close()


def test_a_rendezvous_that_never_answers_fails_the_rank_with_110_and_says_where(tmp_path):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
        env = {"GROUP_RANK": "2", "RANK": "16", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        done = start(tmp_path, env, "--wait-for-master", "3", "--gpu-numa", "off")
    assert done.returncode == rank_start.WAIT_EXIT and done.stdout == ""
    assert f"the rendezvous 127.0.0.1:{port} did not answer in 3 s" in done.stderr, done.stderr
    # The first node's ranks never wait: the master is theirs.
    assert rank_start.wait_for_master({"GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, 0)
