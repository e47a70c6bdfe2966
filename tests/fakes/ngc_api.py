#!/usr/bin/env python3
"""EMULATOR of the NGC REST API, the part NVIDIA's Base Command client (ngcsdk 4.19.1) calls. NOT NVIDIA's service.

It serves HTTPS on 127.0.0.1 with a certificate made for the test run (NVIDIA's client forces https on
``NGC_CLI_API_URL`` and ``NGC_CLI_AUTH_URL``; the client trusts the certificate through ``REQUESTS_CA_BUNDLE``),
and the storage service's gRPC ``DataSetService/Put`` that ``workspace upload`` streams files to (trusted
through ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``). Answers follow ngcsdk's API data classes
(``basecommand/data/api/*``), which NVIDIA's client parses and prints: ``job run/info/list/log/kill/resume/
preempt/telemetry`` and ``workspace create/info/upload`` all run NVIDIA's own code end to end.

Jobs run on this machine (tests/fakes/ngc_jobs.py: a supervisor process per job, replicas as processes, the
local ``bcprun`` stand-in). State, test controls and the request log live in ``$NGC_FAKE_HOME``
(tests/fakes/ngc_control.py); ``FakeNgc.start()`` runs this server as a process and waits for ``api.json``.

    python tests/fakes/ngc_api.py HOME      # serve until SIGTERM; writes HOME/api.json {url, grpc, ca, pid}

The API key (checked at the token exchange) is never logged or stored: the request log keeps method, path,
query and status only.
"""

from __future__ import annotations

import base64
import datetime
import fnmatch
import hashlib
import http.server
import ipaddress
import json
import os
import re
import secrets
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

FAKES_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(FAKES_DIR))
import ngc_control as nc  # noqa: E402
import ngc_jobs as jobs  # noqa: E402
import ngc_telemetry as telemetry  # noqa: E402
from ngc_jobs import ApiError  # noqa: E402

DEFAULT_PAGE_SIZE = 100
STORAGE_CLUSTER = "emu-storage-cluster-0001"
INSTANCES = ("dgxa100.80g.1.norm", "dgxa100.80g.2.norm", "dgxa100.80g.4.norm", "dgxa100.80g.8.norm",
             "dgxh100.80g.8.norm", "dgxa100.40g.8.norm")  # fmt: skip

Handler = Callable[["Request"], Any]
ROUTES: list[tuple[str, re.Pattern[str], Handler]] = []


def route(method: str, pattern: str) -> Callable[[Handler], Handler]:
    """Register a handler for METHOD and a path regex (named groups become ``request.params``)."""

    def register(func: Handler) -> Handler:
        ROUTES.append((method, re.compile(f"^{pattern}$"), func))
        return func

    return register


class Request:
    """One API request as a handler sees it."""

    def __init__(
        self,
        server: ApiServer,
        method: str,
        path: str,
        query: dict[str, list[str]],
        body: bytes,
        params: dict[str, str],
    ) -> None:
        self.server = server
        self.home = server.home
        self.method = method
        self.path = path
        self.query = query
        self.body = body
        self.params = params

    def arg(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[0] if values else default

    def json(self) -> dict[str, Any]:
        try:
            return json.loads(self.body or b"{}")
        except ValueError:
            raise ApiError(400, "request body is not JSON") from None


# ----------------------------------------------------------------------------------------------------------------
# Account: token exchange, user, org, products, ACE, image registry


@route("GET", r"/token")
def token(request: Request) -> dict[str, Any]:
    """``GET /token?service=ngc&scope=...`` with ``Basic base64($oauthtoken:KEY)``: a bearer token."""
    return {"token": request.server.token, "expires_in": 3600}


@route("POST", r"/v3/keys/get-caller-info")
def caller_info(request: Request) -> dict[str, Any]:
    """What a personal or service key (``nvapi-...``) is: its org and kind. An open endpoint (no bearer); the
    key comes as the form field ``credentials``. ngcsdk asks it before using such a key as its bearer."""
    key = (parse_qs(request.body.decode(errors="replace")).get("credentials") or [""])[0]
    if not request.server.scoped_key or key != request.server.api_key:
        raise ApiError(401, "Invalid credentials (emulator: not the nvapi- key FakeNgc was started with)")
    variants = nc.read_variants(request.home)
    org = variants["key_org"] or request.server.org
    info: dict[str, Any] = {"type": variants["key_type"], "orgName": org, "products": [{"name": "base-command"}]}
    if variants["key_type"] != "SERVICE_KEY":
        info["user"] = {
            "id": jobs.USER_ID,
            "name": jobs.USER,
            "roles": [
                {"org": {"name": org}, "orgRoles": ["BASE_COMMAND_USER"]},
                {"org": {"name": org}, "team": {"name": TEAM}, "orgRoles": [], "teamRoles": ["BASE_COMMAND_USER"]},
            ],
        }
    return info


@route("GET", r"/v2/products")
def products(request: Request) -> dict[str, Any]:
    return {"products": []}


@route("GET", r"/v2/users/me")
def users_me(request: Request) -> dict[str, Any]:
    org = request.server.org
    return {
        "user": {
            "id": jobs.USER_ID,
            "name": jobs.USER,
            "email": "emulated.user@example.invalid",
            "roles": [
                {"org": {"name": org, "displayName": org}, "orgRoles": ["BASE_COMMAND_USER", "REGISTRY_USER"]},
                {
                    "org": {"name": org, "displayName": org},
                    "team": {"name": TEAM},
                    "orgRoles": [],
                    "teamRoles": ["BASE_COMMAND_USER"],
                },
            ],
        },
        "requestStatus": _ok(),
    }


@route("GET", r"/v2/orgs/(?P<org>[^/]+)")
def org_detail(request: Request) -> dict[str, Any]:
    # isDatasetServiceEnabled false: workspaces and results go through the ACE's storage service (gRPC).
    return {
        "organizations": {
            "name": request.params["org"],
            "displayName": request.params["org"],
            "isDatasetServiceEnabled": False,
        },
        "requestStatus": _ok(),
    }


@route("GET", r"/v2/orgs")
def orgs(request: Request) -> dict[str, Any]:
    org = request.server.org
    return _page(request, "organizations", [{"name": org, "displayName": org}])


TEAM = "bcpp-test-team"  # the org's one team (a config may name it, or no team)


@route("GET", r"/v2/org/(?P<org>[^/]+)/teams")
def teams(request: Request) -> dict[str, Any]:
    return _page(request, "teams", [{"name": TEAM, "description": "emulated team"}])


@route("GET", r"/v2/org/(?P<org>[^/]+)(?:/team/[^/]+)?/aces")
def aces(request: Request) -> dict[str, Any]:
    return _page(request, "aces", [{"id": jobs.ACE_ID, "name": request.server.ace}])


@route("GET", r"/v2/org/(?P<org>[^/]+)(?:/team/[^/]+)?/aces/(?P<ace>[^/]+)")
def ace_detail(request: Request) -> dict[str, Any]:
    name = unquote(request.params["ace"])
    limits = nc.read_variants(request.home)["ace"]
    ace_level = {
        key: limits[key]
        for key in ("maxRuntimeSeconds", "maxActiveJobsPerUser", "maxAllowedReplicas", "terminationGracePeriodSeconds")
        if limits[key] is not None
    }
    per_instance = {
        "allowMultinode": bool(limits["allowMultinode"]),
        "multiNodeSupportedArrayTypes": list(limits["multiNodeSupportedArrayTypes"]),
    }
    return {
        "ace": {
            "id": jobs.ACE_ID,
            "name": name,
            **ace_level,
            "grpcEnabled": False,
            "instances": [
                {
                    "name": instance,
                    "type": "GPU",
                    **per_instance,
                    **({"gpus": gpus} if (gpus := jobs.instance_gpus(instance)) else {}),
                }
                for instance in INSTANCES
            ],
            "storageServiceConfig": [
                {
                    "isDefault": True,
                    "type": "NFS",
                    "grpcPort": request.server.grpc_port,
                    "storageClusterUuid": STORAGE_CLUSTER,
                }
            ],
        },
        "requestStatus": _ok(),
    }


@route("GET", r"/v2/org/(?P<org>[^/]+)/users/(?P<user>\d+)/quota")
def storage_quota(request: Request) -> dict[str, Any]:
    return {
        "userStorageQuotas": [
            {
                "storageClusterUuid": STORAGE_CLUSTER,
                "available": 1 << 50,
                "quota": 1 << 50,
                "aceName": request.arg("ace-name"),
            }
        ],
        "requestStatus": _ok(),
    }


@route("GET", r"/v2/org/(?P<org>[^/]+)(?:/team/(?P<team>[^/]+))?/repos/(?P<repo>[^/]+)")
def repo_detail(request: Request) -> dict[str, Any]:
    return {"name": request.params["repo"], "latestTag": "latest", "requestStatus": _ok()}


@route("GET", r"/v2/org/(?P<org>[^/]+)(?:/team/(?P<team>[^/]+))?/repos/(?P<repo>[^/]+)/images(?:/(?P<tag>[^/]+))?")
def repo_images(request: Request) -> dict[str, Any]:
    tag = request.params.get("tag") or "latest"
    _refuse_missing_image(request, tag)
    return {
        "images": [{"tag": tag, "architectureVariants": [{"architecture": "amd64", "os": "linux"}]}],
        "requestStatus": _ok(),
    }


@route("GET", r"/v2/org/(?P<org>[^/]+)(?:/team/(?P<team>[^/]+))?/repos/(?P<repo>[^/]+)/tags/(?P<tag>[^/]+)")
def repo_tag(request: Request) -> dict[str, Any]:
    """`registry image info ORG/[TEAM/]REPO:TAG` (ngcsdk's `get_tag_meta`): a MetaImageDetails."""
    tag = unquote(request.params["tag"])
    _refuse_missing_image(request, tag)
    digest = "sha256:" + hashlib.sha256(f"{request.path}".encode()).hexdigest()
    return {
        "tag": tag,
        "digest": digest,
        "size": 20 << 30,
        "isMultiArchitecture": False,
        "architectureVariants": [{"architecture": "amd64", "os": "linux", "digest": digest}],
        "requestStatus": _ok(),
    }


def _refuse_missing_image(request: Request, tag: str) -> None:
    """Every image exists unless a test named it missing (`FakeNgc.set_missing_images`): 404 as the registry."""
    team = request.params.get("team")
    name = "/".join(p for p in (request.params["org"], team, unquote(request.params["repo"])) if p) + f":{tag}"
    if name in nc.read_json(request.home / "control.json", {}).get("missing_images", []):
        raise ApiError(404, f"Image '{name}' could not be found.")


@route("GET", r"/v2/sms/orgs/(?P<org>[^/]+)/secrets")
def user_secrets(request: Request) -> dict[str, Any]:
    """`ngc user secret list` (ngcsdk's SecretsAPI.list): a SecretGetResponse with names and key names only;
    `?name=N` narrows to one secret (`secret info`). Values never leave the emulator through the API."""
    known = nc.read_json(request.home / "secrets.json", {})
    wanted = request.arg("name")
    items = [
        {"name": name, "description": "", "enabled": True, "kv": [{"key": key} for key in sorted(values)]}
        for name, values in sorted(known.items())
        if wanted in (None, name)
    ]
    return {"secrets": items, "version": "1", "requestStatus": _ok()}


# ----------------------------------------------------------------------------------------------------------------
# Jobs

JOBS = r"/v2/org/(?P<org>[^/]+)(?:/team/(?P<team>[^/]+))?/jobs"


@route("POST", JOBS)
def submit_job(request: Request) -> dict[str, Any]:
    body = request.json()
    if not body.get("name") or not body.get("aceInstance"):
        raise ApiError(400, "JobCreateRequest needs name and aceInstance")
    jobs.check_ace_limits(body, nc.read_variants(request.home)["ace"])
    entry = jobs.create_job(request.home, body, org=request.params["org"], team=request.params.get("team"))
    return {"job": entry["job"], "jobStatusHistory": [], "requestStatus": _ok()}


@route("GET", JOBS)
def list_jobs(request: Request) -> dict[str, Any]:
    """``orderBy=CREATED_DATE_DESC``, dates, status, labels; paged by ``page-size``/``page-number``."""
    org = request.params["org"]
    selected = [
        entry["job"]
        for entry in nc.read_state(request.home)["jobs"].values()
        if entry["job"].get("orgName") == org and jobs.list_matches(entry["job"], request.query)
    ]
    if request.arg("page-number") in (None, "0"):  # a list call (its later pages follow the first one's view)
        request.server.lagging = _lagging(request, selected)
    selected = [job for job in selected if job["id"] not in request.server.lagging]
    selected.sort(key=lambda job: (job["createdDate"], job["id"]), reverse=True)
    return _page(request, "jobs", selected)


def _lagging(request: Request, jobs_found: list[dict[str, Any]]) -> set[int]:
    """Ids of jobs the list index does not show yet (variants ``list_lag_seconds`` / ``list_lag_calls``): younger
    than the lag, or seen by fewer list calls than the lag (each list call counts once per job it would show)."""
    variants = nc.read_variants(request.home)
    lag_seconds, lag_calls = float(variants["list_lag_seconds"] or 0), int(variants["list_lag_calls"] or 0)
    if not (lag_seconds or lag_calls):
        return set()
    hidden, server_now = set(), nc.now()
    with request.server.counter_lock:
        for job in jobs_found:
            seen = request.server.list_views[job["id"]] = request.server.list_views.get(job["id"], 0) + 1
            if seen <= lag_calls or server_now - nc.parse_iso(job["createdDate"]) < lag_seconds:
                hidden.add(job["id"])
    return hidden


def _job_entry(request: Request) -> dict[str, Any]:
    entry = nc.read_state(request.home)["jobs"].get(request.params["id"])
    if entry is None or entry["job"].get("orgName") != request.params["org"]:
        raise ApiError(404, f"Job '{request.params['id']}' could not be found.")
    return entry


@route("GET", JOBS + r"/(?P<id>\d+)")
def job_info(request: Request) -> dict[str, Any]:
    entry = _job_entry(request)
    return {"job": entry["job"], "jobStatusHistory": entry["jobStatusHistory"], "requestStatus": _ok()}


@route("DELETE", JOBS + r"/(?P<id>\d+)")
def kill_job(request: Request) -> dict[str, Any]:
    _job_entry(request)
    jobs.kill(request.home, int(request.params["id"]), request.arg("reason"))
    return {"requestStatus": _ok()}


@route("PATCH", JOBS + r"/(?P<id>\d+)/preempt")
def preempt_job(request: Request) -> dict[str, Any]:
    _job_entry(request)
    jobs.preempt(request.home, int(request.params["id"]))
    return {"requestStatus": _ok()}


@route("PATCH", JOBS + r"/(?P<id>\d+)/resume")
def resume_job(request: Request) -> dict[str, Any]:
    _job_entry(request)
    jobs.resume(request.home, int(request.params["id"]))
    return {"requestStatus": _ok()}


@route("GET", r"/v2/org/(?P<org>[^/]+)/jobs/(?P<id>\d+)(?:/replicas/(?P<replica>\d+))?/telemetry")
def job_telemetry(request: Request) -> dict[str, Any]:
    """`job telemetry ID[:R]`: a MeasurementResultListResponse (tests/fakes/ngc_telemetry.py says what is in it)."""
    replica = request.params.get("replica")
    return {
        **telemetry.telemetry(
            request.home, _job_entry(request), None if replica is None else int(replica), request.arg("q")
        ),
        "requestStatus": _ok(),
    }


# ----------------------------------------------------------------------------------------------------------------
# Results: a replica's folder, and its joblog.log (what `job log ID:N` downloads)

RESULTS = r"/v2/org/(?P<org>[^/]+)/resultsets/(?P<id>\d+)/replicas/(?P<replica>\d+)"


def _results_dir(request: Request) -> Path:
    return request.home / "jobs" / request.params["id"] / "results" / request.params["replica"]


@route("GET", RESULTS)
def resultset(request: Request) -> dict[str, Any]:
    folder = _results_dir(request)
    if not folder.is_dir():
        raise ApiError(404, f"Resultset '{request.params['id']}' could not be found.")
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    listed = [{"path": "/" + p.relative_to(folder).as_posix(), "fileSize": p.stat().st_size} for p in files]
    return _page(request, "resultsetFiles", listed, extra={"resultset": {"id": request.params["id"]}})


@route("GET", RESULTS + r"/file/joblog\.log")
def joblog(request: Request) -> bytes:
    """The log as is; ``lines=N&log-order=FIRST|LAST`` keeps the first or last N lines."""
    path = _results_dir(request) / "joblog.log"
    if not path.is_file():
        raise ApiError(404, "There is no log file available to download yet.")
    data = path.read_bytes()
    lines = int(request.arg("lines") or 0)
    if lines:
        kept = data.splitlines(keepends=True)
        data = b"".join(kept[:lines] if request.arg("log-order") == "FIRST" else kept[-lines:])
    return data


# ----------------------------------------------------------------------------------------------------------------
# Workspaces (the upload itself streams over gRPC: see UploadService below)

WORKSPACES = r"/v2/org/(?P<org>[^/]+)(?:/team/[^/]+)?/workspaces"


@route("POST", WORKSPACES)
def create_workspace(request: Request) -> dict[str, Any]:
    body = request.json()
    name = body.get("name")
    if not name:
        raise ApiError(400, "WorkspaceCreateRequest needs a name")
    with nc.update_state(request.home) as state:
        if name in state.get("workspaces", {}):
            raise ApiError(409, f"Workspace with name '{name}' already exists in org '{request.params['org']}'.")
        workspace = nc.ensure_workspace(request.home, state, name, org=request.params["org"], ace=body.get("aceName"))
    return {"workspace": _workspace_view(request, name, workspace), "requestStatus": _ok()}


@route("GET", WORKSPACES + r"/(?P<ref>[^/]+)")
def workspace_info(request: Request) -> dict[str, Any]:
    name, workspace = jobs.find_workspace(nc.read_state(request.home), unquote(request.params["ref"]))
    return {"workspace": _workspace_view(request, name, workspace), "requestStatus": _ok()}


def _workspace_view(request: Request, name: str, workspace: dict[str, Any]) -> dict[str, Any]:
    folder = request.home / "workspaces" / name
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return {
        **workspace,
        "aceName": workspace.get("aceName") or request.server.ace,
        "sizeInBytes": size,
        "creatorUserId": jobs.USER_ID,
        "aceStorageServiceUrl": "https://127.0.0.1",
    }


# ----------------------------------------------------------------------------------------------------------------
# Plumbing: paging, the HTTP handler, faults, the request log


def _ok() -> dict[str, Any]:
    return {"statusCode": "SUCCESS", "requestId": f"emu-{secrets.token_hex(6)}"}


def _page(request: Request, key: str, items: list[Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """``page-size`` (capped by the test control ``page_size``) and ``page-number``; paginationInfo as NGC sends."""
    control = nc.read_json(request.home / "control.json", {})
    size = max(1, min(int(request.arg("page-size") or DEFAULT_PAGE_SIZE), int(control.get("page_size") or 10**9)))
    number = int(request.arg("page-number") or 0)
    total_pages = max(1, -(-len(items) // size))
    return {
        key: items[number * size : (number + 1) * size],
        **(extra or {}),
        "requestStatus": _ok(),
        "paginationInfo": {"index": number, "size": size, "totalResults": len(items), "totalPages": total_pages},
    }


def _error_body(status: int, message: str) -> bytes:
    code = {400: "INVALID_REQUEST", 401: "UNAUTHORIZED", 404: "NOT_FOUND", 409: "CONFLICT"}.get(status, "ERROR")
    return json.dumps(
        {
            "requestStatus": {
                "statusCode": code,
                "statusDescription": message,
                "requestId": f"emu-{secrets.token_hex(6)}",
            }
        }
    ).encode()


class _HttpHandler(http.server.BaseHTTPRequestHandler):
    server: _HttpServer
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        api = self.server.api
        started = time.monotonic()
        split = urlsplit(self.path)
        path = split.path.rstrip("/") or "/"
        query = parse_qs(split.query, keep_blank_values=True)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        status, payload, content_type = 200, b"", "application/json"
        try:
            api.check_auth(path, self.headers.get("Authorization") or "")
            fault = api.take_fault(self.command, path)
            if fault and not fault.get("after"):
                time.sleep(float(fault.get("delay_seconds") or 0))
            if fault.get("status"):
                raise ApiError(fault["status"], fault.get("message") or f"emulated fault ({fault['status']})")
            handler, params = _match(self.command, path)
            result = handler(Request(api, self.command, path, query, body, params))
            if fault.get("after"):  # done, but the answer comes late: a client may give up or die meanwhile
                time.sleep(float(fault.get("delay_seconds") or 0))
            if isinstance(result, bytes):
                payload, content_type = result, "application/octet-stream"
            else:
                payload = json.dumps(result).encode()
        except ApiError as error:
            status, payload = error.status, _error_body(error.status, error.message)
        except nc.FakeStateError as error:  # a corrupt state file is reported, never silently reset
            status, payload = 500, _error_body(500, f"tests/fakes/ngc_api: {error}")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        api.log_request(self.command, path, split.query, status, time.monotonic() - started)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

    def log_message(self, *args: Any) -> None:  # the request log is calls.jsonl's neighbour, requests.jsonl
        pass


def _match(method: str, path: str) -> tuple[Handler, dict[str, str]]:
    allowed = False
    for verb, pattern, handler in ROUTES:
        found = pattern.match(path)
        if found:
            if verb == method:
                return handler, {k: v for k, v in found.groupdict().items() if v is not None}
            allowed = True
    if allowed:
        raise ApiError(405, f"{method} is not allowed on {path}")
    raise ApiError(404, f"{method} {path} is not emulated by tests/fakes/ngc_api.py")


class _HttpServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    api: ApiServer


class ApiServer:
    """The emulator: HTTPS API + gRPC storage service, sharing one state folder."""

    def __init__(self, home: Path, *, api_key: str, org: str, ace: str, tls_dir: Path) -> None:
        self.home = home
        self.api_key = api_key
        self.org = org
        self.ace = ace
        # A personal or service key (nvapi-...) is itself the bearer (ngcsdk: SCOPED_KEY_PREFIX); a legacy key
        # is exchanged for a token at /token first.
        self.scoped_key = api_key.startswith("nvapi-")
        self.token = api_key if self.scoped_key else f"emu-token-{secrets.token_hex(16)}"
        # API calls send the token as is; file downloads (HTTPDownloadAdapter) send it base64-encoded.
        self.bearer_headers = {f"Bearer {self.token}", f"Bearer {base64.b64encode(self.token.encode()).decode()}"}
        self.lagging: set[int] = set()  # `job list`'s lag (variants): what the last first page left out
        self.list_views: dict[int, int] = {}
        self.counter_lock = threading.Lock()
        self.tls = make_certificate(tls_dir)
        self.grpc_port = 0
        self.http = _HttpServer(("127.0.0.1", 0), _HttpHandler)
        self.http.api = self
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.tls["cert"], self.tls["key"])
        self.http.socket = context.wrap_socket(self.http.socket, server_side=True)
        self._log_lock = threading.Lock()

    def check_auth(self, path: str, header: str) -> None:
        if path == "/v3/keys/get-caller-info":
            return  # open: the key is in the body
        if path == "/token" and self.scoped_key:
            raise ApiError(401, "emulator: an nvapi- key is used directly as the bearer, not exchanged at /token")
        if path == "/token":
            scheme, _, value = header.partition(" ")
            try:
                user, _, key = base64.b64decode(value).decode().partition(":")
            except ValueError:
                user = key = ""
            if scheme != "Basic" or user != "$oauthtoken" or key != self.api_key:
                raise ApiError(401, "Invalid API key (emulator: the key FakeNgc was started with)")
        elif header not in self.bearer_headers:
            raise ApiError(401, "Missing or expired bearer token")
        elif self.scoped_key and "/repos/" not in path:  # such a key has one org: another org's jobs,
            org = re.match(r"^/v2/orgs?/([^/]+)", path)  # ACEs... are not its to see (images may be public)
            key_org = nc.read_variants(self.home)["key_org"] or self.org
            if org and unquote(org.group(1)) != key_org:
                raise ApiError(403, f"Forbidden: the API key has no access to org '{unquote(org.group(1))}'")

    def take_fault(self, method: str, path: str) -> dict[str, Any]:
        """The first matching test fault (``fail_requests`` / ``delay_requests``), consumed; {} when none."""

        def matches(fault: dict[str, Any]) -> bool:
            return method in (fault.get("method") or method).split(",") and fnmatch.fnmatchcase(
                path, fault.get("path") or "*"
            )

        if not any(map(matches, nc.read_json(self.home / "control.json", {}).get("faults", []))):
            return {}  # the common case, answered without taking the lock
        with nc.update_control(self.home) as control:
            faults = control.get("faults", [])
            for fault in filter(matches, faults):
                fault["count"] -= 1
                control["faults"] = [f for f in faults if f["count"] > 0]
                return fault
        return {}

    def log_request(self, method: str, path: str, query: str, status: int, seconds: float) -> None:
        record = {
            "method": method,
            "path": path,
            "query": query,
            "status": status,
            "duration_s": round(seconds, 4),
            "ts": nc.iso_now(),
        }
        with self._log_lock, open(self.home / "requests.jsonl", "a", encoding="utf-8") as log:
            log.write(json.dumps(record) + "\n")

    def serve(self) -> None:
        """Serve HTTPS and gRPC until SIGTERM/SIGINT; announce the addresses in api.json."""
        grpc_server = start_grpc(self)
        url = f"https://127.0.0.1:{self.http.server_address[1]}"
        nc.write_json(
            self.home / "api.json",
            {"url": url, "grpc": f"127.0.0.1:{self.grpc_port}", "ca": str(self.tls["cert"]), "pid": os.getpid()},
        )
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        thread = threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        thread.start()
        stop.wait()
        self.http.shutdown()
        grpc_server.stop(grace=1)


# ----------------------------------------------------------------------------------------------------------------
# The storage service's gRPC upload (what `workspace upload` streams to)


def start_grpc(api: ApiServer) -> Any:
    """``DataSetService/Put`` over TLS: a key message, then chunks until ``last``; files land in the workspace."""
    from concurrent import futures

    import grpc
    from ngcbase.transfer.grpc.proto_py import upload_pb2, upload_pb2_grpc

    started, finished = 1, 3  # GRPCUploadAdapter.RESPONSE_STATUS_STARTED / _FINISHED

    class UploadService(upload_pb2_grpc.DataSetServiceServicer):
        def Put(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802 (gRPC's name)
            metadata = dict(context.invocation_metadata())
            if metadata.get("jwt") != api.token:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")
            name, _ = jobs.find_workspace(nc.read_state(api.home), metadata.get("id", ""))
            root = (api.home / "workspaces" / name).resolve()
            handle, target, temporary, written = None, None, None, 0
            for message in request_iterator:
                if message.HasField("key"):
                    target = (root / message.key.key.lstrip("/")).resolve()
                    if root not in target.parents:
                        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"key outside the workspace: {message.key.key}")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    temporary = target.with_name(f".{target.name}.upload-{os.getpid()}")
                    handle, written = open(temporary, "wb"), 0  # noqa: SIM115 (closed at `last`)
                    yield upload_pb2.PutResponse(status=started, totalTransfered=0, fileName=message.key.key)
                elif message.HasField("chunk") and handle is not None:
                    handle.write(message.chunk.data)
                    written += len(message.chunk.data)
                    if message.chunk.last:
                        handle.close()
                        os.replace(temporary, target)
                        handle = None
                        api.log_request("GRPC", "DataSetService/Put", f"workspace={name}", 200, 0.0)
                        yield upload_pb2.PutResponse(
                            status=finished, totalTransfered=written, fileName=str(target.relative_to(root))
                        )

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    upload_pb2_grpc.add_DataSetServiceServicer_to_server(UploadService(), server)
    credentials = grpc.ssl_server_credentials([(Path(api.tls["key"]).read_bytes(), Path(api.tls["cert"]).read_bytes())])
    api.grpc_port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server


def make_certificate(folder: Path) -> dict[str, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, made once per state folder (cryptography ships with
    ngcsdk). The client trusts it as its CA bundle; nothing else does."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    if cert.is_file() and key.is_file():
        return {"cert": cert, "key": key}
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bcp-pipeline NGC API emulator")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return {"cert": cert, "key": key}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(
            "usage: ngc_api.py HOME   (env: NGC_FAKE_API_KEY, NGC_FAKE_ORG, NGC_FAKE_ACE, NGC_FAKE_TLS_DIR)",
            file=sys.stderr,
        )
        return 2
    home = Path(argv[0])
    home.mkdir(parents=True, exist_ok=True)
    server = ApiServer(
        home,
        api_key=os.environ["NGC_FAKE_API_KEY"],
        org=os.environ.get("NGC_FAKE_ORG", "bcpp-test-org"),
        ace=os.environ.get("NGC_FAKE_ACE", "bcpp-test-ace"),
        tls_dir=Path(os.environ.get("NGC_FAKE_TLS_DIR") or home / "tls"),
    )
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
