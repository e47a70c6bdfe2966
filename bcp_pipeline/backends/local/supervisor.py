"""The detached supervisor of one local job: starts replicas x processes ranks the way bcprun would.

Started by the local backend as `python -m bcp_pipeline.backends.local.supervisor JOB_DIR` in a new session, so
it outlives the orchestrator (SIGKILL, Ctrl-C) like a BCP job outlives the user's laptop. It reads `spec.json`,
writes `status.json` atomically (starting -> running -> succeeded | failed | cancelled) and each rank's stdout and
stderr to its own log file. Every rank
runs to its end even if another fails, so a rerun has the least left to redo; but a rank killed by a signal gets
the others stopped after a grace (wait_for_ranks), since they may wait for it forever.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bcp_pipeline.atomic import atomic_write_json
from bcp_pipeline.procs import die_with_parent, process_start_ticks

# After a rank is killed by a signal, how long the others may go on before they are stopped: long enough for a
# training rank to see its collective fail and say so (tests/e2e/test_pretrain_backends.py waits 8 s for a dead peer).
LOST_RANK_GRACE_SECONDS = 20.0
STOP_GRACE_SECONDS = 10.0  # between SIGTERM and SIGKILL when ranks are stopped
POLL_SECONDS = 0.2  # how often the supervisor looks at its ranks
FULL_DISK_RETRY_SECONDS = 2.0  # how often a status that found its disk full is written again
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


def rank_environment(
    base: dict[str, str], replica: int, local_rank: int, replicas: int, processes: int, port: int
) -> dict[str, str]:
    """The variables bcprun sets for one process (torchrun-style ranks plus NGC's node-level ones)."""
    return {
        **base,
        "RANK": str(replica * processes + local_rank),
        "WORLD_SIZE": str(replicas * processes),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(processes),
        "NODE_RANK": str(replica),
        "GROUP_RANK": str(replica),
        "NGC_ARRAY_INDEX": str(replica),
        "NGC_ARRAY_SIZE": str(replicas),
        "NGC_REPLICA_ID": str(replica),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def supervise(job_dir: Path) -> int:
    spec = json.loads((job_dir / "spec.json").read_text())
    log_dir = Path(spec["log_dir"])
    log_dir.mkdir(parents=True, exist_ok=True)
    status_path = job_dir / "status.json"
    me = {"pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid())}
    children: list[subprocess.Popen] = []

    def on_cancel(signum: int, _frame: object) -> None:
        stop_ranks(children)
        atomic_write_json(
            status_path,
            {
                **me,
                "state": "cancelled",
                "signal": signum,
                "ended_at": time.time(),
                "exit_codes": [c.returncode for c in children],
            },
        )
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_cancel)
    signal.signal(signal.SIGINT, on_cancel)
    started_at = time.time()
    # "starting" until every rank has started (the pids recorded meanwhile), then "running".
    write_status(status_path, {**me, "state": "starting", "started_at": started_at})

    def record(ranks: list[dict], state: str = "starting") -> None:
        write_status(status_path, {**me, "state": state, "started_at": started_at, "ranks": ranks})

    start_ranks(spec, log_dir, children, record)
    # The rank pids go into the job's record: a rank that outlives a killed supervisor is still this job's, and
    # `status`, `cancel` and the chaos checks (tests/chaos_backends.py) must be able to see it.
    ranks = [{"pid": child.pid, "start_ticks": process_start_ticks(child.pid)} for child in children]
    record(ranks, "running")
    lost = wait_for_ranks(children, spec.get("lost_rank_grace_seconds", LOST_RANK_GRACE_SECONDS))
    exit_codes = [child.returncode for child in children]
    state = "succeeded" if all(code == 0 for code in exit_codes) else "failed"
    write_status(
        status_path,
        {
            **me,
            "state": state,
            "started_at": started_at,
            "ranks": ranks,
            "exit_codes": exit_codes,
            "ended_at": time.time(),
            **({"lost_rank": lost} if lost else {}),
        },
    )
    return 0


def write_status(path: Path, payload: dict) -> None:
    """The job's status, written again every few seconds while its disk is full (the run's state folder): a
    supervisor that died of it left a job "lost" that failed its stage once there was room again, where its
    ranks may well have finished. Alive, it is a job still running, and its result lands once there is room."""
    while True:
        try:
            atomic_write_json(path, payload)
            return
        except OSError as exc:
            if exc.errno not in FULL_DISK:
                raise
        time.sleep(FULL_DISK_RETRY_SECONDS)


def start_ranks(
    spec: dict, log_dir: Path, children: list[subprocess.Popen], record: Callable[[list[dict]], None]
) -> None:
    """Start the job's ranks into `children`, recording their pids as they start (`record`, at most every
    POLL_SECONDS).

    It goes on when the orchestrator that submitted the job dies meanwhile: a submitted job outlives its
    orchestrator, as a BCP job outlives the laptop that submitted it, and `resume` re-attaches to it; stopping
    half-way would leave a lost job that fails its stage on resume. The count it starts is bounded at load
    (config/bounds.py: issue 50 saw 1,130 processes forked from an unbounded one).
    """
    replicas, processes = spec["replicas"], spec["processes"]
    base_env = {**os.environ, **spec["env"]}
    recorded_at = time.monotonic()
    for replica in range(replicas):
        for local_rank in range(processes):
            rank = replica * processes + local_rank
            log = open(log_dir / f"rank-{rank:05d}.log", "ab")
            env = rank_environment(base_env, replica, local_rank, replicas, processes, spec["master_port"])
            # A rank dies with its supervisor: killed before it recorded its ranks, it would otherwise leave ranks
            # no record names, still writing the stage's files beside its next job (tests/chaos).
            children.append(
                subprocess.Popen(
                    spec["argv"],
                    env=env,
                    cwd=spec["cwd"],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=die_with_parent(os.getpid()),
                )
            )
            log.close()
            if time.monotonic() - recorded_at >= POLL_SECONDS:
                record([{"pid": child.pid, "start_ticks": process_start_ticks(child.pid)} for child in children])
                recorded_at = time.monotonic()


def wait_for_ranks(children: list[subprocess.Popen], grace: float) -> dict | None:
    """Wait until every rank has ended; returns what was done when one was killed by a signal, else None.

    A rank that exits, even failing, has said what it could not do, and the others run to their end so a rerun
    has the least left to redo. A rank killed by a signal (the OOM killer, a stray kill, tests/chaos) said
    nothing, and the others may wait for it for ever: ranks but 0 wait for rank 0's output digest
    (stages/_completion.py) and training ranks for their collectives. They get `grace` seconds to end on their
    own (and say why), then are stopped, so the job fails and the stage's next job redoes what is missing (found
    by tests/chaos: a download job whose rank 0 was killed at its start stayed running for 30 minutes).
    """
    deadline = None
    while any(child.poll() is None for child in children):
        killed = [rank for rank, child in enumerate(children) if (child.returncode or 0) < 0]
        if killed and deadline is None:
            deadline = time.monotonic() + grace
        if deadline is not None and time.monotonic() >= deadline:
            stopped = [rank for rank, child in enumerate(children) if child.poll() is None]
            stop_ranks(children)
            return {
                "rank": killed[0],
                "signal": -children[killed[0]].returncode,
                "stopped": stopped,
                "grace_seconds": grace,
            }
        time.sleep(POLL_SECONDS)
    return None


def stop_ranks(children: list[subprocess.Popen]) -> None:
    """SIGTERM the ranks still running, SIGKILL those still there after STOP_GRACE_SECONDS; all are reaped."""
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)  # reaped, so its exit code is recorded (else it stays None)


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
