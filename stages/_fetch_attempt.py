"""One attempt at one file: stream it into a hidden temporary, verified as it arrives, renamed only when whole.

What proves a body whole: its Content-Length, and by the item's kind every zstd frame complete, the size the Hub's
listing gives and its sha256 (LFS files) or git blob id. A failed attempt raises FetchError, which says whether
another attempt may succeed (429, 5xx, a dropped connection, a short or corrupt body) or not (404, 401/403), and
how long the server asked to wait. The retries themselves are _fetcher.py's.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from collections.abc import Iterable, Mapping
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

import _common
import requests
import zstandard
from _slimpajama_files import Item
from hf_listing import HubItem

READ_BYTES = 1 << 20  # 1 MiB reads: few syscalls, bounded memory per worker


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


def check_status(response: requests.Response) -> None:
    """Return on a 200; else raise FetchError, transient for the answers another attempt may change."""
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
            check_status(response)
            return save_stream(response.iter_content(READ_BYTES), _content_length(response), dest, checks)
    except (
        requests.ConnectionError,
        requests.Timeout,
        requests.exceptions.ChunkedEncodingError,
        requests.exceptions.ContentDecodingError,
    ) as exc:
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
