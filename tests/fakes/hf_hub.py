"""FAKE Hugging Face Hub (an emulator, not Hugging Face's code) on 127.0.0.1, for the download stage's tests.

    with FakeHub(page_size=2) as hub:
        commit = hub.commit("org/data", {"data/a.parquet": b"...", "README.md": b"..."})
        hub.fault("cdn", "data/a.parquet", "wrong_body")       # the next download of it: same size, other bytes
        ... download.py --hf-dataset org/data, with HF_ENDPOINT=hub.url ...

It answers the three calls the stage makes, with the shapes the Hub gives:
* `GET /api/datasets/{repo}/revision/{rev}` -> `{"id": repo, "sha": commit}` (a branch name or a commit id);
* `GET /api/datasets/{repo}/tree/{rev}[/{path}]?recursive=true[&cursor=N]` -> a page of `page_size` entries
  (`{"type": "file", "oid", "size", "path", "lfs": {"oid": sha256, "size", "pointerSize"}}` and folder entries),
  with `Link: <absolute URL>; rel="next"` while more remain. Each page is cut from the revision's CURRENT commit,
  so a branch that moves between pages gives mixed pages here, as it could on the Hub;
* `GET /datasets/{repo}/resolve/{rev}/{path}`: files kept in git are served here; LFS files (`lfs_suffixes`)
  answer 302 to a second server (the "CDN", another loopback port, as the Hub redirects to its CDN host).

Faults, each for the next `times` matching requests (`match`: a substring of the repo path or API path), at the
"hub" or the "cdn": `wrong_body` (as many bytes, but others: a sha256 mismatch), `cut` (full Content-Length, half
the body, then close), `too_many` (429 with `Retry-After: retry_after`). `move_branch_after_page(repo, branch,
commit)` moves a branch right after the first tree page is served. `seen` records (server, path, Authorization)
for every request, to prove the token goes to the hub and never to the CDN.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".parquet", ".zst", ".gz", ".bin")


@dataclass
class _Fault:
    server: str
    match: str
    kind: str
    times: int
    retry_after: str = "0"


@dataclass
class _Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """The hub and its CDN, two threaded HTTP servers on loopback; a context manager starts and stops them."""

    def __init__(
        self, page_size: int = 100, token: str | None = None, lfs_suffixes: tuple[str, ...] = LFS_SUFFIXES
    ) -> None:
        self.page_size, self.token, self.lfs_suffixes = page_size, token, lfs_suffixes
        self.repos: dict[str, _Repo] = {}
        self.seen: list[tuple[str, str, str | None]] = []
        self._faults: list[_Fault] = []
        self._moves: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        self._servers = {name: _Server(("127.0.0.1", 0), _Handler, self, name) for name in ("hub", "cdn")}
        self._threads: list[threading.Thread] = []

    # -- set-up --------------------------------------------------------------------------------------------------

    def url_of(self, server: str) -> str:
        host, port = self._servers[server].server_address[:2]
        return f"http://{host}:{port}"

    @property
    def url(self) -> str:
        """The hub's address: what HF_ENDPOINT is set to."""
        return self.url_of("hub")

    def commit(self, repo: str, files: dict[str, bytes], branch: str = "main") -> str:
        """A new commit of `repo` holding exactly `files`, made the head of `branch`; returns its id."""
        with self._lock:
            state = self.repos.setdefault(repo, _Repo())
            sha = hashlib.sha1(repr((repo, len(state.commits), sorted(files.items()))).encode()).hexdigest()
            state.commits[sha] = dict(files)
            state.branches[branch] = sha
            return sha

    def fault(self, server: str, match: str, kind: str, times: int = 1, retry_after: str = "0") -> None:
        assert server in ("hub", "cdn") and kind in ("wrong_body", "cut", "too_many"), (server, kind)
        with self._lock:
            self._faults.append(_Fault(server, match, kind, times, retry_after))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def move_branch_after_page(self, repo: str, branch: str, commit: str) -> None:
        """Point `branch` at `commit` as soon as the next tree page has been served (a push mid-listing)."""
        with self._lock:
            self._moves.append((repo, branch, commit))

    def requests_to(self, server: str, contains: str = "") -> list[tuple[str, str, str | None]]:
        with self._lock:
            return [entry for entry in self.seen if entry[0] == server and contains in entry[1]]

    def __enter__(self) -> FakeHub:
        for server in self._servers.values():
            thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name=f"fake-hf-{server.name}"
            )
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for server in self._servers.values():
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)

    # -- used by the handler -------------------------------------------------------------------------------------

    def is_lfs(self, path: str) -> bool:
        return path.endswith(self.lfs_suffixes)

    def take_fault(self, server: str, path: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.server == server and fault.match in path and fault.times > 0:
                    fault.times -= 1
                    return fault
            return None

    def resolve(self, repo: str, revision: str) -> str | None:
        with self._lock:
            state = self.repos.get(repo)
            if state is None:
                return None
            return state.branches.get(revision) or (revision if revision in state.commits else None)

    def tree_entries(self, repo: str, commit: str, under: str) -> list[dict]:
        """Every folder and file below `under`, sorted by path, in the Hub's entry shapes."""
        files = self.repos[repo].commits[commit]
        folders = {"/".join(path.split("/")[:depth]) for path in files for depth in range(1, path.count("/") + 1)}
        entries = [
            {"type": "directory", "oid": hashlib.sha1(f.encode()).hexdigest(), "size": 0, "path": f} for f in folders
        ]
        for path, data in files.items():
            entry = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
            if self.is_lfs(path):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        prefix = under.strip("/") + "/" if under.strip("/") else ""
        return sorted((e for e in entries if e["path"].startswith(prefix)), key=lambda e: e["path"])

    def after_tree_page(self) -> None:
        with self._lock:
            moves, self._moves = self._moves, []
            for repo, branch, commit in moves:
                self.repos[repo].branches[branch] = commit

    def file_bytes(self, repo: str, commit: str, path: str) -> bytes | None:
        with self._lock:
            state = self.repos.get(repo)
            files = state.commits.get(commit) if state else None
            return files.get(path) if files else None


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, hub: FakeHub, name: str) -> None:
        super().__init__(address, handler)
        self.hub, self.name = hub, name

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # clients hanging up (and the cut bodies we make) are expected, not news


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        hub, name = self.server.hub, self.server.name
        split = urlsplit(self.path)
        path = unquote(split.path)
        auth = self.headers.get("Authorization")
        with hub._lock:
            hub.seen.append((name, path, auth))
        fault = hub.take_fault(name, path)
        if fault is not None and fault.kind == "too_many":
            return self._send_json({"error": "rate limited"}, 429, {"Retry-After": fault.retry_after})
        if name == "cdn":
            return self._serve_cdn(path, fault)
        if hub.token is not None and auth != f"Bearer {hub.token}":
            return self._send_json({"error": "Invalid credentials in Authorization header"}, 401)
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "datasets"] and len(parts) >= 6 and parts[4] == "revision":
            return self._serve_revision("/".join(parts[2:4]), "/".join(parts[5:]))
        if parts[:2] == ["api", "datasets"] and len(parts) >= 6 and parts[4] == "tree":
            query = parse_qs(split.query)
            return self._serve_tree("/".join(parts[2:4]), parts[5], "/".join(parts[6:]), query)
        if parts[0] == "datasets" and len(parts) >= 6 and parts[3] == "resolve":
            return self._serve_resolve("/".join(parts[1:3]), parts[4], "/".join(parts[5:]), fault)
        self._send_json({"error": f"no route for {path}"}, 404)

    def _serve_revision(self, repo: str, revision: str) -> None:
        commit = self.server.hub.resolve(repo, revision)
        if commit is None:
            return self._send_json({"error": f"Revision Not Found: {revision}"}, 404)
        self._send_json({"id": repo, "sha": commit, "private": False})

    def _serve_tree(self, repo: str, revision: str, under: str, query: dict[str, list[str]]) -> None:
        hub = self.server.hub
        commit = hub.resolve(repo, revision)
        if commit is None:
            return self._send_json({"error": f"Revision Not Found: {revision}"}, 404)
        if query.get("recursive") != ["true"]:
            return self._send_json({"error": "this emulator lists recursively only"}, 400)
        start = int(query.get("cursor", ["0"])[0])
        entries = hub.tree_entries(repo, commit, under)
        if under and not entries:
            return self._send_json({"error": f"Entry not found: {under}"}, 404)
        page = entries[start : start + hub.page_size]
        headers = {}
        if start + hub.page_size < len(entries):
            base = f"{hub.url}/api/datasets/{repo}/tree/{quote(revision, safe='')}"
            base += f"/{quote(under)}" if under else ""
            headers["Link"] = f'<{base}?recursive=true&cursor={start + hub.page_size}>; rel="next"'
        self._send_json(page, 200, headers)
        hub.after_tree_page()

    def _serve_resolve(self, repo: str, revision: str, path: str, fault: _Fault | None) -> None:
        hub = self.server.hub
        commit = hub.resolve(repo, revision)
        data = hub.file_bytes(repo, commit, path) if commit else None
        if data is None:
            return self._send_json({"error": "Entry not found"}, 404)
        if hub.is_lfs(path):
            location = f"{hub.url_of('cdn')}/repos/{repo}/{commit}/{quote(path)}"
            return self._send(b"", 302, {"Location": location, "X-Repo-Commit": commit})
        self._send_file(data, fault)

    def _serve_cdn(self, path: str, fault: _Fault | None) -> None:
        parts = path.strip("/").split("/")
        data = None
        if parts[0] == "repos" and len(parts) >= 5:
            data = self.server.hub.file_bytes("/".join(parts[1:3]), parts[3], "/".join(parts[4:]))
        if data is None:
            return self._send(b"NoSuchKey\n", 404)
        self._send_file(data, fault)

    def _send_file(self, data: bytes, fault: _Fault | None) -> None:
        if fault is not None and fault.kind == "wrong_body":
            data = bytes(b ^ 0x5A for b in data)  # same length, other bytes: only a digest tells
        if fault is not None and fault.kind == "cut":
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            with contextlib.suppress(ConnectionError):
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
            self.close_connection = True
            return
        self._send(data, 200, {"Content-Type": "application/octet-stream"})

    def _send_json(self, payload: object, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(json.dumps(payload).encode(), status, {"Content-Type": "application/json", **(headers or {})})

    def _send(self, body: bytes, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(ConnectionError):
            self.wfile.write(body)
