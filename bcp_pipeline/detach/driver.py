"""The orchestrator as a BCP job: what `run --detach` submits. Runs inside the job as

    cd ROOT/.bcp-pipeline/runs/RUN/driver && python3 -m bcp_pipeline.detach.driver --workspace-root ROOT --run RUN ...

where ROOT is the pipeline's workspace mount and the folder holds what the laptop uploaded (this package, stages/
and pipelines.yaml). The run state lives beside it in the workspace (`ROOT/.bcp-pipeline/runs/RUN/state.json`);
every save is also printed to the job log as one `BCPP-STATE {...}` line, which is how `status` on the laptop
reads it. The NGC API key arrives only as the BCP secret the job names (NGC_CLI_API_KEY in the environment).

One driver at a time: a new one takes the lease file (`driver.lease` in the run folder) only once the job holding
it has ended. Shortly before its own --total-runtime ends, a driver submits its successor and exits.

Until it has checked the image (ngcsdk, PyYAML, tenacity), this module uses nothing outside the standard library:
a driver that cannot work fails at once, with a `BCPP-ERROR` line that `status` shows on the laptop.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

from bcp_pipeline.config.durations import format_elapsed
from bcp_pipeline.detach.protocol import (
    DRIVER_FOLDER,
    ERROR_PREFIX,
    MAX_LINE_BYTES,
    capped,
    snapshot_lines,
    submitted_lines,
    workspace_state_root,
)
from bcp_pipeline.engine.state import RunState, RunStore
from bcp_pipeline.errors import BackendCallError, PipelineError, StateError, is_refused_credentials

EXIT_MISSING_SOFTWARE = 3
SDK_REQUIREMENT = "ngcsdk==4.19.1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bcp_pipeline.detach.driver",
        description="the bcp-pipeline orchestrator inside a BCP job (run --detach)",
    )
    parser.add_argument("--workspace-root", required=True, type=Path, help="where the pipeline workspace is mounted")
    parser.add_argument("--run", required=True, help="run id")
    parser.add_argument(
        "--hand-over-after",
        type=float,
        required=True,
        help="seconds after start to submit the successor driver and exit",
    )
    parser.add_argument("--install", action="store_true", help="pip install what the image lacks")
    args = parser.parse_args(argv)
    started = time.monotonic()
    sys.stdout = CappedLines(sys.stdout)  # the job log: no line over MAX_LINE_BYTES, whatever is printed
    missing = ensure_software(install=args.install)
    if missing:
        return fail(missing, EXIT_MISSING_SOFTWARE)
    try:
        return drive_detached(args.workspace_root, args.run, deadline=started + args.hand_over_after)
    except PipelineError as exc:
        return fail(str(exc), exc.exit_code)


def fail(message: str, code: int) -> int:
    print(capped(ERROR_PREFIX + " ".join(message.split()))[0], flush=True)  # one line: the laptop reads one
    return code


def ensure_software(*, install: bool) -> str | None:
    """None when ngcsdk and PyYAML import (after installing them when allowed); else why not, in words."""
    wanted = {"ngcsdk": SDK_REQUIREMENT, "yaml": "pyyaml", "tenacity": "tenacity>=8.2"}  # tenacity: retries.py
    missing = [requirement for module, requirement in wanted.items() if importlib.util.find_spec(module) is None]
    if not missing:
        return None
    python = sys.executable
    if not install:
        return (
            f"the driver's image lacks {', '.join(missing)} for {python}, and backends.bcp.driver.install_ngcsdk "
            "is false: use an image that has them, or allow the install"
        )
    print(f"installing {' '.join(missing)} into {python}", flush=True)
    result = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", *missing], capture_output=True, text=True, check=False
    )
    importlib.invalidate_caches()
    if result.returncode != 0 or any(importlib.util.find_spec(m) is None for m in wanted):
        reason = " ".join((result.stderr or result.stdout).split())[-500:] or f"exit {result.returncode}"
        return (
            f"the driver's image lacks {', '.join(missing)} for {python}, and `pip install` of them failed "
            f"({reason}): use an image that has them (backends.bcp.driver.image) or one with pip and network"
        )
    return None


def handover_line(own_id: str, run_id: str, pipeline: str, left: float, used: float, now: float) -> str:
    """The driver log's first line: when the driver hands the run to its successor, as a duration and the UTC time
    (`hand-over in 4d23h, at 2026-12-06 21:30 UTC`), and the runtime its job spent before this start."""
    at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(now + left))
    return f"driver job {own_id}: driving run {run_id} ({pipeline}); hand-over in {format_elapsed(left)}, at {at}" + (
        f" ({format_elapsed(used)} of its runtime spent before this start)" if used else ""
    )


def drive_detached(root: Path, run_id: str, *, deadline: float) -> int:
    """Take the lease, drive the run from the workspace state, hand over before the deadline: the exit status."""
    # pylint: disable=import-outside-toplevel  (these need PyYAML, checked by now)
    from bcp_pipeline.backends.bcp.backend import BcpBackend
    from bcp_pipeline.backends.retries import with_retries
    from bcp_pipeline.config.preflight import load_and_check
    from bcp_pipeline.detach.jobs import Lease, runtime_used
    from bcp_pipeline.engine.orchestrator import Orchestrator
    from bcp_pipeline.engine.selection import resume_selection
    from bcp_pipeline.report.text import Reporter

    own_id = os.environ.get("NGC_JOB_ID", "")
    if not own_id:
        raise StateError(
            "NGC_JOB_ID is not set: bcp_pipeline.detach.driver runs only inside a BCP job (`run --detach`)"
        )
    store = SnapshotStore(workspace_state_root(root))
    state = store.load(run_id)
    config_file = store.run_dir(run_id) / DRIVER_FOLDER / "pipelines.yaml"
    config = load_and_check(config_file, overrides=state.overrides, pipeline=state.pipeline)
    pipeline = config.pipeline(state.pipeline)
    options = config.options["bcp"]
    options.transport = "sdk"  # the ngc CLI is not in the images; ngcsdk is
    backend = BcpBackend(
        options,
        pipeline=pipeline,
        config_dir=config.file.parent,
        stages_dir=config.stages_dir,
        run_dir=store.run_dir(run_id),
        workspace_name=pipeline.workspace.name,
        mounted_workspace=root,
    )
    check_credentials(backend, run_id, options.driver)
    # --total-runtime bounds the job's cumulative RUNNING time: a driver resumed after a preemption has less left
    # than its own process has lived. What BCP counts, not our clock, says how much is spent.
    used = runtime_used(
        with_retries(
            lambda: backend.transport.job(own_id), f"looking up its own job {own_id}", backend.retry_policy, log=say
        )
    )
    deadline -= used
    lease = Lease(store.run_dir(run_id) / "driver.lease", own_id)
    lease.take(backend, deadline)
    state = store.load(run_id)  # again: the driver before this one may have saved until its job ended
    print(
        handover_line(own_id, run_id, pipeline.name, max(0.0, deadline - time.monotonic()), used, time.time()),
        flush=True,
    )
    selected = resume_selection(state, pipeline)
    terms = record_term(state, own_id)
    store.save(state)
    orchestrator = Orchestrator(
        pipeline=pipeline,
        backend=backend,
        store=store,
        state=state,
        progress=Reporter(),
        selected=selected,
        should_stop=lambda: time.monotonic() >= deadline,
    )
    try:
        ok = orchestrator.drive()
    finally:
        terms[-1]["until"] = time.time()
        store.save(state)
    if orchestrator.stopped:
        successor, submitted = hand_over(backend, config, pipeline, run_id, own_id, dict(os.environ))
        if submitted:
            print(f"driver job {own_id}: runtime nearly spent; successor driver job {successor} takes over", flush=True)
        else:
            print(f"driver job {own_id}: job {successor} already takes over; exiting", flush=True)
        return 0
    print(f"driver job {own_id}: run {run_id} {'succeeded' if ok else state.status}", flush=True)
    return 0 if ok else 1


def record_term(state: RunState, job_id: str) -> list[dict]:
    """Note in the state which driver drives the run from now (`detached.drivers`: job_id, since, until)."""
    state.detached = {**(state.detached or {}), "owner": "driver"}
    terms = state.detached.setdefault("drivers", [])
    terms.append({"job_id": job_id, "since": time.time(), "until": None})
    return terms


def say(message: str) -> None:
    """A line of the driver's job log (what `logs RUN driver` shows)."""
    print(f"driver job {os.environ.get('NGC_JOB_ID', '?')}: {message}", flush=True)


def check_credentials(backend, run_id: str, driver, *, sleep=time.sleep) -> None:
    """One cheap API call first, so a wrong key fails the driver at once, naming the secret it came from.

    Only a 401/403 is a wrong key. A 429 or 5xx (or no answer) is the API being busy: the call is made again with
    back-off, and if it keeps failing the driver says so without blaming the key."""
    # pylint: disable=import-outside-toplevel  (these need PyYAML and tenacity, checked by now)
    from bcp_pipeline.backends.retries import with_retries
    from bcp_pipeline.detach.jobs import active_drivers

    try:
        with_retries(
            lambda: active_drivers(backend.transport, run_id),
            "the first NGC API call",
            backend.retry_policy,
            sleep=sleep,
            log=say,
        )
    except BackendCallError as exc:
        if is_refused_credentials(exc):
            raise BackendCallError(
                f"the driver cannot call the NGC API with the key from BCP secret {driver.secret} (key "
                f"{driver.secret_key}): {exc}. Check it with `ngc user secret info {driver.secret}` and recreate it "
                "with your current API key if needed"
            ) from None
        raise BackendCallError(
            f"the driver's first call to the NGC API failed (the API did not refuse the key from "
            f"BCP secret {driver.secret}): {exc}"
        ) from None


def hand_over(
    backend, config, pipeline, run_id: str, own_id: str, environ: dict[str, str], *, sleep=time.sleep
) -> tuple[str, bool]:
    """Submit the successor driver: (its job id, True); or (the id of a live driver that already takes over, such
    as one a user's `resume --detach` started, False): never two successors.

    Made again with back-off while the API is busy. Each attempt reads the list first, so a submit whose job was
    created but whose answer was lost (a 5xx) is not made a second time once the list shows that job."""
    # pylint: disable=import-outside-toplevel  (these need PyYAML and tenacity, checked by now)
    from bcp_pipeline.backends.retries import with_retries
    from bcp_pipeline.detach.jobs import active_drivers, driver_spec

    spec = driver_spec(config, pipeline, run_id, environ)

    def attempt() -> tuple[str, bool]:
        others = [job for job in active_drivers(backend.transport, run_id) if str(job.get("id")) != own_id]
        if others:
            return str(others[0].get("id")), False
        return backend.transport.submit(spec), True

    return with_retries(attempt, "handing over to a successor driver", backend.retry_policy, sleep=sleep, log=say)


class SnapshotStore(RunStore):
    """Saves as RunStore does, after printing the state to the job log as numbered lines (the laptop's view).

    Printed first: the log is then never behind the file, and the file never behind what was submitted."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._numbers = itertools.count(1)

    def save(self, state: RunState) -> None:
        state.updated_at = time.time()
        print("\n".join(snapshot_lines(state.to_json(), next(self._numbers))), flush=True)
        super().save(state)

    def keep_submission(self, run_id: str, job_id: str, text: str) -> None:
        print("\n".join(submitted_lines(job_id, text)), flush=True)  # the laptop cannot read the workspace's copy
        super().keep_submission(run_id, job_id, text)


class CappedLines(io.TextIOBase):
    """A text stream passing on whole lines of at most MAX_LINE_BYTES: a longer one goes on as several lines.

    Log pipelines split long lines at a limit of their own; here the driver chooses where, and every piece keeps
    its place in the log."""

    def __init__(self, stream: io.TextIOBase) -> None:
        self.stream = stream
        self.pending = ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            for piece in capped(line):
                self.stream.write(piece + "\n")
        if len(self.pending) > MAX_LINE_BYTES:  # a line still growing: what cannot fit goes on now
            *full, self.pending = capped(self.pending)
            for piece in full:
                self.stream.write(piece + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


if __name__ == "__main__":
    sys.exit(main())
