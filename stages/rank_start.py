"""Starts one training rank: waits for the rendezvous where asked, binds the rank to its GPU's NUMA node, then
becomes the rank's command (exec: the same process, so the launcher's signals reach the training itself).

    python3 rank_start.py [--wait-for-master SECONDS] [--gpu-numa auto|off] -- COMMAND...

(Option names no torchrun option starts with: torchrun, which starts this as its script, would take them.)

--wait-for-master (BCP's multi-node jobs): a rank on any node but the first (GROUP_RANK, else NODE_RANK, else
NGC_ARRAY_INDEX > 0) first resolves MASTER_ADDR and opens one TCP connection to MASTER_ADDR:MASTER_PORT, retrying
every 2 s for at most SECONDS, as NVIDIA's NeMo launcher does on BCP (its pause_and_prime_dns_connections step):
a replica's DNS name of the master can lag the replica's start, and the training's own rendezvous would then fail
rather than wait. Past SECONDS the rank exits 110 (the launcher's code) with a line naming the address.

--gpu-numa auto (the default): where the host has more than one NUMA node, the rank's CPUs become those of the
NUMA node of its GPU (GPU LOCAL_RANK, in PCI-address order as CUDA numbers identical GPUs, CUDA_VISIBLE_DEVICES
followed), within the CPUs it is allowed (a Slurm cgroup, a pod's cpuset); where the GPU's node is unknown, the
nodes are shared out in rank order. Its memory is then preferred from that node through `numactl --preferred`,
where numactl exists and may set a memory policy (a container without CAP_SYS_NICE may not): preferred, not bound,
so a rank whose node fills up (a checkpoint's staging) spills over rather than being killed. NVIDIA's launcher binds
by default too (numa_mapping). Nothing here fails a job: whatever cannot be bound is said in one line and left.

Standard library only (stages/ runs in any image); the functions take the file system root, so tests can give a
made-up /sys and /proc.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

WAIT_EXIT = 110  # NVIDIA's launcher's exit code for a master it could not reach
RETRY_SECONDS = 2.0
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers (a DGX's GPUs are 3D controllers)


def say(text: str) -> None:
    print(f"bcp-pipeline: rank {os.environ.get('RANK', '?')}: {text}", file=sys.stderr, flush=True)


def node_rank(env: dict[str, str]) -> int:
    """The rank's node: bcprun's GROUP_RANK, torchrun's and our NODE_RANK, or BCP's replica index."""
    for key in ("GROUP_RANK", "NODE_RANK", "NGC_ARRAY_INDEX"):
        if env.get(key, "").isdigit():
            return int(env[key])
    return 0


def wait_for_master(env: dict[str, str], seconds: float, *, clock=time.monotonic, sleep=time.sleep) -> bool:
    """On a node other than the first: True once MASTER_ADDR:MASTER_PORT accepted a connection within `seconds`,
    False when it never did. The first node (and a job without the variables) returns True at once."""
    if node_rank(env) == 0:
        return True
    address, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT", "")
    if not address or not port.isdigit():
        say("no MASTER_ADDR/MASTER_PORT: not waiting for the rendezvous")
        return True
    say(f"node {node_rank(env)} waiting up to {seconds:.0f} s for the rendezvous {address}:{port} to answer")
    start = clock()
    last = "no attempt"
    while True:
        try:
            with socket.create_connection((address, int(port)), timeout=RETRY_SECONDS):
                say(f"the rendezvous {address}:{port} answered after {clock() - start:.0f} s")
                return True
        except OSError as exc:  # not resolvable yet, refused, unreachable
            last = f"{type(exc).__name__}: {exc}"
        if clock() - start >= seconds:
            say(
                f"the rendezvous {address}:{port} did not answer in {seconds:.0f} s (last: {last}): this node's "
                "ranks cannot meet the others"
            )
            return False
        sleep(RETRY_SECONDS)


def cpu_list(text: str) -> set[int]:
    """`0-3,8,10-11` -> {0, 1, 2, 3, 8, 10, 11} (the kernel's cpulist format)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def numa_nodes(root: Path) -> dict[int, set[int]]:
    """{node: its CPUs} of the host's NUMA nodes that have CPUs."""
    nodes = {}
    for folder in (root / "sys/devices/system/node").glob("node[0-9]*"):
        try:
            cpus = cpu_list((folder / "cpulist").read_text())
        except (OSError, ValueError):
            continue
        if cpus:
            nodes[int(folder.name[4:])] = cpus
    return nodes


def gpu_addresses(root: Path) -> list[str]:
    """The GPUs' PCI addresses in CUDA's order for identical GPUs (PCI order): those the NVIDIA driver shows this
    container (/proc/driver/nvidia/gpus: only its own GPUs under the NVIDIA container runtime), else every NVIDIA
    display or 3D controller on the PCI bus."""
    shown = sorted(path.name for path in (root / "proc/driver/nvidia/gpus").glob("*:*"))
    if shown:
        return shown
    found = []
    for device in (root / "sys/bus/pci/devices").glob("*:*"):
        try:
            vendor, kind = (device / "vendor").read_text().strip(), (device / "class").read_text().strip()
        except OSError:
            continue
        if vendor == NVIDIA_VENDOR and kind.startswith(GPU_CLASSES):
            found.append(device.name)
    return sorted(found)


def gpu_numa_node(root: Path, env: dict[str, str], local_rank: int) -> tuple[int, str] | None:
    """(NUMA node, PCI address) of the rank's GPU, or None where the host does not say."""
    gpus = gpu_addresses(root)
    visible = env.get("CUDA_VISIBLE_DEVICES", "").split(",")
    index = local_rank
    if all(part.strip().isdigit() for part in visible) and visible != [""]:
        if local_rank >= len(visible):
            return None
        index = int(visible[local_rank])
    if index >= len(gpus):
        return None
    try:
        node = int((root / "sys/bus/pci/devices" / gpus[index] / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return (node, gpus[index]) if node >= 0 else None


def choose_node(root: Path, env: dict[str, str]) -> tuple[int, set[int], str] | None:
    """(node, its CPUs, why) for this rank, or None where the host has one NUMA node (said)."""
    nodes = numa_nodes(root)
    if len(nodes) <= 1:
        say(f"{len(nodes) or 'no'} NUMA node(s) with CPUs: no binding needed")
        return None
    local = int(env.get("LOCAL_RANK", "0") or 0)
    found = gpu_numa_node(root, env, local)
    if found and found[0] in nodes:
        return found[0], nodes[found[0]], f"the NUMA node of its GPU {found[1]}"
    ordered = sorted(nodes)
    per_host = max(int(env.get("LOCAL_WORLD_SIZE", "0") or 0), local + 1)
    node = ordered[local * len(ordered) // per_host]
    return node, nodes[node], f"NUMA node {ordered.index(node) + 1} of {len(ordered)} in rank order (its GPU's unknown)"


def memory_prefix(node: int, numactl: str | None) -> tuple[list[str], str]:
    """`numactl --preferred=NODE --` where numactl may set this process's memory policy, and what was done."""
    if not numactl:
        return [], "memory not (no numactl)"
    probe = [numactl, f"--preferred={node}", "--", "true"]
    try:
        allowed = subprocess.run(probe, capture_output=True, text=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        allowed = False
    if not allowed:
        return [], "memory not (numactl may not set a memory policy here)"
    return [numactl, f"--preferred={node}", "--"], "memory preferred there (numactl)"


def bind(root: Path, env: dict[str, str], numactl: str | None) -> list[str]:
    """Binds this process's CPUs to the rank's node; returns the prefix that sets its memory policy (maybe [])."""
    chosen = choose_node(root, env)
    if chosen is None:
        return []
    node, cpus, why = chosen
    allowed = os.sched_getaffinity(0)
    usable = cpus & allowed
    if not usable:
        say(f"NUMA node {node} ({why}) has none of the CPUs this rank may use: no binding")
        return []
    try:
        os.sched_setaffinity(0, usable)
    except OSError as exc:
        say(f"NUMA node {node} ({why}): its CPUs could not be set ({exc}): no binding")
        return []
    prefix, memory = memory_prefix(node, numactl)
    say(f"bound to NUMA node {node}, {why}: {len(usable)} CPU(s); {memory}")
    return prefix


def main(argv: list[str] | None = None, root: Path = Path("/")) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wait-for-master", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--gpu-numa", choices=("auto", "off"), default="auto")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to start")
    env = dict(os.environ)
    if args.wait_for_master is not None and not wait_for_master(env, args.wait_for_master):
        return WAIT_EXIT
    prefix = bind(root, env, shutil.which("numactl")) if args.gpu_numa == "auto" else []
    sys.stdout.flush()
    os.execvp((prefix or command)[0], [*prefix, *command])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
