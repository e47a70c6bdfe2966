"""Jobs of the NGC API EMULATOR (tests/fakes/ngc_api.py): records, test rules, secrets and the supervisor.

A job is created from the JobCreateRequest body that NVIDIA's client POSTs. A detached supervisor process
per run attempt (``python ngc_jobs.py __supervise__ HOME ID``) moves it CREATED -> QUEUED -> STARTING ->
RUNNING -> FINISHED_SUCCESS / FAILED, running the commandline with ``bash -c`` once per replica. Mounts are
emulated by TEXT SUBSTITUTION of the mount paths in the commandline and in env values (see README.md).

Test code, not NVIDIA code; standard library only.
"""

from __future__ import annotations

import fnmatch
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FAKES_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(FAKES_DIR))
import ngc_control as nc  # noqa: E402

# Environment the emulator has that jobs must not see (a BCP job gets neither the user's key nor CLI config).
PRIVATE_ENV_PREFIXES = ("NGC_CLI_", "NGC_FAKE_", "REQUESTS_CA_BUNDLE", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH")
ACE_ID = 357
USER = "Emulated User"
USER_ID = 1001
POLL_SECONDS = 0.05
KILL_GRACE_SECONDS = 2.0
JOB_DEFINITION_KEYS = (
    "arrayType", "command", "datasetMounts", "description", "dockerImageName", "entryPoint", "envs",
    "expTrackingParams", "jobOrder", "jobPriority", "minAvailability", "name", "networkType", "portMappings",
    "replicaCount", "resultContainerMountPoint", "runPolicy", "topologyConstraint", "useImageEntryPoint",
    "userSecretsSpec", "workspaceMounts",
)  # fmt: skip


class ApiError(Exception):
    """An error answer of the API: HTTP status and the message NVIDIA's client shows."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# ----------------------------------------------------------------------------------------------------------------
# Creating a job from a JobCreateRequest


def create_job(home: Path, request: dict[str, Any], *, org: str, team: str | None) -> dict[str, Any]:
    """Validate the request against the emulator's state, record the job and start its supervisor."""
    _check_secrets(home, request.get("userSecretsSpec") or [])  # checked again when the job starts
    with nc.update_state(home) as state:
        job_id = state["nextJobId"]
        state["nextJobId"] = job_id + 1
        entry = _new_entry(home, state, job_id, request, org=org, team=team)
        _apply_job_rules(home, entry)
        # Started before the job is written (it waits for our lock): once the job exists, it runs even if
        # the client that asked for it is killed right after, as a job the server accepted does.
        entry["emu"]["supervisorPids"].append(start_supervisor(home, job_id))
        state["jobs"][str(job_id)] = entry
    return entry


def _new_entry(
    home: Path, state: dict[str, Any], job_id: int, request: dict[str, Any], *, org: str, team: str | None
) -> dict[str, Any]:
    now = nc.iso_now()
    mounts, workspace_mounts = _resolve_workspaces(home, state, request.get("workspaceMounts") or [])
    for dataset in request.get("datasetMounts") or []:
        folder = home / "datasets" / str(dataset.get("id") or dataset.get("uuid"))
        folder.mkdir(parents=True, exist_ok=True)
        if dataset.get("containerMountPoint", "").startswith("/"):
            mounts.append([dataset["containerMountPoint"], str(folder)])
    definition = {key: request[key] for key in JOB_DEFINITION_KEYS if request.get(key) not in (None, [], {})}
    definition.update(aceId=ACE_ID, resources=_instance(request.get("aceInstance")))
    definition.setdefault("replicaCount", 1)
    definition.setdefault("jobOrder", 50)
    definition.setdefault("jobPriority", "NORMAL")
    if workspace_mounts:
        definition["workspaceMounts"] = workspace_mounts
    labels = _labels(request)
    if labels:
        definition["labels"] = labels
    job: dict[str, Any] = {
        "aceId": ACE_ID,
        "aceName": request.get("aceName"),
        "createdDate": now,
        "id": job_id,
        "jobDefinition": definition,
        "jobOrder": definition["jobOrder"],
        "jobPriority": definition["jobPriority"],
        "jobStatus": {"createdDate": now, "jobId": job_id, "status": "CREATED", "statusType": "OK"},
        "labels": labels or {"isLocked": False},
        "lastStatusUpdatedDate": now,
        "orgName": org,
        "submittedByUser": USER,
        "submittedByUserId": USER_ID,
    }
    if team:
        job["teamName"] = team
    entry = {
        "job": job,
        "jobStatusHistory": [],
        "emu": {
            "attempt": 0,
            "held": False,
            "inject": None,
            "mounts": mounts,
            "pgids": [],
            "supervisorPids": [],
            "resultMount": request.get("resultContainerMountPoint"),
            "request": request,
        },
    }
    nc.set_status(entry, "CREATED")
    return entry


def _resolve_workspaces(home: Path, state: dict[str, Any], mounts: list[dict[str, Any]]) -> tuple[list, list]:
    """``--workspace NAME_OR_ID:MOUNT[:MODE]`` -> ([[mount, folder]], mounts with the workspace id, as BCP shows)."""
    pairs, shown = [], []
    for mount in mounts:
        name, workspace = find_workspace(state, mount["id"])
        pairs.append([mount["containerMountPoint"], str(home / "workspaces" / name)])
        shown.append(dict(mount, id=workspace["id"]))
    return pairs, shown


def find_workspace(state: dict[str, Any], ref: str) -> tuple[str, dict[str, Any]]:
    """A workspace by name or id, or a 404 as the service answers."""
    for name, workspace in state.get("workspaces", {}).items():
        if ref in (name, workspace["id"]):
            return name, workspace
    raise ApiError(404, f"Workspace '{ref}' not found. (emulator: create it first)")


def _instance(name: str | None) -> dict[str, Any]:
    """``resources`` (AceInstance): the name, and the GPU count read from names like dgxa100.80g.8.norm."""
    resources: dict[str, Any] = {"name": name}
    if instance_gpus(name):
        resources["gpus"] = instance_gpus(name)
    return resources


def instance_gpus(name: str | None) -> int:
    """GPUs per node of an instance named like dgxa100.80g.8.norm (0 when the name does not say)."""
    match = re.match(r"^[^.]+\.[^.]+\.(\d+)\.", name or "")
    return int(match.group(1)) if match else 0


def check_ace_limits(request: dict[str, Any], limits: dict[str, Any]) -> None:
    """Refuse a JobCreateRequest the ACE's policy does not allow (variants ``ace``), as a 400. (ngcsdk itself
    refuses a runtime over maxRuntimeSeconds before it sends anything; the service is assumed to check again.)"""
    runtime = (request.get("runPolicy") or {}).get("totalRuntimeSeconds") or 0
    replicas = int(request.get("replicaCount") or 1)
    if limits.get("maxRuntimeSeconds") and runtime > limits["maxRuntimeSeconds"]:
        raise ApiError(400, f"Total runtime {runtime} s exceeds the ACE maximum of {limits['maxRuntimeSeconds']} s.")
    if limits.get("maxAllowedReplicas") and replicas > limits["maxAllowedReplicas"]:
        raise ApiError(400, f"Replica count {replicas} exceeds the ACE maximum of {limits['maxAllowedReplicas']}.")
    if replicas > 1 and not limits.get("allowMultinode"):
        raise ApiError(400, f"Instance '{request.get('aceInstance')}' does not allow multinode jobs in this ACE.")
    if replicas > 1 and request.get("arrayType") not in (limits.get("multiNodeSupportedArrayTypes") or []):
        raise ApiError(
            400,
            f"Array type '{request.get('arrayType')}' is not supported for multinode jobs on "
            f"instance '{request.get('aceInstance')}' (supported: "
            f"{', '.join(limits.get('multiNodeSupportedArrayTypes') or []) or 'none'}).",
        )


def _labels(request: dict[str, Any]) -> dict[str, Any]:
    """JobCreateRequest's userLabels/reservedLabels/systemLabels -> JobLabels ``{"userLabels": {"values": [..]}}``."""
    labels: dict[str, Any] = {}
    for key in ("userLabels", "reservedLabels", "systemLabels"):
        if request.get(key):
            labels[key] = {"values": list(request[key])}
    if labels or request.get("isLabelLocked"):
        labels["isLocked"] = bool(request.get("isLabelLocked"))
    return labels


def all_labels(job: dict[str, Any]) -> list[str]:
    labels = job.get("labels") or {}
    kinds = ("userLabels", "reservedLabels", "systemLabels")
    return [value for kind in kinds for value in (labels.get(kind) or {}).get("values", [])]


def _apply_job_rules(home: Path, entry: dict[str, Any]) -> None:
    """Attach the first matching test rule(s) (inject a status / hold QUEUED) and consume them."""
    if not (home / "control.json").exists():
        return
    name = entry["job"]["jobDefinition"]["name"]
    labels = all_labels(entry["job"])
    with nc.update_control(home) as control:
        kept = []
        for rule in control.get("rules", []):
            matches = (rule.get("name") is None or fnmatch.fnmatchcase(name, rule["name"])) and (
                rule.get("label") is None or any(fnmatch.fnmatchcase(lb, rule["label"]) for lb in labels)
            )
            applied = matches and not (rule["action"] == "status" and entry["emu"]["inject"])
            if applied:
                if rule["action"] == "hold":
                    entry["emu"]["held"] = True
                else:
                    entry["emu"]["inject"] = {k: rule.get(k) for k in ("status", "after_seconds", "details")}
                if rule.get("times") is not None:
                    rule["times"] -= 1
            if rule.get("times") is None or rule["times"] > 0:
                kept.append(rule)
        control["rules"] = kept


def _check_secrets(home: Path, specs: list[dict[str, Any]]) -> dict[str, str]:
    """Secrets to env vars: ``allKeys`` -> every KEY; ``keysSpec`` -> KEY as envName (or KEY)."""
    known = nc.read_json(home / "secrets.json", {})
    env: dict[str, str] = {}
    for spec in specs:
        values = known.get(spec["name"])
        if values is None:
            raise ApiError(404, f"Secret '{spec['name']}' not found. (emulator: define it with FakeNgc.set_secret)")
        if spec.get("allKeys"):
            env.update(values)
        for key in spec.get("keysSpec") or []:
            if key["keyName"] not in values:
                raise ApiError(404, f"Key '{key['keyName']}' not found in secret '{spec['name']}'.")
            env[key.get("envName") or key["keyName"]] = values[key["keyName"]]
    return env


# ----------------------------------------------------------------------------------------------------------------
# Kill, preempt, resume, list


def kill(home: Path, job_id: int, reason: str | None) -> None:
    try:
        found = nc.stop_job(home, job_id, "KILLED_BY_USER", details=reason or "Killed by user")
    except ValueError as why:  # already finished
        raise ApiError(400, str(why)) from None
    if found is None:
        raise ApiError(404, f"Job '{job_id}' could not be found.")


# The real service's words for these refusals are unknown (ngcsdk and NVIDIA's scripts show none): ours, marked so.
RUNONCE_NOT_PREEMPTABLE = (
    "Job '{job_id}' has preempt class RUNONCE and cannot be preempted. (emulator, variant "
    "runonce_preemption=refused: the real wording is unknown)"
)
RUNONCE_NOT_RESUMABLE = (
    "Job '{job_id}' has preempt class RUNONCE and cannot be resumed; submit it again. (emulator, "
    "variant runonce_preemption=not_resumable: the real wording is unknown)"
)


def preempt_class(entry: dict[str, Any]) -> str | None:
    """The job's runPolicy.preemptClass as submitted (``job run --preempt``); None when the request had none."""
    return (entry["job"]["jobDefinition"].get("runPolicy") or {}).get("preemptClass")


def _runonce_refuses(home: Path, entry: dict[str, Any] | None, refusing: str, message: str) -> None:
    """A 400 when the job is RUNONCE and the ``runonce_preemption`` variant is ``refusing``."""
    if (
        entry is not None
        and preempt_class(entry) == "RUNONCE"
        and nc.read_variants(home)["runonce_preemption"] == refusing
    ):
        raise ApiError(400, message.format(job_id=entry["job"]["id"]))


def preempt(home: Path, job_id: int) -> None:
    """`job preempt` (a request: the test control FakeNgc.preempt, the system's preemption, skips this)."""
    _runonce_refuses(home, nc.entry_of(nc.read_state(home), job_id), "refused", RUNONCE_NOT_PREEMPTABLE)
    try:
        found = nc.stop_job(
            home,
            job_id,
            "PREEMPTED",
            details="Preempted by user",
            only_from=frozenset({"CREATED", "QUEUED", "STARTING", "RUNNING"}),
        )
    except ValueError as why:
        raise ApiError(400, str(why)) from None
    if found is None:
        raise ApiError(404, f"Job '{job_id}' could not be found.")


def resume(home: Path, job_id: int) -> None:
    """PREEMPTED -> QUEUED, then a new supervisor re-runs the commandline (appending to the same logs)."""
    with nc.update_state(home) as state:
        entry = nc.entry_of(state, job_id)
        if entry is None:
            raise ApiError(404, f"Job '{job_id}' could not be found.")
        status = entry["job"]["jobStatus"]["status"]
        if status not in ("PREEMPTED", "PREEMPTED_BY_ADMIN"):
            raise ApiError(400, f"Job is {status}; only a PREEMPTED job can be resumed.")
        _runonce_refuses(home, entry, "not_resumable", RUNONCE_NOT_RESUMABLE)
        entry["job"]["resumeRequestedDate"] = nc.iso_now()
        entry["job"]["resumeRequestedByUser"] = USER_ID
        nc.set_status(entry, "QUEUED")
        entry["emu"]["supervisorPids"].append(start_supervisor(home, job_id))


def list_matches(job: dict[str, Any], query: dict[str, list[str]]) -> bool:
    """The server-side filters of ``GET .../jobs``: dates, status, ACE, labels (FILTER_BY_LABELS), priority."""
    created = nc.parse_iso(job["createdDate"])
    if "fromDate" in query and created < nc.parse_iso(query["fromDate"][0]):
        return False
    if "toDate" in query and created > nc.parse_iso(query["toDate"][0]):
        return False
    if query.get("status") and job["jobStatus"]["status"] not in query["status"]:
        return False
    if query.get("aceNames") and job.get("aceName") not in query["aceNames"]:
        return False
    if query.get("jobPriority") and job.get("jobPriority") not in query["jobPriority"]:
        return False
    labels = all_labels(job)
    if query.get("filter") == ["FILTER_BY_LABELS"]:
        include = [p for value in query.get("includeLabels", []) for p in value.split(",") if p]
        exclude = [p for value in query.get("excludeLabels", []) for p in value.split(",") if p]
        if include and not any(fnmatch.fnmatchcase(lb, pat) for lb in labels for pat in include):
            return False
        if any(fnmatch.fnmatchcase(lb, pat) for lb in labels for pat in exclude):
            return False
    return True


# ----------------------------------------------------------------------------------------------------------------
# The job supervisor (one detached process per run attempt)


def start_supervisor(home: Path, job_id: int) -> int:
    """A detached process per run attempt; it outlives the request (own session, no inherited pipes)."""
    job_dir = home / "jobs" / str(job_id)
    job_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("NGC_CLI_API_KEY", "NGC_FAKE_API_KEY")}
    with open(job_dir / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, str(Path(__file__).resolve()), "__supervise__", str(home), str(job_id)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    return proc.pid


def supervise(home: Path, job_id: int) -> int:
    """CREATED -> QUEUED (held while a test says so) -> STARTING -> RUNNING -> end; never overwrites a kill."""
    timing = nc.read_json(home / "timing.json", {})
    queued = float(timing.get("queued_seconds", 0.05))
    starting = float(timing.get("starting_seconds", 0.05))
    limit = float(timing.get("max_job_seconds", 3600))
    born = time.monotonic()
    _transition(home, job_id, {"CREATED"}, "QUEUED")
    time.sleep(queued)
    while True:
        entry = nc.read_state(home)["jobs"].get(str(job_id))
        if entry is None or entry["job"]["jobStatus"]["status"] != "QUEUED":
            return 0  # never written (the submitting request died), or killed/preempted while queued
        if not entry["emu"]["held"] and _may_start(home, job_id):
            break
        if time.monotonic() - born > limit:
            details = "emulator: held longer than its max_job_seconds"
            _transition(home, job_id, {"QUEUED"}, "KILLED_BY_SYSTEM", details)
            return 0
        time.sleep(POLL_SECONDS)
    if not _transition(home, job_id, {"QUEUED"}, "STARTING", may_start=True):
        return 0
    time.sleep(starting)
    procs = _start_replicas(home, job_id)
    return _monitor(home, job_id, procs, limit) if procs else 0


def _transition(
    home: Path, job_id: int, from_states: set[str], to: str, details: str | None = None, may_start: bool = False
) -> bool:
    with nc.update_state(home) as state:
        entry = nc.entry_of(state, job_id)
        if entry is None or entry["job"]["jobStatus"]["status"] not in from_states:
            return False
        if may_start and not _slot_free(state, job_id, nc.read_variants(home)["ace"].get("maxActiveJobsPerUser")):
            return False
        nc.set_status(entry, to, details=details)
        return True


ACTIVE = frozenset({"STARTING", "RUNNING", "PENDING_TERMINATION"})


def _may_start(home: Path, job_id: int) -> bool:
    return _slot_free(nc.read_state(home), job_id, nc.read_variants(home)["ace"].get("maxActiveJobsPerUser"))


def _slot_free(state: dict[str, Any], job_id: int, limit: int | None) -> bool:
    """ACE ``maxActiveJobsPerUser``: a queued job starts only while the user (the emulator has one) has fewer
    jobs started and not ended, and no queued job older than it is waiting for the same slot."""
    if not limit:
        return True
    entries = state["jobs"].values()
    active = sum(1 for e in entries if e["job"]["jobStatus"]["status"] in ACTIVE)
    older_waiting = any(
        e["job"]["id"] < job_id and e["job"]["jobStatus"]["status"] == "QUEUED" and not e["emu"]["held"]
        for e in entries
    )
    return active < int(limit) and not older_waiting


def _start_replicas(home: Path, job_id: int) -> list[subprocess.Popen] | None:
    """Under the lock, so a concurrent kill sees either no processes or all of their process groups."""
    with nc.update_state(home) as state:
        entry = nc.entry_of(state, job_id)
        if entry is None or entry["job"]["jobStatus"]["status"] != "STARTING":
            return None
        emu = entry["emu"]
        emu["attempt"] += 1
        nc.set_status(entry, "RUNNING")
        inject = emu.get("inject")
        if inject and inject.get("after_seconds") == 0:
            emu["inject"] = None
            nc.set_status(entry, inject["status"], details=inject.get("details") or _injected_details(inject))
            return None
        model = nc.read_variants(home)["commandline"]
        entry["emu"]["commandlineModel"] = model
        try:
            procs = [
                _spawn_replica(home, entry, replica, run=replica == 0 or model == "per_replica")
                for replica in range(_replicas(entry))
            ]
            procs = [proc for proc in procs if proc is not None]
        except (OSError, ApiError) as error:
            nc.set_status(entry, "FAILED", details=f"emulator could not start the job: {error}")
            return None
        emu["pgids"] = [proc.pid for proc in procs]
        return procs


def _replicas(entry: dict[str, Any]) -> int:
    return int(entry["job"]["jobDefinition"].get("replicaCount") or 1)


def _spawn_replica(home: Path, entry: dict[str, Any], replica: int, run: bool = True) -> subprocess.Popen | None:
    """Replica `replica`'s folders, and (when `run`) its commandline process. Under the ``launcher`` model only
    replica 0 runs the commandline; the others have an (empty) log and whatever bcprun starts for them."""
    job_id = entry["job"]["id"]
    results = home / "jobs" / str(job_id) / "results" / str(replica)
    work = home / "jobs" / str(job_id) / "work" / str(replica)
    results.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if not run:
        (results / "joblog.log").touch()
        return None
    mounts = [tuple(m) for m in entry["emu"]["mounts"]]
    if entry["emu"].get("resultMount"):
        mounts.append((entry["emu"]["resultMount"], str(results)))
    command = substitute_mounts(entry["job"]["jobDefinition"].get("command") or "", mounts)
    env = _replica_env(home, entry, replica, str(results), mounts)
    with open(results / "joblog.log", "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(  # pylint: disable=consider-using-with
            ["bash", "-c", command],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def substitute_mounts(text: str, mounts: list[tuple[str, str]]) -> str:
    """Replace each mount path (a whole path component sequence, also inside a file:// URL) by its local folder."""
    if not mounts:
        return text
    ordered = sorted(mounts, key=lambda m: len(m[0]), reverse=True)
    table = {m.rstrip("/") or "/": folder for m, folder in ordered}
    pattern = re.compile(
        r"(?:(?<![\w.\-/])|(?<=file://))(" + "|".join(re.escape(m) for m in table) + r")(?=/|$|[^\w.\-])"
    )
    return pattern.sub(lambda match: table[match.group(1)], text)


def _replica_env(
    home: Path, entry: dict[str, Any], replica: int, results: str, mounts: list[tuple[str, str]]
) -> dict[str, str]:
    job = entry["job"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(PRIVATE_ENV_PREFIXES)}
    variants = nc.read_variants(home)
    bcprun = variants["bcprun_in_single_replica_jobs"] or _replicas(entry) > 1
    inherited = [part for part in env.get("PATH", "").split(os.pathsep) if part and Path(part) != FAKES_DIR]
    env["PATH"] = os.pathsep.join([str(_job_bin(home, job["id"], bcprun)), *inherited])
    env.update(
        NGC_JOB_ID=str(job["id"]),
        NGC_ARRAY_INDEX=str(replica),
        NGC_ARRAY_SIZE=str(_replicas(entry)),
        NGC_REPLICA_ID=str(replica),
        NGC_GPUS_PER_NODE=str(instance_gpus((job["jobDefinition"].get("resources") or {}).get("name"))),
        NGC_MASTER_ADDR=f"launcher-svc-{job['id']}",  # as public BCP scripts show it; it resolves only on BCP
        NGC_RESULT_DIR=results,  # emulator addition (the real name of such a variable is unverified)
        BCPP_EMU_COMMANDLINE=variants["commandline"],  # for the bcprun stand-in: fan out, or this node only
    )
    if job["jobDefinition"].get("arrayType"):
        kind = job["jobDefinition"]["arrayType"]
        env["NGC_ARRAY_TYPE"] = ARRAY_TYPE_ENV.get(kind, kind)
    for item in job["jobDefinition"].get("envs") or []:
        env[item["name"]] = substitute_mounts(item.get("value") or "", mounts)
    env.update(_check_secrets(home, job["jobDefinition"].get("userSecretsSpec") or []))
    env.update(_network_env(home, Path(results).parent.parent / "work" / str(replica)))
    return env


# NGC_ARRAY_TYPE as NVIDIA's public scripts see it (the Kubeflow kind of the job); others are passed as sent.
ARRAY_TYPE_ENV = {"PYTORCH": "PyTorchJob", "MPI": "MPIJob"}
JOB_TOOLS = ("ngc",)  # what tests/fakes puts on a job's PATH besides bcprun


def _job_bin(home: Path, job_id: int, bcprun: bool) -> Path:
    """The job's own tools folder (first on its PATH): `ngc`, and `bcprun` unless this variant has none."""
    folder = home / "jobs" / str(job_id) / ("bin" if bcprun else "bin-without-bcprun")
    folder.mkdir(parents=True, exist_ok=True)
    for tool in (*JOB_TOOLS, "bcprun") if bcprun else JOB_TOOLS:
        if not (folder / tool).exists():
            (folder / tool).symlink_to(FAKES_DIR / tool)
    return folder


def _network_env(home: Path, work: Path) -> dict[str, str]:
    """What a real job's network gives it: NGC's API at its usual address. Here that address is the emulator's,
    which NVIDIA's client only finds through these settings (never the key: that comes from a --secret)."""
    api = nc.read_json(home / "api.json", {})
    if not api:
        return {}
    return {
        "NGC_CLI_API_URL": api["url"],
        "NGC_CLI_AUTH_URL": api["url"],
        "REQUESTS_CA_BUNDLE": api["ca"],
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": api["ca"],
        "NGC_CLI_TRACE_DISABLE": "1",
        "NGC_CLI_HOME": str(work / ".ngc-home"),
    }


def _injected_details(inject: dict[str, Any]) -> str:
    return f"{inject['status']} injected by a test control (tests/fakes)"


def _outcome(entry: dict[str, Any], codes: dict[int, int], replicas: int, elapsed: float) -> tuple[str, str] | None:
    """The status a RUNNING job moves to now, with its details; None while it keeps running."""
    emu = entry["emu"]
    inject = emu.get("inject")
    after = inject.get("after_seconds") if inject else None
    if inject and after is not None and elapsed >= after:
        return inject["status"], inject.get("details") or _injected_details(inject)
    runtime_limit = (entry["job"]["jobDefinition"].get("runPolicy") or {}).get("totalRuntimeSeconds") or 0
    if runtime_limit and emu.get("runSeconds", 0.0) + elapsed >= runtime_limit:
        return "FAILED_RUN_LIMIT_EXCEEDED", f"Job exceeded its total runtime of {runtime_limit} s"
    failed = {r: c for r, c in codes.items() if c != 0}
    if failed or len(codes) == replicas:
        if inject:
            return inject["status"], inject.get("details") or _injected_details(inject)
        if failed:
            replica, code = min(failed.items())
            return "FAILED", f"Replica {replica} exited with code {code}"
        return "FINISHED_SUCCESS", ""
    return None


def _monitor(home: Path, job_id: int, procs: list[subprocess.Popen], limit: float) -> int:
    """Wait for the replicas; end the job when they exit, when an injected time comes, or when stopped outside."""
    started = time.monotonic()
    codes: dict[int, int] = {}
    stopped_at: float | None = None
    while True:
        for replica, proc in enumerate(procs):
            if replica not in codes and proc.poll() is not None:
                codes[replica] = proc.returncode
        alive = [proc.pid for replica, proc in enumerate(procs) if replica not in codes]
        try:
            entry = nc.read_state(home)["jobs"][str(job_id)]
        except (nc.FakeStateError, KeyError):
            nc.signal_groups(alive, signal.SIGKILL)  # the state folder is gone: the test is over
            return 1
        elapsed = time.monotonic() - started
        if entry["job"]["jobStatus"]["status"] == "RUNNING":
            outcome = _outcome(entry, codes, len(procs), elapsed)
            if outcome is None and elapsed > limit:
                outcome = ("KILLED_BY_SYSTEM", "emulator: ran longer than its max_job_seconds")
            if outcome and _finish(home, job_id, outcome, codes):
                nc.signal_groups(alive, signal.SIGTERM)  # e.g. the other replicas of a failed job
                stopped_at = time.monotonic()
        elif stopped_at is None:
            stopped_at = time.monotonic()  # killed or preempted by someone else, who sent SIGTERM
        if stopped_at is not None:
            terminating = entry["emu"].get("terminating")
            if terminating and entry["job"]["jobStatus"]["status"] == "PENDING_TERMINATION":
                if time.time() >= terminating["until"]:  # the ACE's grace period is over
                    nc.signal_groups(alive, signal.SIGKILL)
                    _end_termination(home, job_id)
                time.sleep(POLL_SECONDS)
                continue
            if not alive:
                _forget_pgids(home, job_id)
                return 0
            if time.monotonic() - stopped_at > KILL_GRACE_SECONDS:
                nc.signal_groups(alive, signal.SIGKILL)
        time.sleep(POLL_SECONDS)


def _finish(home: Path, job_id: int, outcome: tuple[str, str], codes: dict[int, int]) -> bool:
    status, details = outcome
    with nc.update_state(home) as state:
        entry = nc.entry_of(state, job_id)
        if entry is None or entry["job"]["jobStatus"]["status"] != "RUNNING":
            return False
        if entry["emu"].get("inject") and status == entry["emu"]["inject"]["status"]:
            entry["emu"]["inject"] = None  # one injection per job, not again after a resume
        entry["emu"]["exitCodes"] = {str(k): v for k, v in codes.items()}
        nc.set_status(entry, status, details=details or None)  # statusType from nc.DEFAULT_STATUS_TYPES
        return True


def _end_termination(home: Path, job_id: int) -> None:
    """PENDING_TERMINATION -> the status the kill asked for (KILLED_BY_USER...), once the grace period is over."""
    with nc.update_state(home) as state:
        entry = nc.entry_of(state, job_id)
        if entry is not None and entry["job"]["jobStatus"]["status"] == "PENDING_TERMINATION":
            ending = entry["emu"].pop("terminating")
            nc.set_status(entry, ending["status"], details=ending.get("details"))


def _forget_pgids(home: Path, job_id: int) -> None:
    """Forget finished process groups so a later kill can never signal a recycled group id."""
    with nc.update_state(home) as state:
        entry = nc.entry_of(state, job_id)
        if entry is not None:
            entry["emu"]["pgids"] = []


if __name__ == "__main__":
    if sys.argv[1:2] != ["__supervise__"]:
        sys.exit("usage: ngc_jobs.py __supervise__ HOME JOB_ID (started by the API emulator)")
    sys.exit(supervise(Path(sys.argv[2]), int(sys.argv[3])))
