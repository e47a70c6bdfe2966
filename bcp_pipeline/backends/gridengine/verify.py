"""`check`'s verdict on every rendered job script: would the cell take each job as `run` submits it.

On a stock cell, `qsub -w v` (verify: nothing submitted) is Grid Engine's own answer. A cell with a server-side
JSV (`jsv_url` in its global configuration: TSUBAME4's turns `-l node_f=N` into N whole hosts) changes each job
after `qsub -w v` has looked at it: there `-l node_f=2` reads as two node_f of one host, which no host offers, and
a job the JSV refuses passes. So on such a cell each job's `#$` lines are submitted with `true` for a body and a
start a day ahead (`qsub -a`): the JSV accepts, changes or refuses it as it will the real job, `qalter -w v`
verifies the job as changed, and it is deleted at once (a job deleted while pending leaves no accounting record;
one left behind would run `true`). `check --no-jobs` submits nothing, and says the row is not checked there.
"""

from __future__ import annotations

import re
import subprocess
import time

from bcp_pipeline.backends.checks import CheckInput, Row, different, ok, unchecked
from bcp_pipeline.backends.gridengine.client import HINT
from bcp_pipeline.backends.gridengine.render import qsub_argv
from bcp_pipeline.config.resources import GridEngineOptions
from bcp_pipeline.errors import CommandError
from bcp_pipeline.procs import run_command

TOPIC = "qsub -w v"
START_AHEAD_S = 24 * 3600  # the verified job's start (`qsub -a`): never reached, as it is deleted at once
AS_WRITTEN = "qsub accepts every rendered job script (`qsub -w v`: verified, nothing submitted)"
THROUGH_JSV = (
    "the cell's JSV accepts every rendered job and Grid Engine can place it as the JSV changed it (each "
    "job's `#$` lines submitted to start a day later, `qalter -w v`, deleted at once)"
)


def server_jsv() -> str | None:
    """The cell's server-side JSV (`jsv_url` of `qconf -sconf`), None where it has none or qconf cannot say."""
    try:
        text = run_command(["qconf", "-sconf"], timeout=60, hint=HINT).stdout
    except CommandError:
        return None
    found = re.search(r"^jsv_url\s+(\S+)", text, re.MULTILINE)
    return found.group(1) if found and found.group(1).lower() != "none" else None


def verify_row(ctx: CheckInput) -> Row | None:
    """Every rendered script verified as the cell will take it (see the module's docstring)."""
    if ctx.pipeline is None:
        return None
    options = ctx.config.options["gridengine"]
    jsv = server_jsv()
    if jsv and not ctx.jobs:
        return unchecked(
            TOPIC,
            THROUGH_JSV,
            f"--no-jobs: the cell's server-side JSV ({jsv}) changes each job after "
            "`qsub -w v` has looked at it, so only a submitted job shows what it makes of it",
        )
    refused, accepted = [], 0
    for submission in ctx.submissions():
        problem = (through_jsv if jsv else as_written)(options, submission.printable)
        if problem is None:
            accepted += 1
        else:
            refused.append(f"{submission.request.label}: {problem[:200]}")
    assumes = THROUGH_JSV if jsv else AS_WRITTEN
    showed = (
        f"{accepted} accepted"
        + (f"; {len(refused)} refused: " + "; ".join(refused) if refused else "")
        + (f" (through the cell's JSV, {jsv})" if jsv else "")
    )
    if refused:
        return different(
            TOPIC,
            assumes,
            showed,
            "`run` fails at these stages: fix the resource, parallel "
            "environment or queue qsub names (`qconf -sc`, `qconf -spl`, `qconf -sql` list what the "
            "cell has; `plan --backend gridengine` prints each script)",
        )
    return ok(TOPIC, assumes, showed)


def said(exc: CommandError) -> str:
    return " ".join(line for line in exc.stderr.splitlines() if line.strip() and line != "Exiting.")


def as_written(options: GridEngineOptions, script: str) -> str | None:
    """What `qsub -w v` refuses in the script (None: accepted)."""
    try:
        run_command(qsub_argv(options, "-w", "v"), input_text=script, timeout=60, hint=HINT)
    except CommandError as exc:
        return said(exc)
    return None


def through_jsv(options: GridEngineOptions, script: str) -> str | None:
    """What the JSV or `qalter -w v` refuses of the script's requests, submitted as a job that runs `true` a day
    from now and is deleted at once (None: accepted and placeable)."""
    requests = [line for line in script.splitlines() if line.startswith(("#!", "#$"))]
    start = time.strftime("%Y%m%d%H%M", time.localtime(time.time() + START_AHEAD_S))
    try:
        output = run_command(
            qsub_argv(options, "-terse", "-a", start),
            input_text="\n".join([*requests, "true", ""]),
            timeout=60,
            hint=HINT,
        ).stdout
    except CommandError as exc:
        return said(exc)
    job_id = output.strip().splitlines()[-1].split(".")[0] if output.strip() else ""
    if not job_id.isdigit():
        return f"`qsub -terse` printed no job id: {output[:200]!r}"
    try:
        run_command(["qalter", "-w", "v", job_id], timeout=60, hint=HINT)
    except CommandError as exc:
        return said(exc)
    finally:
        subprocess.run(["qdel", job_id], capture_output=True, timeout=60, check=False)
    return None
