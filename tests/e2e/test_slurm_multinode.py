"""Data stages spread over two real Slurm nodes (`scripts/slurm-cluster start --nodes 2`: each slurmd in its own
network namespace on a private bridge, the workspace on the shared file system), and a node lost mid-stage.

Where each rank ran comes from the completion records the ranks write last (`ran_on`: hostname, SLURMD_NODENAME,
addresses). Outputs are compared byte for byte with a run of the same pipeline on the local backend. Where Slurm
cannot run here, the fixture skips these tests and prints why.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.cli import cli
from support.pipeline_fixtures import (
    CHAIN_CONFIG,
    REPO,
    start_orchestrator,
    wait_for,
    without_training,
    write_chain_project,
)
from support.slurm_cluster import MultiNodeCluster, node_addresses, script, two_node_cluster  # noqa: F401 (the fixture)

from bcp_pipeline.engine.state import RunStore, StageStatus

pytestmark = pytest.mark.usefixtures("two_node_cluster")
SLURM_OPTIONS = {"poll_seconds": 0.2, "poll_max_seconds": 1.0}
# Demo data stages spread over both nodes: (nodes, ntasks_per_node). download puts two ranks on each node.
SPREAD = {"download": (2, 2), "extract": (2, 1), "concat": (2, 1), "tokenize-preprocess": (2, 1)}
# Per stage: the name its program gives its completion records, and the records' count of items in the rank's
# shard and of those it produced this time.
RECORDS = {
    "download": ("download", "files", "downloaded"),
    "extract": ("extract", "files", "extracted"),
    "concat": ("concat", "outputs", "written"),
    "tokenize-preprocess": ("preprocess", "outputs", "written"),
}


def state_of(config: Path):
    return RunStore(config.parent / ".bcp-pipeline").latest()


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` but the completion records (they hold times and hosts), by relative path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".completions" not in p.parts
    }


def records(folder: Path, stage: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((folder / ".completions").glob(f"{stage}-*.json"))]


def assert_ran_on(record: dict, node: str, cluster: MultiNodeCluster) -> None:
    # Each slurmd runs in its own UTS namespace named after its node, and its own network namespace.
    assert record["ran_on"] == {"hostname": node, "slurmd_nodename": node, "addresses": [cluster.nodes[node]]}


def demo_project(root: Path, backend: str) -> Path:
    """The bundled demo pipeline without its pretrain stage (data stages only), on `backend`."""
    raw = yaml.safe_load((REPO / "pipelines.yaml").read_text())
    demo = raw["pipelines"]["demo"]
    without_training(demo["stages"])
    for stage, (nodes, tasks) in SPREAD.items():
        demo["stages"][stage]["slurm"] = {"nodes": nodes, "ntasks_per_node": tasks}
    backends = raw.get("backends") or {}
    raw = {
        "version": raw.get("version", 1),
        "stages_dir": str(REPO / "stages"),
        "backends": {**backends, "slurm": {**(backends.get("slurm") or {}), **SLURM_OPTIONS}},
        "pipelines": {"demo": {**demo, "backend": backend}},
    }
    root.mkdir(parents=True)
    config = root / "pipelines.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def test_demo_data_stages_spread_over_two_nodes_match_a_local_run(two_node_cluster: MultiNodeCluster, tmp_path):
    cluster = two_node_cluster
    local = demo_project(tmp_path / "local", "local")
    assert cli(local, "run", "demo") == 0
    config = demo_project(tmp_path / "slurm", "slurm")
    assert cli(config, "run", "demo") == 0
    state = state_of(config)
    assert state.backend == "slurm" and all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())

    workspace = config.parent / ".bcp-pipeline/workspaces/demo"
    data = workspace / "data/slimpajama"
    outputs = {
        "download": (data / "zst", 8),
        "extract": (data / "jsonl", 8),
        "concat": (data / "train", 2),
        "tokenize-preprocess": (data / "preprocessed", 2),
    }
    for stage, (folder, total) in outputs.items():
        nodes, tasks = SPREAD[stage]
        world = nodes * tasks
        assert state.stages[stage].sharding == {"replicas": nodes, "processes": tasks}
        program_stage, shard_key, done_key = RECORDS[stage]
        ranks = records(folder, program_stage)
        assert [(r["rank"], r["world_size"]) for r in ranks] == [(rank, world) for rank in range(world)]
        for r in ranks:  # Slurm's block distribution: ranks 0..tasks-1 on node1, the next on node2
            assert_ran_on(r, f"node{r['rank'] // tasks + 1}", cluster)
        # Split by RANK/WORLD_SIZE (items[rank::world]), and every item produced exactly once.
        assert [r[shard_key] for r in ranks] == [len(range(rank, total, world)) for rank in range(world)]
        assert [r[done_key] for r in ranks] == [r[shard_key] for r in ranks]
        verification = state.stages[stage].verification
        assert verification["ok"], verification
    assert tree(workspace) == tree(local.parent / ".bcp-pipeline/workspaces/demo")
    assert len(list((data / "preprocessed").glob("*.bin"))) == 2


NODE_CHAIN = (
    CHAIN_CONFIG.replace(
        "  local: {workspace_dir: ws, poll_seconds: 0.05}\n",
        "  local: {workspace_dir: ws, poll_seconds: 0.05}\n"
        "  slurm: {workspace_dir: ws, poll_seconds: 0.2, poll_max_seconds: 1}\n",
    )
    .replace('--count, "${count}", --name, first]', '--count, "${count}", --name, first, --sleep, "1.5"]')
    .replace(
        "        local: {replicas: 2, processes: 1}\n",
        "        local: {replicas: 2, processes: 1}\n        slurm: {nodes: 2, ntasks_per_node: 1}\n",
    )
    .replace(
        "        local: {replicas: 1, processes: 3}\n",
        "        local: {replicas: 1, processes: 3}\n        slurm: {nodes: 1, ntasks_per_node: 3}\n",
    )
)


def items(config: Path) -> dict[str, bytes]:
    return tree(config.parent / "ws/main")


def identities(folder: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of each item file: a rewrite (a new temporary renamed over it) changes both."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.glob("item-*.txt")}


def test_node_lost_mid_stage_then_resume_matches_a_local_run(two_node_cluster: MultiNodeCluster, tmp_path):
    cluster = two_node_cluster
    reference = write_chain_project(tmp_path / "local", NODE_CHAIN)
    assert cli(reference, "run", "chain", "--backend", "local") == 0

    config = write_chain_project(tmp_path / "slurm", NODE_CHAIN)
    first = config.parent / "ws/main/first"
    orchestrator = start_orchestrator(config, "run", "chain", "--backend", "slurm")
    # Rank 1 (node2) has written item 1 and sleeps before item 3: lose node2 now, mid-stage.
    wait_for(lambda: (first / "item-0001.txt").exists(), timeout=60, what="rank 1's first item")
    cluster.kill_node("node2")
    output, _ = orchestrator.communicate(timeout=120)
    assert orchestrator.returncode == 1, output
    state = state_of(config)
    failed_job = state.stages["first"].jobs[-1].job_id
    assert state.stages["first"].status is StageStatus.FAILED
    assert state.stages["first"].error.startswith(f"job {failed_job} ended NODE_FAIL"), state.stages["first"].error
    assert state.stages["second"].status is StageStatus.PENDING
    assert not (first / "item-0005.txt").exists()  # rank 1's shard has a hole
    done = identities(first)
    assert {"item-0000.txt", "item-0001.txt"} <= done.keys()

    cluster.restart_missing_nodes()
    assert cli(config, "resume") == 0
    # The lost job's own record, what the backend reads once Slurm has forgotten the job, never says it succeeded:
    # Slurm may kill its batch script (no record: LOST), and where srun exits 0 for the lost node's tasks, the
    # script holds every rank to the exit it recorded.
    record = config.parent / ".bcp-pipeline" / "runs" / state.run_id / "logs" / f"slurm-{failed_job}.exit"
    assert not record.exists() or record.read_text() != "0\n"
    state = state_of(config)
    assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())
    assert state.stages["first"].attempts == 2 and len(RunStore(config.parent / ".bcp-pipeline").runs()) == 1
    # Nothing finished before the loss was done again: the same files, untouched.
    assert {name: identity for name, identity in identities(first).items() if name in done} == done
    ranks = records(first, "first")
    assert [(r["rank"], r["world_size"], r["items"]) for r in ranks] == [(0, 2, 3), (1, 2, 3)]
    for r in ranks:
        assert_ran_on(r, f"node{r['rank'] + 1}", cluster)
    assert items(config) == items(reference)
    assert len(items(config)) == 6 + 6 + 3
    assert state.stages["third"].verification["ok"]


def ip_lines(*args: str) -> list[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout.splitlines()


@pytest.fixture
def short_base() -> Iterator[Path]:
    """A base folder munged accepts (tmp_path's /tmp/pytest-of-root is 0700, which munged refuses)."""
    base = Path(tempfile.mkdtemp(prefix="slurm-2n-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    script("stop", "--base", str(base), timeout=120)  # whatever the test left running
    subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_second_two_node_cluster_is_private_and_its_stale_remains_are_cleaned(short_base: Path) -> None:
    res = script("start", "--base", str(short_base), "--nodes", "2", "--cpus", "1", timeout=120)
    assert res.returncode == 0, res.stderr
    conf = short_base / "etc/slurm.conf"
    nodes = node_addresses(conf)
    namespaces = {line.split()[0] for line in ip_lines("netns", "list")}
    assert len(nodes) == 2 and all(
        ipaddress.ip_address(a) in ipaddress.ip_network("198.18.0.0/15") for a in nodes.values()
    )
    status = script("status", "--base", str(short_base)).stdout
    own = status.split("namespaces: ")[1].split()[:2]
    assert len(own) == 2 and set(own) <= namespaces
    for namespace in own:
        routes = ip_lines("-n", namespace, "route")
        assert len(routes) == 1 and not routes[0].startswith("default"), routes  # the bridge's /24 only
        assert all(len(line.split(": ")[1].split("@")[0]) <= 15 for line in ip_lines("-n", namespace, "-o", "link"))

    # A killed session: every daemon SIGKILLed, the namespaces and bridge left behind.
    pid_files = [short_base / "munge-run/munged.pid", *sorted((short_base / "run").glob("*.pid"))]
    pids = [int(p.read_text()) for p in pid_files]
    assert len(pids) == 4  # munged, slurmctld, two slurmd
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    left = script("status", "--base", str(short_base))
    assert left.returncode == 3 and " present; namespaces: " + " ".join(own) in left.stdout
    res = script("start", "--base", str(short_base), "--nodes", "2", "--cpus", "1", timeout=120)
    assert res.returncode == 0 and "left behind by an earlier cluster" in res.stderr, res.stderr
    env = {**os.environ, "SLURM_CONF": str(conf)}
    job = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--wait",
            "--nodes",
            "2",
            "--ntasks-per-node",
            "1",
            "--chdir",
            str(short_base),
            "--output",
            "job.out",
            "--wrap",
            "srun bash -c 'echo $SLURM_PROCID $(hostname) $SLURMD_NODENAME'",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert job.returncode == 0, job.stderr
    assert sorted((short_base / "job.out").read_text().splitlines()) == ["0 node1 node1", "1 node2 node2"]

    res = script("stop", "--base", str(short_base), timeout=120)
    assert res.returncode == 0 and "removed bridge" in res.stderr, res.stderr
    assert not set(own) & {line.split()[0] for line in ip_lines("netns", "list")}
    bridge = status.split("bridge ")[1].split()[0]
    assert not [line for line in ip_lines("-o", "link") if bridge in line or own[0][:-2] in line]
    assert script("status", "--base", str(short_base)).returncode == 3
