"""Fetcher: downloads items, and the Hub's listing pages, with bounded retries over one pooled HTTP session.

Transient failures are retried with exponential backoff and jitter, or after what the server asked
(`Retry-After`, `RateLimit`), never longer than the policy's cap; `HF_TOKEN` goes out as a bearer token that
never leaves huggingface.co and never appears in a repr.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import requests
import tenacity
from _fetch_attempt import FetchError, check_status, checks_for, describe, fetch_file, fetch_http
from _slimpajama_files import Item
from hf_listing import HubItem
from requests.adapters import HTTPAdapter
from requests.auth import AuthBase

USER_AGENT = "bcp-pipeline-download/0.1"
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded attempts; waits double from `backoff` with jitter; no single wait exceeds `max_wait`."""

    attempts: int = 8
    backoff: float = 1.0
    max_wait: float = 300.0
    timeout: float = 60.0


class WaitForServer(tenacity.wait.wait_base):
    """Wait what the server asked (Retry-After / RateLimit) when it said, else exponential backoff with jitter."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        # Exponential from `backoff`, plus up to `backoff` of jitter (tenacity's oldest stable spelling of it).
        self.backoff = tenacity.wait_exponential(multiplier=policy.backoff, max=policy.max_wait) + tenacity.wait_random(
            0, policy.backoff
        )

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        hint = getattr(outcome.exception(), "retry_after", None) if outcome else None
        if hint is None:
            return min(self.backoff(retry_state), self.policy.max_wait)
        # A little jitter so workers told the same Retry-After do not all come back in the same instant.
        return min(hint + random.uniform(0, self.policy.backoff), self.policy.max_wait)


def with_retries(policy: RetryPolicy, label: str, url: str, log: Callable[[str], None], attempt: Callable[[], T]) -> T:
    """`attempt()` until it succeeds, fails for good, or attempts run out; raises FetchError naming the last cause."""
    attempts = 0

    def counted() -> T:
        nonlocal attempts
        attempts += 1
        return attempt()

    def before_sleep(state: tenacity.RetryCallState) -> None:
        cause = state.outcome.exception() if state.outcome else None
        log(
            f"{label}: {getattr(cause, 'reason', cause)}; attempt {state.attempt_number}/"
            f"{policy.attempts} failed, retrying in {state.upcoming_sleep:.1f}s"
        )

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.attempts),
        wait=WaitForServer(policy),
        retry=tenacity.retry_if_exception(lambda exc: isinstance(exc, FetchError) and exc.transient),
        before_sleep=before_sleep,
        reraise=True,
    )
    try:
        return retrying(counted)
    except FetchError as exc:
        raise FetchError(f"{exc.reason} ({url}, {attempts} attempt(s))", transient=False) from exc


@dataclass
class Fetcher:
    """Fetches items with retries, sharing one pooled session among the worker threads of this process."""

    base_url: str
    out_dir: Path
    policy: RetryPolicy
    session: requests.Session
    log: Callable[[str], None]

    def fetch(self, item: Item | HubItem) -> int:
        """Download one item until it is in place or attempts run out; raises FetchError naming the last cause."""
        url, dest = item.url(self.base_url), self.out_dir / item.name

        def attempt() -> int:
            checks = checks_for(item)  # fresh per attempt: each one hashes the body it gets
            if urlsplit(url).scheme == "file":
                return fetch_file(url, dest, checks)
            return fetch_http(self.session, url, dest, self.policy.timeout, checks)

        return with_retries(self.policy, item.name, url, self.log, attempt)

    def get_json(self, url: str) -> tuple[object, str | None]:
        """One Hub API answer, with the same retries as a file: (its JSON, the `rel="next"` page URL or None)."""

        def attempt() -> tuple[object, str | None]:
            try:
                with self.session.get(url, timeout=(min(self.policy.timeout, 30.0), self.policy.timeout)) as response:
                    check_status(response)
                    try:
                        payload = response.json()
                    except ValueError as exc:
                        raise FetchError(f"not JSON: {response.text[:200]!r}", transient=True) from exc
                    return payload, response.links.get("next", {}).get("url")
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
                raise FetchError(describe(exc), transient=True) from exc

        return with_retries(self.policy, "listing", url, self.log, attempt)


class BearerToken(AuthBase):
    """`Authorization: Bearer` on every request; as session auth it beats ~/.netrc, and requests drops it on a
    redirect to another host (the CDN), so the token never leaves huggingface.co. Its repr hides the token."""

    def __init__(self, token: str) -> None:
        self._token = token

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self._token}"
        return request

    def __repr__(self) -> str:
        return "BearerToken(<hidden>)"


def make_session(workers: int, token: str | None) -> requests.Session:
    """One session for all worker threads, with a connection pool as large as the thread pool."""
    session = requests.Session()
    adapter = HTTPAdapter(pool_connections=workers, pool_maxsize=workers, max_retries=0)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    # Identity encoding: Content-Length then counts exactly the bytes we write.
    session.headers.update({"User-Agent": USER_AGENT, "Accept-Encoding": "identity"})
    if token:
        session.auth = BearerToken(token)
    return session
