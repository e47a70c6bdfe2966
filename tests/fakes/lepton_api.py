"""EMULATOR of the DGX Cloud Lepton workspace API (a FAKE, not NVIDIA's code) on 127.0.0.1, for NVIDIA's own SDK
(leptonai.api.v2) to drive. Runs each job's workers on this machine as processes; the storage mounts are emulated by
TEXT SUBSTITUTION of each mount path (in the command and the env values) by a local folder. What it models, and
where each point comes from, is in README.md ("The Lepton emulator").

    python lepton_api.py --home DIR [--port N]     (writes DIR/api.json: {"url", "token", "pid"})

Only the standard library is used. State is in memory, guarded by one lock; /_fake/* are the test controls.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

SHAPES = {
    "cpu.small": {"cpu": 1, "memory": 4096, "accelerator_num": 0},
    "cpu.medium": {"cpu": 2, "memory": 8192, "accelerator_num": 0},
    "gpu.8xa100-80gb": {
        "cpu": 128,
        "memory": 2048 * 1024,
        "accelerator_type": "NVIDIA-A100-80GB",
        "accelerator_num": 8,
    },
    "gpu.8xh100-sxm": {"cpu": 192, "memory": 2048 * 1024, "accelerator_type": "NVIDIA-H100-SXM", "accelerator_num": 8},
}
TERMINAL = {"Completed", "Failed", "Stopped", "Deleted"}


class Emulator:
    def __init__(self, home: Path, token: str) -> None:
        self.home, self.token = home, token
        self.lock = threading.RLock()
        self.jobs: dict[str, dict[str, Any]] = {}
        self.archived: set[str] = set()
        self.requests: list[tuple[str, str]] = []
        self.settings: dict[str, Any] = {
            "queue_seconds": 0.3,
            "start_seconds": 0.2,
            "log_delay": 0.5,
            "page_size_cap": 50,
            "quota_cpu": 64,
            "quota_gpu": 8,
            "node_groups": ["ng-demo"],
            "storages": ["node-nfs:lepton-shared-fs"],
            "secrets": {},
            "rules": [],
        }
        (home / "storage").mkdir(parents=True, exist_ok=True)

    # -- create / list ---------------------------------------------------------------------------------
    def create(self, body: dict[str, Any]) -> tuple[int, Any]:
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        job_id = meta.get("id") or meta.get("name")
        with self.lock:
            if job_id in self.jobs:
                return 409, {"code": "AlreadyExists", "message": f"job {job_id} already exists"}
            shape = SHAPES.get(spec.get("resource_shape") or "")
            if shape is None:
                return 400, {
                    "code": "InvalidParameterValue",
                    "message": f"resource shape "
                    f"{spec.get('resource_shape')!r} is not supported in this workspace; supported: "
                    f"{', '.join(SHAPES)}",
                }
            groups = (spec.get("affinity") or {}).get("allowed_dedicated_node_groups") or []
            for group in groups:
                if group not in self.settings["node_groups"]:
                    return 400, {
                        "code": "InvalidParameterValue",
                        "message": f"dedicated node group {group!r} not found",
                    }
            for mount in spec.get("mounts") or []:
                if mount.get("from") not in self.settings["storages"]:
                    return 400, {
                        "code": "InvalidParameterValue",
                        "message": f"mount from {mount.get('from')!r}: no such storage in this workspace's node groups",
                    }
            for env in spec.get("envs") or []:
                ref = (env.get("value_from") or {}).get("secret_name_ref")
                if ref and ref not in self.settings["secrets"]:
                    return 400, {"code": "InvalidParameterValue", "message": f"secret {ref!r} not found"}
            workers = int(spec.get("completions") or 1)
            if (
                shape["cpu"] * workers > self.settings["quota_cpu"]
                or shape["accelerator_num"] * workers > self.settings["quota_gpu"]
            ):
                return 403, {
                    "code": "ResourceQuotaExceeded",
                    "message": f"job needs {shape['cpu'] * workers} "
                    f"CPUs and {shape['accelerator_num'] * workers} GPUs; the workspace's quota is "
                    f"{self.settings['quota_cpu']} CPUs and {self.settings['quota_gpu']} GPUs",
                }
            now = time.time()
            job = {
                "metadata": {
                    **meta,
                    "id": job_id,
                    "name": meta.get("name") or job_id,
                    "created_at": int(now * 1000),
                    "version": 1,
                },
                "spec": spec,
                "status": {"state": "Queueing", "job_name": job_id, "creation_time": int(now), "job_history": []},
                "emu": {
                    "created": now,
                    "workers": {},
                    "events": [],
                    "ended": None,
                    "held": any(
                        rule.get("hold") and job_id.startswith(rule["prefix"]) for rule in self.settings["rules"]
                    ),
                },
            }
            self.jobs[job_id] = job
            return 200, public(job)

    def listed(self, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        mode = (query.get("job_query_mode") or ["alive_only"])[0]
        selector = [pair.split("=", 1) for pair in ((query.get("query") or [""])[0]).split(",") if "=" in pair]
        name = (query.get("q") or [""])[0]
        with self.lock:
            found = []
            for job_id, job in sorted(self.jobs.items(), key=lambda kv: kv[1]["emu"]["created"]):
                archived = job_id in self.archived
                if (mode == "alive_only" and archived) or (mode == "archive_only" and not archived):
                    continue
                labels = job["metadata"].get("labels") or {}
                if all(labels.get(k) == v for k, v in selector) and name in job_id:
                    found.append(public(job))
            return found

    # -- running ---------------------------------------------------------------------------------------
    def tick(self) -> None:
        with self.lock:
            now = time.time()
            for job_id, job in list(self.jobs.items()):
                state, emu = job["status"]["state"], job["emu"]
                if state == "Queueing" and not emu["held"] and now - emu["created"] > self.settings["queue_seconds"]:
                    self.transition(job, "Starting")
                elif state == "Starting" and now - emu["since"] > self.settings["start_seconds"]:
                    for index in range(int(job["spec"].get("completions") or 1)):
                        self.spawn(job, index)
                    self.transition(job, "Running")
                elif state in ("Running", "Restarting"):
                    self.watch(job)
                elif state == "Stopping" and all(w["proc"].poll() is not None for w in emu["workers"].values()):
                    self.finish(job, "Stopped")
                if job["status"]["state"] in TERMINAL and job_id not in self.archived:
                    ttl = job["spec"].get("ttl_seconds_after_finished")
                    if ttl is not None and now - emu["ended"] > float(ttl):
                        self.archived.add(job_id)
                        job["status"]["job_history"].append({"state": job["status"]["state"]})
                        job["status"]["state"] = "Archived"
                        emu["logs_expired"] = True

    def transition(self, job: dict[str, Any], state: str) -> None:
        job["status"]["job_history"].append({"state": job["status"]["state"]})
        job["status"]["state"] = state
        job["emu"]["since"] = time.time()

    def event(self, job: dict[str, Any], kind: str, reason: str) -> None:
        job["emu"]["events"].append(
            {
                "type": kind,
                "reason": reason,
                "count": 1,
                "last_observed_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )

    def finish(self, job: dict[str, Any], state: str) -> None:
        self.transition(job, state)
        job["emu"]["ended"] = time.time()
        job["status"]["completion_time"] = int(time.time())

    def watch(self, job: dict[str, Any]) -> None:
        emu, spec = job["emu"], job["spec"]
        codes = {index: w["proc"].poll() for index, w in emu["workers"].items()}
        for index, code in codes.items():
            worker = emu["workers"][index]
            if code not in (None, 0) and not worker.get("counted"):
                worker["counted"] = True
                if worker["retries"] < int(spec.get("max_failure_retry") or 0):
                    self.event(
                        job,
                        "Warning",
                        f"WorkerRestarted: worker {index} exited with code {code}, restarted "
                        f"({worker['retries'] + 1} of max_failure_retry "
                        f"{spec.get('max_failure_retry')})",
                    )
                    self.spawn(job, index, retries=worker["retries"] + 1)
                    self.transition(job, "Restarting")
                    return
                self.event(job, "Warning", f"BackoffLimitExceeded: worker {index} exited with code {code}")
                self.kill(job)
                job["status"]["failed"] = 1
                self.finish(job, "Failed")
                return
        if job["status"]["state"] == "Restarting":
            self.transition(job, "Running")
        job["status"]["active"] = sum(code is None for code in codes.values())
        if codes and all(code == 0 for code in codes.values()):
            job["status"]["succeeded"] = len(codes)
            self.finish(job, "Completed")

    def spawn(self, job: dict[str, Any], index: int, retries: int = 0) -> None:
        spec, job_id = job["spec"], job["metadata"]["id"]
        mounts = [(m["mount_path"], str(self.storage_folder(m))) for m in spec.get("mounts") or []]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "LEPTON_JOB_NAME": job_id,
            "LEPTON_JOB_WORKER_INDEX": str(index),
            "LEPTON_JOB_TOTAL_WORKERS": str(int(spec.get("completions") or 1)),
            "LEPTON_JOB_SERVICE_PREFIX": job_id,
            "LEPTON_SUBDOMAIN": f"{job_id}-job-svc",
        }
        for item in spec.get("envs") or []:
            ref = (item.get("value_from") or {}).get("secret_name_ref")
            env[item["name"]] = self.settings["secrets"][ref] if ref else substitute(item.get("value") or "", mounts)
        command = [substitute(word, mounts) for word in (spec.get("container") or {}).get("command") or []]
        for rule in self.settings["rules"]:
            if rule.get("fail_worker") == index and job_id.startswith(rule["prefix"]) and rule.get("times", 1) > 0:
                rule["times"] = rule.get("times", 1) - 1
                command = ["sh", "-c", f"echo 'injected failure of worker {index}' >&2; exit {rule.get('code', 3)}"]
        work = self.home / "jobs" / job_id / str(index)
        work.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        old = job["emu"]["workers"].get(index)
        lines = old["lines"] if old else []
        job["emu"]["workers"][index] = {"proc": proc, "retries": retries, "lines": lines}
        threading.Thread(target=read_lines, args=(proc, lines), daemon=True).start()

    def storage_folder(self, mount: dict[str, Any]) -> Path:
        folder = self.home / "storage" / mount["from"].replace(":", "_") / mount.get("path", "/").strip("/")
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def kill(self, job: dict[str, Any]) -> None:
        for worker in job["emu"]["workers"].values():
            if worker["proc"].poll() is None:
                try:
                    os.killpg(worker["proc"].pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def stop(self, job_id: str) -> tuple[int, Any]:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                return 404, {"code": "NotFound", "message": f"job {job_id} not found"}
            job["spec"]["stopped"] = True
            if job["status"]["state"] not in TERMINAL | {"Archived"}:
                self.event(job, "Normal", "Stopped: stopped by the user")
                self.kill(job)
                if job["emu"]["workers"]:
                    self.transition(job, "Stopping")
                else:
                    self.finish(job, "Stopped")
            return 200, {}

    def vanish(self, job_id: str) -> None:
        """The service loses the job (its record gone, workers killed): what `lost` means."""
        with self.lock:
            job = self.jobs.pop(job_id, None)
            if job:
                self.kill(job)

    def log_lines(self, job_id: str, index: int, since: int) -> tuple[list[str], bool] | None:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None or job["emu"].get("logs_expired") or index not in job["emu"]["workers"]:
                return None
            worker = job["emu"]["workers"][index]
            cutoff = time.time() - self.settings["log_delay"]  # logs arrive late: collected, then served
            visible = [line for at, line in worker["lines"][since:] if at <= cutoff]
            done = worker["proc"].poll() is not None and since + len(visible) >= len(worker["lines"])
            return visible, done


def read_lines(proc: subprocess.Popen, lines: list) -> None:
    for raw in proc.stdout:
        lines.append((time.time(), raw.decode("utf-8", "replace")))


def substitute(text: str, mounts: list[tuple[str, str]]) -> str:
    """Each mount path (a whole path component sequence, also inside a file:// URL) -> its local folder (the NGC
    emulator's rule: ngc_jobs.substitute_mounts)."""
    if not mounts:
        return text
    table = {m.rstrip("/") or "/": folder for m, folder in sorted(mounts, key=lambda m: len(m[0]), reverse=True)}
    pattern = re.compile(
        r"(?:(?<![\w.\-/])|(?<=file://))(" + "|".join(re.escape(m) for m in table) + r")(?=/|$|[^\w.\-])"
    )
    return pattern.sub(lambda match: table[match.group(1)], text)


def public(job: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in job.items() if key != "emu"}


def workspace_info(emu: Emulator) -> dict[str, Any]:
    total = {"cpu": emu.settings["quota_cpu"], "memory": 1 << 20, "accelerator_num": emu.settings["quota_gpu"]}
    return {
        "build_time": "emulated",
        "git_commit": "0.0.0-emulator",
        "workspace_name": "emulated",
        "workspace_tier": "enterprise",
        "workspace_state": "normal",
        "supported_shapes": SHAPES,
        "workspace_disk_usage_bytes": 0,
        "workloads": {
            "num_deployments": 0,
            "num_jobs": len(emu.jobs),
            "num_pods": 0,
            "num_secrets": len(emu.settings["secrets"]),
            "num_image_pull_secrets": 0,
        },
        "resource_quota": {"limit": total, "used": {"cpu": 0, "memory": 0, "accelerator_num": 0}},
    }


def handler_for(emu: Emulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def route(self, method: str) -> None:
            url = urlsplit(self.path)
            parts, query = [p for p in url.path.split("/") if p], parse_qs(url.query)
            if parts[:1] == ["_fake"]:
                return self.control(method, parts[1:])
            emu.requests.append((method, url.path))
            if self.headers.get("Authorization") != f"Bearer {emu.token}":
                return self.reply(401, {"code": "Unauthorized", "message": "invalid workspace token"})
            if parts == ["workspace"]:
                return self.reply(200, workspace_info(emu))
            if parts == ["shapes"]:
                return self.reply(200, [{"name": k, **v} for k, v in SHAPES.items()])
            if parts == ["dedicated-node-groups"]:
                volumes = [
                    {"from": "nfs", "name": v.split(":", 1)[1], "size_in_gb": 1024} for v in emu.settings["storages"]
                ]
                return self.reply(
                    200,
                    [
                        {"metadata": {"id": g, "name": g}, "spec": {"volumes": volumes}, "status": {"ready_nodes": 4}}
                        for g in emu.settings["node_groups"]
                    ],
                )
            if parts == ["usersecrets"]:
                return self.reply(200, [{"name": n, "value": "***"} for n in emu.settings["secrets"]])
            if parts == ["jobs"] and method == "POST":
                return self.reply(*emu.create(self.body()))
            if parts == ["jobs"]:
                jobs = emu.listed(query)
                size = min(int((query.get("page_size") or ["50"])[0]), emu.settings["page_size_cap"])
                page = int((query.get("page") or ["1"])[0])
                return self.reply(200, {"jobs": jobs[(page - 1) * size : page * size]})
            if len(parts) >= 2 and parts[0] == "jobs":
                return self.job(method, parts[1], parts[2:], query)
            self.reply(404, {"code": "NotFound", "message": f"no route {url.path}"})

        def job(self, method: str, job_id: str, rest: list[str], query: dict[str, list[str]]) -> None:
            with emu.lock:
                job = emu.jobs.get(job_id)
                mode = (query.get("job_query_mode") or ["alive_and_archive"])[0]
                if job is None or (job_id in emu.archived and mode == "alive_only"):
                    return self.reply(404, {"code": "NotFound", "message": f"job {job_id} not found"})
                if not rest and method == "GET":
                    return self.reply(200, public(job))
                if not rest and method == "PATCH":
                    if (self.body().get("spec") or {}).get("stopped"):
                        return self.reply(*emu.stop(job_id))
                    return self.reply(400, {"code": "InvalidParameterValue", "message": "only spec.stopped"})
                if not rest and method == "DELETE":
                    emu.kill(job)
                    emu.jobs.pop(job_id)
                    return self.reply(200, {})
                if rest == ["events"]:
                    return self.reply(200, job["emu"]["events"])
                if rest == ["replicas"]:
                    if job["emu"].get("logs_expired"):
                        return self.reply(200, [])
                    return self.reply(
                        200,
                        [
                            {"metadata": {"id": f"{job_id}-{i}"}, "id": f"{job_id}-{i}"}
                            for i in sorted(job["emu"]["workers"])
                        ],
                    )
            if len(rest) == 3 and rest[0] == "replicas" and rest[2] == "log":
                return self.stream_log(job_id, int(rest[1].rsplit("-", 1)[1]))
            self.reply(404, {"code": "NotFound", "message": "no such route"})

        def stream_log(self, job_id: str, index: int) -> None:
            """What the service holds of the worker's log, then new lines while it runs; closed after a second
            without any (the SDK's docstring: streams may be dropped)."""
            first = emu.log_lines(job_id, index, 0)
            if first is None:
                return self.reply(404, {"code": "NotFound", "message": f"no log for {job_id} worker {index}"})
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            sent, quiet = 0, time.monotonic()
            while True:
                got = emu.log_lines(job_id, index, sent)
                if got is None:
                    break
                lines, done = got
                if lines:
                    data = "".join(lines).encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    sent += len(lines)
                    quiet = time.monotonic()
                if done or time.monotonic() - quiet > 1.0:
                    break
                time.sleep(0.1)
            self.wfile.write(b"0\r\n\r\n")

        def control(self, method: str, parts: list[str]) -> None:
            if parts == ["settings"] and method == "POST":
                with emu.lock:
                    emu.settings.update(self.body())
                return self.reply(200, {k: v for k, v in emu.settings.items()})
            if parts == ["requests"]:
                if method == "DELETE":
                    emu.requests.clear()
                return self.reply(200, emu.requests)
            if parts == ["jobs"]:
                with emu.lock:
                    return self.reply(
                        200,
                        {
                            i: {
                                "state": j["status"]["state"],
                                "labels": j["metadata"].get("labels"),
                                "archived": i in emu.archived,
                                "created": j["emu"]["created"],
                            }
                            for i, j in emu.jobs.items()
                        },
                    )
            if len(parts) == 2 and parts[0] == "release":
                with emu.lock:
                    for job_id, job in emu.jobs.items():
                        if job_id.startswith(parts[1]):
                            job["emu"]["held"] = False
                    emu.settings["rules"] = [
                        r for r in emu.settings["rules"] if not (r.get("hold") and r["prefix"].startswith(parts[1]))
                    ]
                return self.reply(200, {})
            if len(parts) == 2 and parts[0] == "vanish":
                emu.vanish(parts[1])
                return self.reply(200, {})
            self.reply(404, {"message": "no such control"})

        def do_GET(self) -> None:  # noqa: N802
            self.route("GET")

        def do_POST(self) -> None:  # noqa: N802
            self.route("POST")

        def do_PATCH(self) -> None:  # noqa: N802
            self.route("PATCH")

        def do_DELETE(self) -> None:  # noqa: N802
            self.route("DELETE")

    return Handler


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--home", required=True, type=Path)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default=os.environ.get("LEPTON_FAKE_TOKEN", "emulated-token"))
    args = parser.parse_args()
    emu = Emulator(args.home, args.token)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler_for(emu))
    server.daemon_threads = True

    def ticking() -> None:
        while True:
            time.sleep(0.05)
            emu.tick()

    threading.Thread(target=ticking, daemon=True).start()

    def stop(*_: Any) -> None:
        with emu.lock:
            for job in emu.jobs.values():
                emu.kill(job)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    info = {"url": f"http://127.0.0.1:{server.server_address[1]}", "token": args.token, "pid": os.getpid()}
    tmp = args.home / "api.json.tmp"
    tmp.write_text(json.dumps(info))
    tmp.replace(args.home / "api.json")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
