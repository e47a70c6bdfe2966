"""The conventions every stage program follows, in one import, plus the argument helpers their command lines share.

Stage programs run in the NeMo container on BCP, under srun on Slurm and as plain processes locally, so these
modules use the standard library only and nothing from `bcp_pipeline/`. They fix the conventions the
orchestrator relies on (docs/CONVENTIONS.md), each in a module of its own, all re-exported here:

* shard assignment (`_ranks`): `items[rank::world_size]` over a sorted listing, so every rank agrees whenever it
  starts; the rendezvous of a job's ranks;
* atomic outputs (`_atomic_outputs`): write `.NAME.tmp-PID` in the same folder, fsync, rename, fsync the folder;
* completion markers (`_completion`): a per-rank completion record, written last (datatrove's convention), and the
  output digest a folder's outputs were made under;
* machine-readable lines on stdout (`_progress_lines`), prefixed with `##bcp-pipeline `, that the orchestrator
  parses: `##bcp-pipeline progress {"done": 3, "total": 40, "rank": 0}`, `##bcp-pipeline verify {...}`, and
  `##bcp-pipeline summary {"text": "..."}` (one line about the result, shown when the stage succeeds).
"""

from __future__ import annotations

import argparse
import os

# Re-exported: stage programs and docs/CONVENTIONS.md name them `_common.NAME`.
from _atomic_outputs import (
    OUT_OF_SPACE,
    atomic_output,
    atomic_write_json,
    error_naming,
    fsync_dir,
    remove_stale_temporaries,
    remove_stale_temporaries_of,
    start_writeback,
    temp_path_for,
)
from _completion import (
    CLAIMED,
    COMPLETIONS_DIR,
    DIGEST_WAIT_SECONDS,
    OTHER_OUTPUTS_ENV,
    OUTPUT_DIGEST_ENV,
    STARTED_AT,
    claim_or_refuse,
    claim_outputs,
    completion_path,
    ipv4_addresses,
    ran_on,
    write_completion,
)
from _progress_lines import LINE_PREFIX, Progress, emit, fail_with_items
from _ranks import (
    DEFAULT_MASTER_PORT,
    Rendezvous,
    expand_hostlist,
    first_slurm_host,
    rank_and_world_size,
    rendezvous,
    shard,
)
from _stage_error import StageError

__all__ = [  # what `_common.NAME` offers: the names above, and the helpers below
    "CLAIMED",
    "COMPLETIONS_DIR",
    "DEFAULT_MASTER_PORT",
    "DIGEST_WAIT_SECONDS",
    "LINE_PREFIX",
    "OTHER_OUTPUTS_ENV",
    "OUTPUT_DIGEST_ENV",
    "OUT_OF_SPACE",
    "STARTED_AT",
    "Progress",
    "Rendezvous",
    "StageError",
    "atomic_output",
    "atomic_write_json",
    "claim_or_refuse",
    "claim_outputs",
    "completion_path",
    "emit",
    "error_naming",
    "expand_hostlist",
    "fail_with_items",
    "first_slurm_host",
    "fsync_dir",
    "ipv4_addresses",
    "positive_int",
    "ran_on",
    "rank_and_world_size",
    "remove_stale_temporaries",
    "remove_stale_temporaries_of",
    "rendezvous",
    "shard",
    "start_writeback",
    "temp_path_for",
    "usable_cpus",
    "write_completion",
]


def positive_int(text: str) -> int:
    """argparse type for counts: a whole number >= 1, else a clear usage error."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def usable_cpus() -> int:
    """The CPUs this process may use (Slurm and containers restrict affinity), not the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (not Linux)
        return max(1, os.cpu_count() or 1)
