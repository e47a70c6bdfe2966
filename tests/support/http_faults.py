"""A real HTTP server on 127.0.0.1 that serves a folder and injects faults deterministically, for download tests.

    with FaultServer(mirror) as server:
        server.script("/train/chunk1/example_train_0.jsonl.zst", Fault.too_many(retry_after="0"), Fault.drop())
        server.always("/train/chunk1/example_train_1.jsonl.zst", Fault.error(500))
        ... download from server.url ...
        assert server.requests["/train/chunk1/example_train_0.jsonl.zst"] == 3

Faults are chosen per path by the request number for that path (`script`), for every request to a path (`always`),
or by the server-wide request number (`every`, deterministic only with one client thread). Kinds:
* `Fault.error(status)`: any status (500, 503, 404, 401...), optional headers (`Retry-After`, `RateLimit`...);
* `Fault.too_many(retry_after, ratelimit)`: 429 with `Retry-After` and/or a `RateLimit` header;
* `Fault.drop()`: full Content-Length, half the body, then a TCP reset (connection dropped mid-response);
* `Fault.short()`: full Content-Length, half the body, then a clean close (body shorter than announced);
* `Fault.truncate()`: half the file with a matching Content-Length (only a zstd check can tell);
* `Fault.stall(seconds)`: half the body, then silence for `seconds` (a client read timeout), then the rest;
* `Fault.redirect(location)`: 302 to `location`.
`authorizations` maps each Host header seen to the Authorization headers sent with it (None: none sent).
A reason phrase of `"{auth}"` echoes the request's Authorization header back, to test that clients never print it.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True)
class Fault:
    """One injected misbehaviour for one response."""

    kind: str  # "status", "drop", "short", "truncate" or "stall"
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    reason: str | None = None
    seconds: float = 0.0

    @classmethod
    def error(cls, status: int = 500, reason: str | None = None, **headers: str) -> Fault:
        """An error status; keyword headers use `_` for `-` (Retry_After="3")."""
        return cls("status", status, tuple((k.replace("_", "-"), v) for k, v in headers.items()), reason)

    @classmethod
    def too_many(cls, retry_after: str | None = "0", ratelimit: str | None = None) -> Fault:
        headers = {"Retry_After": retry_after, "RateLimit": ratelimit}
        return cls.error(429, **{k: v for k, v in headers.items() if v is not None})

    @classmethod
    def drop(cls) -> Fault:
        return cls("drop")

    @classmethod
    def short(cls) -> Fault:
        return cls("short")

    @classmethod
    def truncate(cls) -> Fault:
        return cls("truncate")

    @classmethod
    def stall(cls, seconds: float) -> Fault:
        return cls("stall", seconds=seconds)

    @classmethod
    def redirect(cls, location: str) -> Fault:
        return cls.error(302, Location=location)


class FaultServer:
    """Serves `root` over HTTP/1.1 (keep-alive) on an ephemeral loopback port; a context manager stops it."""

    def __init__(self, root: Path, body_delay: float = 0.0) -> None:
        self.root = Path(root).resolve()
        self.body_delay = body_delay  # seconds paused mid-body on good responses: lets tests kill mid-file
        self.requests: collections.Counter[str] = collections.Counter()
        self.connections = 0
        self.authorizations: collections.defaultdict[str, set[str | None]] = collections.defaultdict(set)
        self._scripts: dict[str, list[Fault | None]] = {}
        self._always: dict[str, Fault] = {}
        self._every: list[tuple[int, Fault]] = []
        self._total = 0
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def script(self, path: str, *faults: Fault | None) -> None:
        """Faults for the 1st, 2nd, ... request to `path` (None: serve normally); later requests are served."""
        self._scripts[path] = list(faults)

    def always(self, path: str, fault: Fault) -> None:
        """Answer every request to `path` with `fault`."""
        self._always[path] = fault

    def heal(self, path: str) -> None:
        """Serve `path` normally from now on (undo `always` and `script`): a source that was broken is repaired."""
        with self._lock:
            self._always.pop(path, None)
            self._scripts.pop(path, None)

    def every(self, nth: int, fault: Fault) -> None:
        """Apply `fault` to every `nth` request the server receives (any path)."""
        self._every.append((nth, fault))

    def start(self) -> FaultServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fault-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def choose(self, path: str, host: str, authorization: str | None) -> Fault | None:
        """Count the request and pick its fault (called by the handler, under a lock: threads share counters)."""
        with self._lock:
            self.requests[path] += 1
            self._total += 1
            self.authorizations[host].add(authorization)
            if path in self._always:
                return self._always[path]
            script = self._scripts.get(path, [])
            number = self.requests[path]
            if number <= len(script) and script[number - 1] is not None:
                return script[number - 1]
            for nth, fault in self._every:
                if self._total % nth == 0:
                    return fault
            return None

    def count_connection(self) -> None:
        with self._lock:
            self.connections += 1


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: FaultServer

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # clients that hang up (and our own dropped connections) are expected here, not news


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.owner.count_connection()

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet test output

    def do_GET(self) -> None:
        owner = self.server.owner
        path = unquote(urlsplit(self.path).path)
        fault = owner.choose(path, self.headers.get("Host", ""), self.headers.get("Authorization"))
        if fault is not None and fault.kind == "status":
            return self._send_status(fault)
        target = (owner.root / path.lstrip("/")).resolve()
        if owner.root not in target.parents or not target.is_file():
            return self._send_status(Fault.error(404))
        data = target.read_bytes()
        if fault is None:
            return self._send_body(data, len(data), delay=owner.body_delay)
        if fault.kind == "truncate":
            return self._send_body(data[: len(data) // 2], len(data) // 2)
        if fault.kind == "stall":
            return self._send_body(data, len(data), delay=fault.seconds)
        self._send_body(data[: len(data) // 2], len(data), complete=False)
        self.close_connection = True
        if fault.kind == "drop":
            # SO_LINGER 0 turns close() into a TCP reset: the client sees the connection torn down mid-body.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()

    def _send_status(self, fault: Fault) -> None:
        reason = fault.reason
        if reason == "{auth}":
            reason = f"echo {self.headers.get('Authorization')}"
        body = f"{fault.status} {reason or ''}\n".encode()
        self.send_response(fault.status, reason)
        for key, value in fault.headers:
            self.send_header(key, value)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_body(self, data: bytes, length: int, delay: float = 0.0, complete: bool = True) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        half = len(data) // 2
        with contextlib.suppress(ConnectionError):
            self.wfile.write(data[:half])
            if delay:
                self.wfile.flush()
                time.sleep(delay)
            self.wfile.write(data[half:])
            self.wfile.flush()
        if not complete:
            self.close_connection = True
