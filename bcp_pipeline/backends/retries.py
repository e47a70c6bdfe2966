"""Calls to a backend's service that a rate limit or a passing server error must not fail: made again with
exponential back-off, jitter and a bound.

NVIDIA's client retries almost nothing (ngcsdk 4.19.1: NGC_MAX_REQUEST_ATTEMPTS is 1, a 429 is never retried,
a 502-504 is tried once more after 5 s), so a single busy moment of the API would otherwise fail an upload, a
driver's start or its hand-over. Only what `errors.is_transient` calls transient is retried: a 401/403 (a wrong
key) or another 4xx fails at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

from bcp_pipeline.errors import BackendCallError, is_transient

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """At most `attempts` calls; the waits between them start at `backoff` seconds and double (plus up to
    `backoff` of jitter, so many clients told no at once do not come back at once), each at most `max_wait`."""

    attempts: int = 5
    backoff: float = 2.0
    max_wait: float = 60.0


def with_retries(
    call: Callable[[], T],
    what: str,
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] | None = None,
) -> T:
    """`call()` until it succeeds, fails for good, or the attempts run out; the last failure names how often."""

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if log is not None and state.outcome is not None:
            log(
                f"{what}: {' '.join(str(state.outcome.exception()).split())[:300]}; attempt {state.attempt_number}/"
                f"{policy.attempts} failed, retrying in {state.upcoming_sleep:.1f} s"
            )

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(max(1, policy.attempts)),
        wait=(
            tenacity.wait_exponential(multiplier=policy.backoff, max=policy.max_wait)
            + tenacity.wait_random(0, policy.backoff)
        ),
        retry=tenacity.retry_if_exception(is_transient),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    attempts = 0

    def counted() -> T:
        nonlocal attempts
        attempts += 1
        return call()

    try:
        return retrying(counted)
    except BackendCallError as exc:
        if attempts < 2:
            raise
        raise BackendCallError(
            f"{what} failed {attempts} times: {exc}", http_status=exc.http_status, unreachable=exc.unreachable
        ) from exc
