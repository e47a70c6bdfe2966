"""The service's clock against this machine's, as `check` on BCP can see it: the probe job's `createdDate` (stamped
by the service) against this machine's clock just before and just after its `job run`.

It matters for one thing: `job list` windows are set by this machine's clock and the service compares them with
the dates it stamped. The transports' window ends a day past our clock (transport.py list_window), so a service
running ahead by less than that still lists a job just created; one running behind stamps dates in our past, which
the window covers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from bcp_pipeline.backends.bcp.transport import LIST_WINDOW_AHEAD, Transport
from bcp_pipeline.backends.checks import Row, different, ok, unchecked
from bcp_pipeline.errors import BackendCallError

TOLERANCE_SECONDS = 60.0  # clocks kept by NTP agree far better; a larger gap is worth a line in the table

ASSUMES = (
    f"the service's clock is within {TOLERANCE_SECONDS:.0f} s of this machine's (it stamps a job's "
    "createdDate; `job list` windows are set by ours)"
)


@dataclass(frozen=True)
class ClockCheck:
    row: Row
    skew_seconds: float | None  # the service's clock minus ours (negative: behind); None where not measured


def submitted_clock(transport: Transport, job_id: str, before: float, after: float) -> ClockCheck:
    """The row and the measured skew for job `job_id`, submitted between `before` and `after` (time.time())."""
    try:
        job = transport.job(job_id)
    except BackendCallError as exc:
        return ClockCheck(unchecked("clock", ASSUMES, f"`job info` failed: {' '.join(str(exc).split())[:200]}"), None)
    return clock_check(before, after, created_of(job))


def created_of(job: dict) -> float | None:
    """A job's createdDate (NGC's `2024-01-31T12:00:00.123Z`, UTC) as epoch seconds; None when absent or not a date."""
    status = found if isinstance(found := job.get("jobStatus"), dict) else {}
    text = job.get("createdDate") or status.get("createdDate")
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def measured_skew(before: float, after: float, created: float) -> float:
    """How far the service's stamp lies outside [before, after], this machine's clock around the submission: 0
    inside it (the skew is then smaller than the call took), negative before it (the service's clock behind)."""
    if created < before:
        return created - before
    return max(0.0, created - after)


def clock_check(before: float, after: float, created: float | None) -> ClockCheck:
    """Pure: the row for a job submitted between `before` and `after` whose createdDate is `created`."""
    if created is None:
        return ClockCheck(
            unchecked("clock", ASSUMES, "the probe job's createdDate is not in `job info`'s answer"), None
        )
    skew = measured_skew(before, after, created)
    showed = (
        f"the probe's createdDate falls within its `job run` call ({after - before:.1f} s) on this machine's clock"
        if skew == 0
        else f"the probe's createdDate is {abs(skew):.0f} s "
        f"{'ahead of' if skew > 0 else 'behind'} this machine's clock at its `job run`"
    )
    if abs(skew) <= TOLERANCE_SECONDS:
        return ClockCheck(ok("clock", ASSUMES, showed), skew)
    ahead = LIST_WINDOW_AHEAD.total_seconds()
    if skew > ahead:
        return ClockCheck(
            different(
                "clock",
                ASSUMES,
                showed,
                f"`job list` windows reach {ahead / 3600:.0f} h past "
                "this machine's clock, not that far: the poller and crash recovery would miss new "
                "jobs and submit stages twice. Set this machine's clock (NTP)",
            ),
            skew,
        )
    return ClockCheck(
        different(
            "clock",
            ASSUMES,
            showed,
            f"`job list` windows reach {ahead / 3600:.0f} h past this machine's clock, so new jobs "
            "are still listed (the labels row); set this machine's clock (NTP) if it is the one "
            "that is off"
            if skew > 0
            else "the service's dates lie in this machine's past, inside every `job list` window, so "
            "new jobs are still listed (the labels row); set this machine's clock (NTP) if it is "
            "the one that is off",
        ),
        skew,
    )
