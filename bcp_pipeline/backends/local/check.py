"""Checks of this machine: the interpreter the stage programs run with, disk for the declared sizes, CPU cores
against the processes a stage starts."""

from __future__ import annotations

import json
import shutil
import socket
import sys
from pathlib import Path

from bcp_pipeline.backends.checks import CheckInput, CheckOutcome, Row, different, ok, unchecked
from bcp_pipeline.backends.shared.python_probe import MIN_STAGE_PYTHON, PROBE, module_names
from bcp_pipeline.config.bounds import usable_cores
from bcp_pipeline.config.resources import LocalResources
from bcp_pipeline.errors import CommandError
from bcp_pipeline.procs import run_command

MIN_ORCHESTRATOR_PYTHON = (3, 11)  # pyproject.toml requires-python


def local_key() -> tuple[str, str]:
    return "local", socket.gethostname()


def check_local(ctx: CheckInput) -> CheckOutcome:
    options = ctx.config.options["local"]
    rows = [orchestrator_python_row(), stage_python_row(options.python or sys.executable, ctx.config.stages_dir)]
    if ctx.pipeline is not None:
        workspace = ctx.config.file.parent.resolve() / options.workspace_dir / ctx.pipeline.workspace.name
        rows.append(disk_row(ctx, workspace))
        rows.append(cpu_row(ctx))
    key = local_key()
    return CheckOutcome(target={"host": key[1]}, profile_parts=key, rows=rows, facts={"cpu_cores": usable_cores()})


def orchestrator_python_row() -> Row:
    have = ".".join(map(str, sys.version_info[:3]))
    want = ".".join(map(str, MIN_ORCHESTRATOR_PYTHON))
    assumes = f"the orchestrator runs on Python >= {want}"
    if sys.version_info[:2] >= MIN_ORCHESTRATOR_PYTHON:
        return ok("orchestrator python", assumes, f"Python {have} ({sys.executable})")
    return different(
        "orchestrator python", assumes, f"Python {have}", f"install Python {want} or newer and bcp-pipeline into it"
    )


def stage_python_row(python: str, stages_dir: Path, where: str = "here") -> Row:
    """The interpreter the stage programs run with: its version and the pinned packages they import."""
    modules = module_names(stages_dir)
    want = ".".join(map(str, MIN_STAGE_PYTHON))
    assumes = f"stage programs run with Python >= {want} and import {', '.join(modules) or 'nothing pinned'}"
    try:
        answer = json.loads(run_command([python, "-c", PROBE, *modules], timeout=60).stdout)
        version, missing = tuple(answer["version"]), list(answer["missing"])
    except (CommandError, ValueError, KeyError, TypeError) as exc:
        return different(
            "stage python",
            assumes,
            f"{python} {where} could not run: {str(exc)[:200]}",
            "set backends.<backend>.python to a Python 3.10+ interpreter",
        )
    showed = f"{python}: Python {'.'.join(map(str, version))}" + (
        f"; missing {', '.join(missing)}" if missing else "; every package imports"
    )
    if tuple(version[:2]) < MIN_STAGE_PYTHON:
        return different("stage python", assumes, showed, f"use Python {want} or newer (backends.<backend>.python)")
    if missing:
        return different(
            "stage python",
            assumes,
            showed,
            f"stages importing them fail: {python} -m pip install -r stages/requirements.txt",
        )
    return ok("stage python", assumes, showed)


def disk_row(ctx: CheckInput, workspace: Path, where: str = "this machine") -> Row:
    need, stages = ctx.declared_bytes()
    assumes = "the workspace's file system holds what the stages write"
    existing = workspace
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if not need:
        return unchecked(
            "disk",
            assumes,
            f"{_gb(free)} free at {existing}; the pipeline declares no sizes",
            "declare estimates: (compressed_bytes, text_bytes, tokens) in pipelines.yaml to check it",
        )
    showed = f"{_gb(free)} free at {existing} on {where}; the stages write about {_gb(need)} ({', '.join(stages)})"
    if free >= need:
        return ok("disk", assumes, showed)
    return different(
        "disk",
        assumes,
        showed,
        f"{_gb(need - free)} short: free space, or point the workspace "
        "(backends.<backend>.workspace_dir) at a larger file system",
    )


def cpu_row(ctx: CheckInput) -> Row:
    assert ctx.pipeline is not None
    cores = usable_cores()
    width = {name: stage.local.replicas * stage.local.processes for name, stage in ctx.pipeline.stages.items()}
    io_bound = sorted(name for name, stage in ctx.pipeline.stages.items() if stage.io_bound and width[name] > cores)
    processes, stage = max(
        ((n, name) for name, n in width.items() if not ctx.pipeline.stages[name].io_bound), default=(1, "")
    )
    assumes = (
        "each stage's processes (replicas x processes) get a core each, but for an I/O-bound stage "
        "(`io_bound: true`), whose processes mostly wait"
    )
    showed = f"{cores} usable core(s); the widest stage, {stage}, starts {processes} process(es)"
    if io_bound:
        showed += "; wider, and I/O-bound: " + ", ".join(f"{name} ({width[name]})" for name in io_bound)
    if processes <= cores:
        return ok("cpu", assumes, showed)
    return different(
        "cpu",
        assumes,
        showed,
        f"it still runs, {processes / cores:.1f} processes per core: slower "
        f"than its estimate; to fit: {fitting_sets(stage, ctx.pipeline.stages[stage].local, cores)}",
    )


def fitting_sets(stage: str, resources: LocalResources, cores: int) -> str:
    """The --set options that give `stage` at most one process per core (its replicas first, then processes)."""
    replicas = min(resources.replicas, cores)
    processes = max(1, cores // replicas)
    sets = [
        f"--set {stage}.local.{key}={value}"
        for key, value, now in (
            ("replicas", replicas, resources.replicas),
            ("processes", processes, resources.processes),
        )
        if value != now
    ]
    return " ".join(sets)


def _gb(value: float) -> str:
    return f"{value / 1e9:,.1f} GB"
