"""Checks of a Slurm cluster: partitions and their time limits against each job, `sbatch --test-only` for every
rendered script, one probe job of 2 tasks (srun's rank variables, the compute node's Python, a marker written in
the shared folder and read here), and Pyxis where a stage sets `container_image`.

The probe job is always cancelled (by its unique name, so also when the interrupt came before sbatch answered)
when the check ends, however it ends: Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import subprocess
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path

from bcp_pipeline.backends.checks import (
    CheckInput,
    CheckOutcome,
    ProbeJob,
    Row,
    different,
    ok,
    poll_until,
    removed_at_exit,
    unchecked,
)
from bcp_pipeline.backends.shared import templates
from bcp_pipeline.backends.shared.batch import paths_for
from bcp_pipeline.backends.shared.python_probe import MIN_STAGE_PYTHON, PROBE, module_names
from bcp_pipeline.backends.slurm.client import HINT
from bcp_pipeline.backends.slurm.render import shape
from bcp_pipeline.config.durations import parse_duration
from bcp_pipeline.errors import BackendCallError, CommandError
from bcp_pipeline.procs import run_command

INSTALL_COMMAND = "scripts/slurm-cluster install"  # the project's own single-node Slurm (docs/backends/slurm.md)
PROBE_TASKS = 2
PROBE_WAIT_SECONDS = 180.0  # a probe still queued after this is reported, and cancelled
PROBE_LINE = re.compile(r"^BCPP-PROBE (.*)$", re.M)
PROBE_TASK = templates.load(__package__, "probe_task.sh", one_line=True)  # each task of the probe job
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")  # `squeue -o %T` once ended


def check_slurm(ctx: CheckInput) -> CheckOutcome:
    try:
        config = run_command(["scontrol", "show", "config"], timeout=60, hint=HINT).stdout
        partitions = read_partitions()
    except CommandError as exc:
        # Nothing was learnt about a cluster, so no profile is saved: a backend would read it as this cluster's
        raise BackendCallError(
            f"check: Slurm's controller does not answer ({str(exc).splitlines()[0]}). On this "
            f'machine `{INSTALL_COMMAND}`, then `eval "$(scripts/slurm-cluster start)"`, give '
            "a single-node Slurm; elsewhere point SLURM_CONF at the cluster's slurm.conf. No "
            "profile was saved"
        ) from None
    cluster = re.search(r"^ClusterName\s*=\s*(\S+)", config, re.M)
    target = {"cluster": cluster.group(1) if cluster else "unnamed"}
    rows = [partition_row(ctx, partitions), test_only_row(ctx), pyxis_row(ctx)]
    facts: dict = {"partitions": partitions}
    notes = []
    if ctx.jobs:
        notes.append(f"probe job: {PROBE_TASKS} tasks on 1 node for a few seconds (cancelled when check ends)")
        ctx.announce(notes[-1])
        probe_rows, probe_facts = probe(ctx)
        rows += probe_rows
        facts.update(probe_facts)
    else:
        why = "--no-jobs: no probe job submitted"
        rows += [
            unchecked("srun ranks", rank_assumption(), why, "run `check` without --no-jobs"),
            unchecked("shared folder", shared_assumption(), why, "run `check` without --no-jobs"),
        ]
    return CheckOutcome(
        target=target,
        profile_parts=("slurm", target["cluster"]),
        rows=[r for r in rows if r is not None],
        facts=facts,
        notes=notes,
    )


def read_partitions() -> dict[str, dict]:
    """name -> {"default", "time_limit_s" (None: infinite), "available"} from sinfo."""
    out = run_command(["sinfo", "--noheader", "--format=%P|%l|%a"], timeout=60, hint=HINT).stdout
    partitions: dict[str, dict] = {}
    for line in out.splitlines():
        name, limit, available = (line.split("|") + ["", ""])[:3]
        default = name.endswith("*")
        partitions[name.rstrip("*")] = {
            "default": default,
            "time_limit_s": slurm_seconds(limit),
            "time_limit": limit,
            "available": available,
        }
    return partitions


def slurm_seconds(text: str) -> int | None:
    """sinfo's `%l`: `infinite`, `[D-]HH:MM:SS`, `MM:SS`, `MM`; None for no limit, -1 for what is not recognised
    (which is reported as different, never as fitting)."""
    text = text.strip()
    if text in ("infinite", "UNLIMITED"):
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not match:
        return -1
    days, a, b, c = (int(g) if g else 0 for g in match.groups())
    if match.group(4) is not None:  # [D-]HH:MM:SS
        return days * 86400 + a * 3600 + b * 60 + c
    if match.group(3) is not None:  # D-HH:MM or MM:SS
        return days * 86400 + a * 3600 + b * 60 if match.group(1) else a * 60 + b
    return days * 86400 + a * 3600 if match.group(1) else a * 60


def partition_row(ctx: CheckInput, partitions: dict[str, dict]) -> Row | None:
    assumes = "each job's partition exists, is up, and its time limit holds the job's --time"
    default = next((name for name, p in partitions.items() if p["default"]), None)
    listed = (
        ", ".join(
            f"{n}{'*' if p['default'] else ''} ({p['time_limit']}, {p['available']})" for n, p in partitions.items()
        )
        or "none"
    )
    if ctx.pipeline is None:
        return (
            ok("partitions", "the cluster has a partition", listed)
            if partitions
            else different("partitions", "the cluster has a partition", "sinfo lists none", "add a partition")
        )
    options = ctx.config.options["slurm"]
    problems = []
    for submission in ctx.submissions():
        size = shape(submission.request, options)
        name = size.partition or default
        part = partitions.get(name or "")
        where = submission.request.label
        if part is None:
            problems.append(f"{where}: partition {name or '(no default)'} does not exist")
            continue
        if part["available"] != "up":
            problems.append(f"{where}: partition {name} is {part['available']}")
        limit = part["time_limit_s"]
        wanted = parse_duration(size.time) if size.time else None
        if limit == -1:
            problems.append(f"{where}: partition {name}'s time limit {part['time_limit']!r} is not understood")
        elif limit is not None and (wanted is None or wanted > limit):
            problems.append(f"{where}: --time {size.time or '(partition default)'} over {name}'s {part['time_limit']}")
    if problems:
        return different(
            "partitions",
            assumes,
            f"{listed}; " + "; ".join(problems),
            "sbatch refuses these jobs (or they never start): set slurm.time / slurm.partition of "
            "those stages (--set STAGE.slurm.time=...)",
        )
    return ok("partitions", assumes, f"{listed}; every job fits")


def test_only_row(ctx: CheckInput) -> Row | None:
    """`sbatch --test-only` of every rendered script: Slurm's own verdict, nothing submitted."""
    assumes = "sbatch accepts every rendered script (--test-only: nothing is submitted)"
    if ctx.pipeline is None:
        return None
    refused, skipped, accepted = [], [], 0
    for submission in ctx.submissions():
        if submission.payload.get("submit_with") != "sbatch":
            skipped.append(submission.request.label)
            continue
        try:
            run_command(["sbatch", "--test-only"], input_text=submission.printable, timeout=60, hint=HINT)
            accepted += 1
        except CommandError as exc:
            first = next((line for line in exc.stderr.splitlines() if "error" in line.lower()), exc.stderr.strip())
            refused.append(f"{submission.request.label}: {first[:200]}")
    showed = (
        f"{accepted} accepted"
        + (f"; {len(refused)} refused: " + "; ".join(refused) if refused else "")
        + (f"; not tested (submitted by NeMo's launcher): {', '.join(skipped)}" if skipped else "")
    )
    if refused:
        return different(
            "sbatch --test-only",
            assumes,
            showed,
            "`run` fails at these stages: fix what sbatch names (`plan --backend slurm` prints each script)",
        )
    return ok("sbatch --test-only", assumes, showed)


def pyxis_row(ctx: CheckInput) -> Row | None:
    users = [
        name for name, stage in (ctx.pipeline.stages.items() if ctx.pipeline else []) if stage.slurm.container_image
    ]
    assumes = "srun takes --container-image (Pyxis) where a stage sets container_image"
    try:
        has = "--container-image" in run_command(["srun", "--help"], timeout=60, hint=HINT).stdout
    except CommandError as exc:
        return different("pyxis", assumes, f"srun --help failed: {str(exc)[:200]}", "is srun on PATH?")
    showed = (
        f"srun {'has' if has else 'has no'} --container-image; stages with a container: {', '.join(users) or 'none'}"
    )
    if users and not has:
        return different(
            "pyxis",
            assumes,
            showed,
            "those stages fail at srun: install Pyxis/enroot on the "
            "cluster, or drop slurm.container_image and use the nodes' Python",
        )
    return ok("pyxis", assumes, showed)


def rank_assumption() -> str:
    return (
        f"srun starts {PROBE_TASKS} tasks with SLURM_PROCID 0..{PROBE_TASKS - 1}, SLURM_NTASKS {PROBE_TASKS}, "
        "SLURM_LOCALID (the stages' RANK/WORLD_SIZE come from these)"
    )


def shared_assumption() -> str:
    return "the workspace folder and the state folder are the same files on the compute nodes as here"


def probe_script(name: str, output: Path, workspace: Path, marker: str, python: str, modules: list[str]) -> str:
    """A job of PROBE_TASKS tasks: each prints its rank variables; task 0 the Python facts and the marker."""
    task = templates.fill(
        PROBE_TASK,
        PYTHON=shlex.quote(python),
        PROBE=shlex.quote(PROBE),
        MODULES=" ".join(modules),
        WORKSPACE=shlex.quote(str(workspace)),
        MARKER=marker,
        MARKER_FILE=shlex.quote(str(workspace / marker)),
    )
    return "\n".join(
        [
            "#!/bin/bash",
            f"#SBATCH --job-name={name}",
            "#SBATCH --nodes=1",
            f"#SBATCH --ntasks={PROBE_TASKS}",
            "#SBATCH --time=5",
            f"#SBATCH --output={shlex.quote(str(output))}",
            f"#SBATCH --chdir={shlex.quote(str(output.parent))}",
            f"srun bash -c {shlex.quote(task)}",
            "",
        ]
    )


def probe(ctx: CheckInput) -> tuple[list[Row], dict]:
    options = ctx.config.options["slurm"]
    token = f"bcpp-check-{secrets.token_hex(4)}"
    folder = ctx.state_root / "checks" / "probes"
    folder.mkdir(parents=True, exist_ok=True)
    output = folder / f"{token}.out"
    if ctx.pipeline is not None:
        paths = paths_for(
            options,
            config_dir=ctx.config.file.parent.resolve(),
            stages_dir=ctx.config.stages_dir,
            run_dir=folder,
            workspace_name=ctx.pipeline.workspace.name,
            orchestrator_python=sys.executable,
        )
        workspace, python = Path(paths.workspace), paths.python or sys.executable
    else:
        workspace, python = folder, options.python or sys.executable
    marker = f".{token}"
    script = probe_script(token, output, workspace, marker, python, module_names(ctx.config.stages_dir))
    with cancelled_at_exit(token) as job:
        started = time.monotonic()
        job.id = run_command(["sbatch", "--parsable"], input_text=script, timeout=60, hint=HINT).stdout.strip()
        finished = wait_gone(job.id, PROBE_WAIT_SECONDS)
        seconds = time.monotonic() - started
    if not finished:
        why = f"job {job.id} had not ended after {PROBE_WAIT_SECONDS:.0f} s (cancelled)"
        return [
            different("srun ranks", rank_assumption(), why, "is the partition full or down? `squeue`"),
            unchecked("shared folder", shared_assumption(), why),
        ], {}
    text = output.read_text(errors="replace") if output.is_file() else ""
    rows = [ranks_row(text), shared_row(output, workspace / marker, marker), node_python_row(text, python)]
    for leftover in (workspace / marker, output):  # what they showed is in the profile now
        leftover.unlink(missing_ok=True)
    return rows, {"probe_seconds": round(seconds, 1)}


def cancelled_at_exit(name: str) -> AbstractContextManager[ProbeJob]:
    """Whatever ends the block, the job named `name` is cancelled: by id where sbatch answered, and by name too,
    for the case where the interrupt came before its answer."""

    def cancel(job: ProbeJob) -> None:
        for argv in ([["scancel", job.id]] if job.id else []) + [["scancel", f"--name={name}"]]:
            subprocess.run(argv, capture_output=True, timeout=60, check=False)

    return removed_at_exit(cancel)


def wait_gone(job_id: str, timeout: float) -> bool:
    """Until squeue no longer lists the job (it ended); False at the timeout."""

    def gone() -> bool | None:
        out = subprocess.run(
            ["squeue", "--noheader", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60
        ).stdout.strip()
        return True if not out or out in FINISHED else None

    return bool(poll_until(gone, timeout))


def ranks_row(text: str) -> Row:
    seen = []
    for line in PROBE_LINE.findall(text):
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        seen.append(fields)
    expected = {str(i) for i in range(PROBE_TASKS)}
    procids = sorted(f.get("procid", "?") for f in seen)
    showed = (
        "; ".join(
            f"procid={f.get('procid')} ntasks={f.get('ntasks')} localid={f.get('localid')} host={f.get('host')}"
            for f in sorted(seen, key=lambda f: f.get("procid", ""))
        )
        or f"no probe line in the job's output: {text.strip()[-200:]!r}"
    )
    good = (
        set(procids) == expected
        and len(procids) == PROBE_TASKS
        and all(f.get("ntasks") == str(PROBE_TASKS) for f in seen)
        and all(f.get("localid", "").isdigit() for f in seen)
    )
    if good:
        return ok("srun ranks", rank_assumption(), showed)
    return different(
        "srun ranks",
        rank_assumption(),
        showed,
        "the stages would shard wrongly (each must see its own rank): check srun's MPI/plugin settings "
        "(slurm.srun_args)",
    )


def shared_row(output: Path, marker_path: Path, marker: str) -> Row:
    seen_output = output.is_file()
    seen_marker = marker_path.is_file() and marker_path.read_text().strip() == marker
    showed = (
        f"the job's output {'is' if seen_output else 'is NOT'} here ({output.parent}); its marker "
        f"{'is' if seen_marker else 'is NOT'} here ({marker_path.parent})"
    )
    if seen_output and seen_marker:
        return ok("shared folder", shared_assumption(), showed)
    return different(
        "shared folder",
        shared_assumption(),
        showed,
        "stages' outputs and logs would be invisible here: put backends.slurm.workspace_dir and the "
        "state folder (--state-dir) on a file system every node mounts",
    )


def node_python_row(text: str, python: str) -> Row:
    assumes = f"the compute node's {python} is Python >= {'.'.join(map(str, MIN_STAGE_PYTHON))} with the stage packages"
    line = next((each for each in text.splitlines() if each.startswith("BCPP-PYTHON ")), "")
    try:
        answer = json.loads(line.split(" ", 1)[1])
        version, missing = tuple(answer["version"]), answer["missing"]
    except (IndexError, ValueError, KeyError, TypeError):
        return different(
            "node python",
            assumes,
            f"{python} on the node answered: {line[12:200] or 'nothing'}",
            "set backends.slurm.python to an interpreter every node has",
        )
    showed = f"Python {'.'.join(map(str, version))}" + (
        f"; missing {', '.join(missing)}" if missing else "; every package imports"
    )
    if version[:2] < MIN_STAGE_PYTHON or missing:
        return different(
            "node python",
            assumes,
            showed,
            "stages fail on the nodes: install the packages of "
            "stages/requirements.txt there (or use a container_image)",
        )
    return ok("node python", assumes, showed)
