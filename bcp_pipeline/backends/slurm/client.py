"""Slurm's client commands as the backend and its check run them: the hint their failures carry, and squeue's
rows."""

from __future__ import annotations

from bcp_pipeline.backends.slurm.states import Row
from bcp_pipeline.errors import CommandError
from bcp_pipeline.procs import run_command

HINT = "is Slurm reachable from here? try `sinfo`; the cluster's slurm.conf comes from SLURM_CONF or /etc/slurm"
SQUEUE_FORMAT = "--Format=JobID:|,State:|,exit_code:|,Reason:|,NumNodes:|,Partition:|,Name:|"


def squeue(*filters: str) -> list[Row]:
    """Every job squeue lists (of all states) under `filters`; one id Slurm has forgotten is none."""
    argv = ["squeue", "--noheader", "--array", "--states=all", SQUEUE_FORMAT, *filters]
    try:
        output = run_command(argv, timeout=60, hint=HINT).stdout
    except CommandError as exc:
        if "Invalid job id" in exc.stderr:  # one id Slurm has forgotten: an error, unlike several
            return []
        raise
    rows = []
    for line in output.splitlines():
        parts = line.split("|", 6)
        if len(parts) == 7:
            job_id, state, exit_status, reason, nodes, partition = (part.strip() for part in parts[:6])
            rows.append(Row(job_id, state, exit_status, reason, nodes, partition, name=parts[6].rstrip("|").strip()))
    return rows
