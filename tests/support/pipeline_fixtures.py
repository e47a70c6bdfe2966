"""Small, honest pipelines for orchestrator tests: a stages folder with real programs and a config file.

`items.py` writes `--count` numbered files (sharded by RANK/WORLD_SIZE, atomic, skipping complete ones) and
can be told to fail or to stall through marker files in its output folder, so tests can break and repair a stage.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

ITEMS_PROGRAM = '''
"""Test stage: write --count files item-NNNN.txt into --out, sharded by rank; copy upstream contents if --in."""
import argparse, os, sys, time
from pathlib import Path
from _common import Progress, atomic_output, rank_and_world_size, shard, write_completion, fail_with_items

parser = argparse.ArgumentParser()
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("--count", type=int, required=True)
parser.add_argument("--name", default="items")
parser.add_argument("--sleep", type=float, default=0.0)
args = parser.parse_args()
rank, world = rank_and_world_size()
args.out.mkdir(parents=True, exist_ok=True)
mine = shard([f"item-{i:04d}.txt" for i in range(args.count)], rank, world)
progress = Progress(len(mine), rank, interval=0.0)
failures = {}
for name in mine:
    if (args.out / f"FAIL-{name}").exists():
        failures[name] = "told to fail by a FAIL- marker"
        continue
    target = args.out / name
    if not target.exists():
        while (args.out / "STALL").exists():
            time.sleep(0.05)
        time.sleep(args.sleep)
        with atomic_output(target, "w") as handle:
            handle.write(f"{name} by rank {rank} of {world}\\n")
    progress.advance()
if failures:
    sys.exit(fail_with_items(args.name, failures))
write_completion(args.out, args.name, rank, world, {"items": len(mine)})
'''


# What stages/_common.py imports: without them the copied _common.py cannot be imported.
COMMON_PARTS = ("_stage_error.py", "_ranks.py", "_atomic_outputs.py", "_progress_lines.py", "_completion.py")


def without_training(stages: dict) -> dict:
    """The demo's stages without its pretrain and every stage that needs it (export, evaluate): its data stages,
    which the backends' end-to-end tests compare with the local run's."""
    gone = {"pretrain"}
    grew = True
    while grew:
        grew = False
        for name, stage in stages.items():
            needed = {need if isinstance(need, str) else need.get("stage") for need in stage.get("needs") or []}
            if name not in gone and needed & gone:
                gone.add(name)
                grew = True
    for name in gone:
        stages.pop(name, None)
    return stages


def make_stages_dir(root: Path) -> Path:
    """A stages folder with the real _common.py (and the modules it re-exports), verify.py and job bootstrap plus
    the test program items.py."""
    stages = root / "stages"
    stages.mkdir(parents=True, exist_ok=True)
    for name in (
        "_common.py",
        *COMMON_PARTS,
        "verify.py",
        "_bridge_tracker.py",
        "bootstrap.sh",
        "requirements.txt",
        "requirements-nodeps.txt",
    ):
        shutil.copy(REPO / "stages" / name, stages / name)
    (stages / "items.py").write_text(textwrap.dedent(ITEMS_PROGRAM))
    return stages


CHAIN_CONFIG = """\
version: 1
stages_dir: stages
backends:
  local: {workspace_dir: ws, poll_seconds: 0.05}
pipelines:
  chain:
    description: three stages in a row
    workspace: {name: main, mount: /mount_workspace}
    vars: {count: "6"}
    stages:
      first:
        program: items.py
        args: [--out, "${workspace}/first", --count, "${count}", --name, first]
        local: {replicas: 2, processes: 1}
        verify:
          - {glob: "${workspace}/first/item-*.txt", expect: "${count}"}
      second:
        program: items.py
        args: [--out, "${workspace}/second", --count, "${count}", --name, second, --sleep, "0.05"]
        needs: [first]
        local: {replicas: 1, processes: 3}
        verify:
          - {glob: "${workspace}/second/item-*.txt", expect_from: first}
      third:
        program: items.py
        args: [--out, "${workspace}/third", --count, "3", --name, third]
        needs: [second]
        verify:
          - {glob: "${workspace}/third/item-*.txt", expect_from: second, group: 2}
"""


def stall_stage(workspace: Path, stage: str) -> Path:
    """Hold the chain's `stage`: items.py waits before each item while WORKSPACE/STAGE/STALL exists. Returns the
    marker; unlink it to let the stage go on. `workspace` is the pipeline's workspace folder (ws/main locally)."""
    marker = workspace / stage / "STALL"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return marker


def write_chain_project(root: Path, config_text: str = CHAIN_CONFIG) -> Path:
    """A project folder (stages/ + pipelines.yaml) for the `chain` pipeline; returns the config path."""
    make_stages_dir(root)
    config = root / "pipelines.yaml"
    config.write_text(config_text)
    return config


# The chain pipeline on the other backends, with the same sharding as on local (so its items are byte-identical).
BCP_SECTIONS = """\
    defaults:
      bcp: {image: "nvcr.io/nvaie/nemo-framework-training:23.11", instance: dgxa100.80g.8.norm, total_runtime: 1h,
            workspaces: [{name: main, mount: /mount_workspace, mode: RW}]}
    verification:
      bcp: {instance: dgxa100.80g.1.norm, workspaces: [{name: main, mount: /mount_workspace, mode: RO}]}
"""


def bcp_chain_config(transport: str) -> str:
    text = CHAIN_CONFIG.replace(
        "  local: {workspace_dir: ws, poll_seconds: 0.05}\n",
        "  local: {workspace_dir: ws, poll_seconds: 0.05}\n"
        f"  bcp: {{transport: {transport}, poll_min_seconds: 0.1, poll_max_seconds: 0.3}}\n",
    )
    text = text.replace('    vars: {count: "6"}\n', '    vars: {count: "6"}\n' + BCP_SECTIONS)
    # The bcp sharding mirrors the local one: 2 replicas x 1 process, then 1 x 3 (under bcprun).
    text = text.replace(
        "local: {replicas: 2, processes: 1}",
        "local: {replicas: 2, processes: 1}\n        bcp: {replicas: 2, processes: 1}",
    )
    return text.replace(
        "local: {replicas: 1, processes: 3}",
        "local: {replicas: 1, processes: 3}\n        bcp: {replicas: 1, processes: 3}",
    )


# On Slurm, in a workspace whose path holds spaces, quotes and ';'.
SLURM_WORKSPACE_DIR = "ws dir/it's;odd"
SLURM_CHAIN = (
    CHAIN_CONFIG.replace(
        "  local: {workspace_dir: ws, poll_seconds: 0.05}\n",
        "  local: {workspace_dir: ws, poll_seconds: 0.05}\n"
        f'  slurm: {{workspace_dir: "{SLURM_WORKSPACE_DIR}", poll_seconds: 0.2, '
        "poll_max_seconds: 1}\n",
    )
    .replace(
        "        local: {replicas: 2, processes: 1}\n",
        "        local: {replicas: 2, processes: 1}\n        slurm: {ntasks_per_node: 2}\n",
    )
    .replace(
        "        local: {replicas: 1, processes: 3}\n",
        "        local: {replicas: 1, processes: 3}\n        slurm: {ntasks_per_node: 3}\n",
    )
)

# On Grid Engine, the first stage as an array job of 2 tasks (one a host), each item taking 2 s.
GE_CHAIN = (
    CHAIN_CONFIG.replace(
        "  local: {workspace_dir: ws, poll_seconds: 0.05}\n",
        "  local: {workspace_dir: ws, poll_seconds: 0.05}\n"
        "  gridengine: {workspace_dir: ws, poll_seconds: 0.3, poll_max_seconds: 1, "
        "accounting_grace_seconds: 3}\n",
    )
    .replace('--count, "${count}", --name, first]', '--count, "${count}", --name, first, --sleep, "2"]')
    .replace(
        "        local: {replicas: 2, processes: 1}\n",
        "        local: {replicas: 2, processes: 1}\n        gridengine: {nodes: 2}\n",
    )
    .replace(
        "        local: {replicas: 1, processes: 3}\n",
        "        local: {replicas: 1, processes: 3}\n        gridengine: {processes_per_node: 3}\n",
    )
)

# On Kubernetes, the first stage as 2 pods of one process (over both nodes of the test cluster).
K8S_CHAIN = CHAIN_CONFIG.replace(
    "        local: {replicas: 2, processes: 1}\n",
    "        local: {replicas: 2, processes: 1}\n        kubernetes: {replicas: 2, processes: 1}\n",
).replace(
    "        local: {replicas: 1, processes: 3}\n",
    "        local: {replicas: 1, processes: 3}\n        kubernetes: {replicas: 1, processes: 3}\n",
)

# The demo's data stages spread over two hosts (Grid Engine array tasks) or nodes (Kubernetes pods): (array tasks or
# pods, ranks in each). download puts two ranks in each.
DEMO_SPREAD = {"download": (2, 2), "extract": (2, 1), "concat": (2, 1), "tokenize-preprocess": (2, 1)}
GE_OPTIONS = {"poll_seconds": 0.3, "poll_max_seconds": 1.0, "accounting_grace_seconds": 3}

# A stand-in trainer for the continuation tests: each job advances the checkpoint folder by ADVANCE steps.
TRAINER = """
import sys, os, re
from pathlib import Path
folder, advance, target = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
folder.mkdir(parents=True, exist_ok=True)
steps = max([int(m.group(1)) for p in folder.iterdir() if (m := re.search(r"step=(\\d+)", p.name))], default=0)
new = min(steps + advance, target)
(folder / f"step={new:06d}-last.pt").write_text("weights")
if steps:
    (folder / f"step={steps:06d}-last.pt").rename(folder / f"step={steps:06d}.pt")
print(f"trained from step {steps} to {new}")
"""


# A stand-in trainer that hangs (the stall guard's tests), arguments CHECKPOINTS TARGET STALL_AT [STEP_SECONDS]: prints
# the smoke pretrain's step lines and writes a `step=N` checkpoint a step; while the `stalls` file beside the
# checkpoint folder counts above 0, an attempt stops after STALL_AT steps of its own (0: before its first step, as
# a multi-node job hanging in its first collective) and sleeps, as a hung collective does, until it is killed.
STALLING_TRAINER = """
import re, sys, time
from pathlib import Path
folder, target, stall_at = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
step_seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 0.05
folder.mkdir(parents=True, exist_ok=True)
stalls = folder.parent / "stalls"
left = int(stalls.read_text()) if stalls.is_file() else 0
start = max([int(m.group(1)) for p in folder.iterdir() if (m := re.search(r"step=(\\d+)", p.name))], default=0)
print(f"starting at step {start} of {target}", flush=True)
for step in range(start + 1, target + 1):
    if left > 0 and step == start + 1 + stall_at:
        stalls.write_text(str(left - 1))
        print(f"rank 0: waiting in all_reduce after step {step - 1} (HF_TOKEN=hf_secretvalue123)", flush=True)
        time.sleep(3600)
    time.sleep(step_seconds)
    print(f"step {step}/{target} loss {10 - step * 0.1:.4f} lr 1.000e-03 20.00 steps/s", flush=True)
    (folder / f"step={step:06d}.pt").write_text("weights")
if left > 0 and start + stall_at >= target:  # hangs at its end, its last checkpoint written (a process group's exit)
    stalls.write_text(str(left - 1))
    print("rank 0: waiting in destroy_process_group", flush=True)
    time.sleep(3600)
"""


def sigint_as_from_a_terminal() -> None:
    """`preexec_fn` of a subprocess a test interrupts with SIGINT (Ctrl-C): its default action, whatever pytest
    inherited. A non-interactive shell starts `pytest ... &` with SIGINT ignored, and an ignored signal stays
    ignored across fork and exec, so without this such a run's Ctrl-C tests would wait for an exit that never
    comes."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_orchestrator(config: Path, *args: str) -> subprocess.Popen:
    """`bcp-pipeline --config CONFIG ARGS` as a real subprocess (so a test can SIGKILL it, or SIGINT it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "bcp_pipeline", "--config", str(config), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=sigint_as_from_a_terminal,
    )


def stage_status(run_dir: Path, stage: str) -> str | None:
    """A stage's status in the run's state.json, or None while that file is not (wholly) written yet."""
    try:
        return json.loads((run_dir / "state.json").read_text())["stages"][stage]["status"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    """Poll `predicate` until it returns something true; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def logs_and_status(config: Path, run_id: str, stage: str, capsys) -> tuple[str, str]:
    """What `logs RUN STAGE` and `status RUN` print for a finished run (each must exit 0), through the CLI in-process:
    how a test sees what a user sees of a training's steps and loss."""
    from bcp_pipeline.cli.main import main  # noqa: PLC0415 (this module's pipelines need no CLI otherwise)

    capsys.readouterr()
    assert main(["--config", str(config), "logs", run_id, stage]) == 0
    log = capsys.readouterr().out
    assert main(["--config", str(config), "status", run_id]) == 0
    return log, capsys.readouterr().out
