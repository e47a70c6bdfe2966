#!/usr/bin/env python3
"""download stage: fetch SlimPajama shards into one flat folder, sharded by rank, resumable, never with a hole.

`BASE/{split}/chunk{c}/example_train_{i}.jsonl.zst` -> `OUT/example_train_chunk{c}_{i}.jsonl.zst` for the real
per-chunk file counts (the guide's 6,000-per-chunk loop asks for files that do not exist). Each file streams to a
hidden temporary while a zstd decompressor reads it along; it is renamed into place only when the body matches its
Content-Length and every zstd frame is complete. 429, 5xx, dropped connections, timeouts and short bodies are
retried with exponential backoff and jitter, waiting what `Retry-After` / `RateLimit` headers ask (capped); a 404
or 401/403 fails the file at once. `HF_TOKEN` is sent as a bearer token and never printed.

Every rank writes the same `OUT/.manifest/download.json` (the full list of expected names) before downloading, so
later stages can list their inputs without racing the downloads. Exit 0 only when every file of the shard is in place.

`--hf-dataset REPO [--revision REV] [--include GLOB] [--exclude GLOB]` fetches any dataset repo instead: the file
list comes from the Hub's tree API at the commit REV resolves to (hf_listing.py), and the manifest records that
commit, each file's size and, for LFS files, its sha256. A file is renamed into place only when its size and its
sha256 (git blob id for non-LFS files) match the listing; a mismatch is retried like a cut body. A resume, or a
rank started later, downloads the manifest's commit, and refuses to go on when REV has moved meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Callable, Iterable, Mapping, TypeVar
from urllib.parse import urlsplit
from urllib.request import url2pathname

import requests
import tenacity
import zstandard
from requests.adapters import HTTPAdapter
from requests.auth import AuthBase

import _common
import hf_listing
from hf_listing import HubItem

STAGE = "download"
DEFAULT_BASE_URL = "https://huggingface.co/datasets/cerebras/SlimPajama-627B/resolve/main"
# Files in train/chunk1..chunk10 (59,166 in all); indices run from 0.
TRAIN_FILES_PER_CHUNK = (5912, 5911, 5919, 5917, 5933, 5915, 5906, 5921, 5920, 5912)
SPLIT_CHUNKS = {"train": 10, "validation": 5, "test": 5}
MANIFEST = Path(".manifest") / "download.json"
READ_BYTES = 1 << 20  # 1 MiB reads: few syscalls, bounded memory per worker
USER_AGENT = "bcp-pipeline-download/0.1"
T = TypeVar("T")


# ---------------------------------------------------------------------------------------------------------------
# What to fetch
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Item:
    """One shard: where it lives upstream and the flat name it gets locally."""

    split: str
    chunk: int
    index: int

    @property
    def stem(self) -> str:
        return "example_train" if self.split == "train" else "example_holdout"

    @property
    def name(self) -> str:
        return f"{self.stem}_chunk{self.chunk}_{self.index}.jsonl.zst"

    def url(self, base_url: str) -> str:
        return f"{base_url.rstrip('/')}/{self.split}/chunk{self.chunk}/{self.stem}_{self.index}.jsonl.zst"


def parse_chunks(spec: str, highest: int) -> list[int]:
    """`1-10`, `1,3,5` or a mix (`1-3,7`) -> sorted distinct chunk numbers in 1..highest."""
    chunks: set[int] = set()
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match:
            raise ValueError(f"{part!r} is not a chunk number or range like 1-10")
        low, high = int(match[1]), int(match[2] or match[1])
        if low > high or low < 1 or high > highest:
            raise ValueError(f"{part.strip()!r} is outside the chunks 1..{highest}")
        chunks.update(range(low, high + 1))
    return sorted(chunks)


def expected_items(split: str, chunks: list[int], files_per_chunk: int | None, max_files: int | None) -> list[Item]:
    """Every file the whole job fetches, sorted by output name (the order shards are cut from)."""
    items: list[Item] = []
    for chunk in chunks:
        real = TRAIN_FILES_PER_CHUNK[chunk - 1] if split == "train" else None
        count = real if files_per_chunk is None else min(files_per_chunk, real or files_per_chunk)
        items.extend(Item(split, chunk, index) for index in range(count))
    if max_files is not None:
        items = items[:max_files]  # the first N in chunk/index order, not name order (0, 1, 2 rather than 0, 1, 10)
    return sorted(items, key=lambda item: item.name)


def write_manifest(out_dir: Path, items: list[Item], rank: int) -> None:
    """Write the list of every expected name; each rank writes identical bytes, so the last rename wins harmlessly."""
    payload = {"stage": STAGE, "count": len(items), "files": [item.name for item in items]}
    data = (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode()
    path = out_dir / MANIFEST
    with contextlib.suppress(FileNotFoundError):
        if path.read_bytes() == data:
            return
    # Every rank writes the same bytes; _common's temporary names carry host and pid, so ranks never collide.
    with _common.atomic_output(path) as handle:
        handle.write(data)


# ---------------------------------------------------------------------------------------------------------------
# One attempt at one file
# ---------------------------------------------------------------------------------------------------------------

class FetchError(Exception):
    """One attempt failed; `transient` says whether another attempt may succeed, `retry_after` what the server asked."""

    def __init__(self, reason: str, transient: bool, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason, self.transient, self.retry_after = reason, transient, retry_after


class ZstdStreamCheck:
    """Decompresses a .zst stream as it arrives, only to prove it is whole: every frame ends, none is cut short."""

    def __init__(self) -> None:
        self._dctx = zstandard.ZstdDecompressor()
        self._frame = self._dctx.decompressobj()
        self._pending = False  # bytes of an unfinished frame have been fed
        self.frames = 0
        self.decompressed_bytes = 0

    def feed(self, data: bytes) -> None:
        try:
            while data:
                self.decompressed_bytes += len(self._frame.decompress(data))
                self._pending = not self._frame.eof
                if not self._frame.eof:
                    return
                # A frame ended inside `data`: the rest (unused_data) starts the next frame.
                self.frames += 1
                data = self._frame.unused_data
                self._frame = self._dctx.decompressobj()
        except zstandard.ZstdError as exc:
            raise FetchError(f"corrupt zstd data: {exc}", transient=True) from exc

    def finish(self) -> None:
        """Raise unless the stream ended exactly at the end of a frame."""
        if self._pending:
            raise FetchError("truncated zstd stream: the last frame is incomplete", transient=True)
        if self.frames == 0:
            raise FetchError("empty body: not a zstd stream", transient=True)


class ListedSize:
    """The body has the size the Hub's listing gives (Content-Length alone misses a CDN serving another file)."""

    def __init__(self, size: int) -> None:
        self.size, self.received = size, 0

    def feed(self, data: bytes) -> None:
        self.received += len(data)

    def finish(self) -> None:
        if self.received != self.size:
            raise FetchError(f"size mismatch: {self.received} bytes, the listing says {self.size}", transient=True)


class DigestCheck:
    """The body's digest equals the listing's: sha256 of an LFS file, or a git blob id (sha1 over a `blob SIZE\\0`
    header, then the content) of a file kept in git. A mismatch is transient: a retry may get the right bytes."""

    def __init__(self, expected: str, kind: str, size: int = 0) -> None:
        self.expected, self.kind = expected, kind
        self._hash = hashlib.sha256() if kind == "sha256" else hashlib.sha1(b"blob %d\0" % size)

    def feed(self, data: bytes) -> None:
        self._hash.update(data)

    def finish(self) -> None:
        got = self._hash.hexdigest()
        if got != self.expected:
            raise FetchError(f"{self.kind} mismatch: got {got}, the listing says {self.expected}", transient=True)


def checks_for(item: Item | HubItem) -> list:
    """What proves a download of `item` whole: the zstd stream for SlimPajama's list; for a listed file its size,
    its digest, and the zstd stream too when it is one. Size first, so a cut body reads as one, not as a bad hash."""
    if isinstance(item, Item):
        return [ZstdStreamCheck()]
    checks: list = [ListedSize(item.size)]
    if item.sha256:
        checks.append(DigestCheck(item.sha256, "sha256"))
    elif item.git_oid:
        checks.append(DigestCheck(item.git_oid, "git blob id", item.size))
    if item.name.endswith(".zst"):
        checks.append(ZstdStreamCheck())
    return checks


def save_stream(chunks: Iterable[bytes], expected_length: int | None, dest: Path, checks: list | None = None) -> int:
    """Write `chunks` to `dest` through a temporary, renamed only if the length and every check hold (by default
    the zstd stream check)."""
    checks = [ZstdStreamCheck()] if checks is None else checks
    received = 0
    with _common.atomic_output(dest) as handle:
        for chunk in chunks:
            handle.write(chunk)
            for check in checks:
                check.feed(chunk)
            received += len(chunk)
        if expected_length is not None and received != expected_length:
            raise FetchError(f"short body: {received} of {expected_length} bytes (Content-Length)", transient=True)
        for check in checks:
            check.finish()
    return received


def server_wait_hint(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the server asks us to wait: `Retry-After` (seconds or HTTP date), `RateLimit`'s `t=`/`reset=`,
    `RateLimit-Reset` / `X-RateLimit-Reset` (seconds, or an epoch time when large). The largest hint, else None."""
    now = time.time() if now is None else now
    hints: list[float] = []
    retry_after = headers.get("Retry-After")
    if retry_after:
        value = retry_after.strip()
        if re.fullmatch(r"\d+(\.\d+)?", value):
            hints.append(float(value))
        else:
            with contextlib.suppress(TypeError, ValueError, IndexError):
                hints.append(parsedate_to_datetime(value).timestamp() - now)
    ratelimit = headers.get("RateLimit")
    if ratelimit:
        # Draft-08 `"api";r=0;t=55` (Hugging Face) or draft-06 `limit=100, remaining=0, reset=55`.
        match = re.search(r"(?:^|[;,\s])(?:t|reset)\s*=\s*(\d+(?:\.\d+)?)", ratelimit)
        if match:
            hints.append(float(match[1]))
    for key in ("RateLimit-Reset", "X-RateLimit-Reset"):
        value = (headers.get(key) or "").strip()
        if re.fullmatch(r"\d+(\.\d+)?", value):
            seconds = float(value)
            hints.append(seconds - now if seconds > 1e9 else seconds)  # GitHub-style epoch seconds
    return max(0.0, max(hints)) if hints else None


def _check_status(response: requests.Response) -> None:
    code = response.status_code
    if code == 200:
        return
    reason = f"HTTP {code} {response.reason or ''}".rstrip()
    if code == 404:
        raise FetchError(f"{reason}: the file should exist", transient=False)
    if code in (408, 425, 429) or code >= 500:
        raise FetchError(reason, transient=True, retry_after=server_wait_hint(response.headers))
    # 401/403 (bad or missing HF_TOKEN, gated dataset) and other answers do not change on retry.
    raise FetchError(reason, transient=False)


def _content_length(response: requests.Response) -> int | None:
    if response.headers.get("Content-Encoding", "identity") != "identity":
        return None  # the length counts encoded bytes; the zstd check still proves the file whole
    value = response.headers.get("Content-Length", "")
    return int(value) if value.isdigit() else None


def describe(exc: requests.RequestException) -> str:
    """`ConnectionError: <the cause>`, without urllib3's `Max retries exceeded with url` wrapper around it."""
    inner = exc.args[0] if exc.args else None
    detail = getattr(inner, "reason", None)  # MaxRetryError -> the connection error inside it
    if detail is None and isinstance(inner, Exception) and inner.args:
        detail = inner.args[0]  # ProtocolError("Connection broken: IncompleteRead(...)", cause) -> its message
    return f"{type(exc).__name__}: {detail or inner or exc}"


def fetch_http(session: requests.Session, url: str, dest: Path, timeout: float, checks: list | None = None) -> int:
    """One HTTP(S) attempt: stream `url` into `dest`. Returns the bytes written; raises FetchError."""
    try:
        with session.get(url, stream=True, timeout=(min(timeout, 30.0), timeout)) as response:
            _check_status(response)
            return save_stream(response.iter_content(READ_BYTES), _content_length(response), dest, checks)
    except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
            requests.exceptions.ContentDecodingError) as exc:
        raise FetchError(describe(exc), transient=True) from exc


def fetch_file(url: str, dest: Path, checks: list | None = None) -> int:
    """One file:// attempt (offline mirrors): same checks as over HTTP."""
    path = Path(url2pathname(urlsplit(url).path))
    try:
        handle = open(path, "rb")
    except FileNotFoundError as exc:
        raise FetchError(f"not found: {path}", transient=False) from exc
    except OSError as exc:  # a network filesystem hiccup may pass
        raise FetchError(f"cannot open {path}: {exc.strerror or exc}", transient=True) from exc

    def chunks() -> Iterable[bytes]:
        while True:
            try:
                data = handle.read(READ_BYTES)
            except OSError as exc:
                raise FetchError(f"cannot read {path}: {exc.strerror or exc}", transient=True) from exc
            if not data:
                return
            yield data

    with handle:
        return save_stream(chunks(), os.fstat(handle.fileno()).st_size, dest, checks)


# ---------------------------------------------------------------------------------------------------------------
# Retries
# ---------------------------------------------------------------------------------------------------------------

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
        self.backoff = (tenacity.wait_exponential(multiplier=policy.backoff, max=policy.max_wait)
                        + tenacity.wait_random(0, policy.backoff))

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
        log(f"{label}: {getattr(cause, 'reason', cause)}; attempt {state.attempt_number}/"
            f"{policy.attempts} failed, retrying in {state.upcoming_sleep:.1f}s")

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
                    _check_status(response)
                    try:
                        payload = response.json()
                    except ValueError as exc:
                        raise FetchError(f"not JSON: {response.text[:200]!r}", transient=True) from exc
                    return payload, response.links.get("next", {}).get("url")
            except (requests.ConnectionError, requests.Timeout,
                    requests.exceptions.ChunkedEncodingError) as exc:
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


def redactor(secret: str | None) -> Callable[[str], str]:
    """A function that blanks `secret` out of text, for everything this stage prints."""
    if not secret:
        return lambda text: text
    return lambda text: text.replace(secret, "<HF_TOKEN>")


# ---------------------------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------------------------

def download_all(fetcher: Fetcher, items: list[Item] | list[HubItem], workers: int,
                 progress: _common.Progress) -> tuple[dict[str, str], int]:
    """Fetch `items` on a thread pool; returns ({name: reason} for each that could not be fetched, bytes fetched)."""
    failures: dict[str, str] = {}
    fetched = 0
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="download") as pool:
        futures = {pool.submit(fetcher.fetch, item): item for item in items}
        for future in as_completed(futures):
            item = futures[future]
            try:
                fetched += future.result()
            except FetchError as exc:
                failures[item.name] = exc.reason
            except Exception as exc:  # a full disk, a bug: still name the file rather than stop the other workers
                failures[item.name] = f"{type(exc).__name__}: {exc}"
            else:
                progress.advance()
    return failures, fetched


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="download.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default=DEFAULT_BASE_URL,
                        help="https://, http:// or file:// root holding SPLIT/chunkC/ (default: %(default)s)")
    parser.add_argument("--out", type=Path, required=True, help="flat output folder")
    parser.add_argument("--split", default="train", choices=sorted(SPLIT_CHUNKS))
    parser.add_argument("--chunks", default=None, help="chunks to fetch, e.g. 1-10 or 1,3,5 (default: all)")
    parser.add_argument("--files-per-chunk", type=_common.positive_int, default=None,
                        help="cap on each chunk's file count (default: the real SlimPajama counts)")
    parser.add_argument("--max-files", type=_common.positive_int, default=None, help="cap on the total number of files")
    parser.add_argument("--workers", type=_common.positive_int, default=8, help="concurrent downloads in this process")
    parser.add_argument("--attempts", type=_common.positive_int, default=8, help="attempts per file (default: %(default)s)")
    parser.add_argument("--backoff", type=positive_float, default=1.0,
                        help="first retry wait in seconds, doubled each attempt, plus jitter (default: %(default)s)")
    parser.add_argument("--max-wait", type=positive_float, default=300.0,
                        help="cap on any single wait, Retry-After included (default: %(default)s)")
    parser.add_argument("--timeout", type=positive_float, default=60.0,
                        help="seconds without data before an attempt is abandoned (default: %(default)s)")
    hub = parser.add_argument_group("any Hugging Face dataset repo (instead of SlimPajama's built-in list)")
    hub.add_argument("--hf-dataset", metavar="REPO", help="dataset repo id, e.g. HuggingFaceFW/fineweb-edu; the "
                     f"Hub is ${hf_listing.ENDPOINT_ENV} when set, else {hf_listing.DEFAULT_ENDPOINT}")
    hub.add_argument("--revision", default="main", help="branch, tag or commit (default: %(default)s); the manifest "
                     "pins the commit it resolves to")
    hub.add_argument("--include", action="append", default=[], metavar="GLOB",
                     help="fetch only paths matching GLOB (fnmatch, `*` crosses /); repeatable")
    hub.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                     help="skip paths matching GLOB; repeatable")
    hub.add_argument("--listing-wait", type=float, default=300.0, metavar="SECONDS",
                     help="ranks other than 0 wait this long for rank 0's manifest before listing the revision "
                     "themselves (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.hf_dataset is not None:
        if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", args.hf_dataset):
            parser.error(f"--hf-dataset {args.hf_dataset!r}: expected a repo id like OWNER/NAME")
        given = [flag for flag, value in (("--chunks", args.chunks), ("--files-per-chunk", args.files_per_chunk),
                                          ("--max-files", args.max_files)) if value is not None]
        if args.base_url != DEFAULT_BASE_URL or args.split != "train":
            given += ["--base-url/--split"]
        if given:
            parser.error(f"--hf-dataset takes its file list from the Hub; {', '.join(given)} do not apply "
                         "(select files with --include/--exclude)")
        return args
    if args.include or args.exclude or args.revision != "main":
        parser.error("--revision, --include and --exclude need --hf-dataset")
    scheme = urlsplit(args.base_url).scheme
    if scheme not in ("https", "http", "file"):
        parser.error(f"--base-url {args.base_url!r}: the scheme must be https, http or file")
    try:
        args.chunk_list = parse_chunks(args.chunks or f"1-{SPLIT_CHUNKS[args.split]}", SPLIT_CHUNKS[args.split])
    except ValueError as exc:
        parser.error(f"--chunks {args.chunks!r}: {exc}")
    if args.split != "train" and args.files_per_chunk is None:
        parser.error(f"--files-per-chunk is required for --split {args.split} (its file counts are not built in)")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the stage for this process's rank; returns the exit code."""
    args = parse_args(argv)
    token = os.environ.get("HF_TOKEN") or None
    redact = redactor(token)

    lock = threading.Lock()

    def log(message: str) -> None:
        with lock:  # worker threads log retries: one whole line at a time
            sys.stderr.write(redact(f"{STAGE}: {message}") + "\n")
            sys.stderr.flush()

    try:
        rank, world = _common.rank_and_world_size()
    except _common.StageError as exc:
        log(str(exc))
        return 2
    if _common.claim_or_refuse(args.out, STAGE, args.out.glob("*.jsonl.zst"), rank):
        return 1
    policy = RetryPolicy(args.attempts, args.backoff, args.max_wait, args.timeout)
    with make_session(args.workers, token) as session:
        fetcher = Fetcher(args.base_url, args.out, policy, session, log)
        if args.hf_dataset is None:
            items = expected_items(args.split, args.chunk_list, args.files_per_chunk, args.max_files)
            write_manifest(args.out, items, rank)
        else:
            try:
                items = pin_listing(fetcher, args, rank, log)
            except hf_listing.PinnedRevisionError as exc:
                log(str(exc))
                return 2
            except (hf_listing.ListingError, FetchError) as exc:
                log(f"cannot list {args.hf_dataset} at revision {args.revision!r}: {exc} (are the repo id, "
                    "--revision and --include right? a private or gated dataset needs HF_TOKEN)")
                return 1
        failures, fetched, summary = fetch_shard(fetcher, items, rank, world, args.workers)
    if failures:
        return _common.fail_with_items(STAGE, {name: redact(reason) for name, reason in failures.items()})
    _common.write_completion(args.out, STAGE, rank, world, {**summary, "bytes_downloaded": fetched})
    return 0


def pin_listing(fetcher: Fetcher, args: argparse.Namespace, rank: int, log: Callable[[str], None]) -> list[HubItem]:
    """The manifest's items (listing the revision first when there is no manifest yet); points `fetcher` at the
    pinned commit, on the Hub this run was given (HF_ENDPOINT may name a mirror on a resume)."""
    endpoint = hf_listing.endpoint_from_env()
    wanted = hf_listing.Source(args.hf_dataset, args.revision, "", tuple(args.include), tuple(args.exclude),
                               endpoint)
    source, items = hf_listing.pin(fetcher.get_json, wanted, args.out / MANIFEST, STAGE, log,
                                   wait_seconds=args.listing_wait if rank else 0.0)
    fetcher.base_url = dataclasses.replace(source, endpoint=endpoint).resolve_base()
    return items


def fetch_shard(fetcher: Fetcher, items: list[Item] | list[HubItem], rank: int, world: int,
                workers: int) -> tuple[dict[str, str], int, dict]:
    """Fetch this rank's share of `items` that is not in place yet: (failures, bytes fetched, counts)."""
    out, log = fetcher.out_dir, fetcher.log
    mine = _common.shard(items, rank, world)
    _common.remove_stale_temporaries_of(out / item.name for item in mine)
    todo = [item for item in mine if not (out / item.name).exists()]
    log(f"rank {rank}/{world}: {len(mine)} of {len(items)} files, {len(mine) - len(todo)} already present")
    progress = _common.Progress(len(mine), rank)
    progress.advance(len(mine) - len(todo))
    failures, fetched = download_all(fetcher, todo, workers, progress)
    return failures, fetched, {"files": len(mine), "downloaded": len(todo), "already_present": len(mine) - len(todo)}


if __name__ == "__main__":
    sys.exit(main())
