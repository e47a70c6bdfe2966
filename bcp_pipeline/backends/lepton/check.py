"""`bcp-pipeline check` on DGX Cloud Lepton, through NVIDIA's SDK: the workspace answers this token; every resource
shape and node group the pipeline's jobs name exists; every secret they reference by name is in the workspace; the
storage mounts and holds what a job writes; and (unless `--no-jobs`) a tiny job runs there and its log is read back.
Never "ok" by default: a row is ok only for what the service answered.
"""

from __future__ import annotations

import time
from typing import Any

from bcp_pipeline.backends.checks import (
    CheckInput,
    CheckOutcome,
    Row,
    different,
    ok,
    poll_until,
    removed_at_exit,
    unchecked,
)
from bcp_pipeline.backends.lepton.client import api_client, call
from bcp_pipeline.config.resources import LeptonOptions
from bcp_pipeline.errors import BackendCallError, ConfigError

PROBE_SECONDS = 600.0  # a queue may hold the probe job a while; it is stopped when the check ends, whatever happens
PROBE_LINE = "BCPP-LEPTON-PROBE"


def check_lepton(given: CheckInput) -> CheckOutcome:
    options: LeptonOptions = given.config.options["lepton"]
    try:
        client = api_client(options)
        info = call("the workspace", lambda: client.info(timeout=15))
    except (ConfigError, BackendCallError) as exc:
        return outcome(
            "unreachable",
            [
                different(
                    "workspace",
                    "the workspace answers this token",
                    str(exc),
                    "fix backends.lepton / LEPTON_WORKSPACE_*; nothing else checked",
                )
            ],
        )
    workspace = client.workspace_id
    rows = [
        ok(
            "workspace",
            "the workspace answers this token",
            f"{workspace} ({info.workspace_name}, "
            f"{info.workspace_state.value}, quota {info.resource_quota.limit.accelerator_num:g} GPUs)",
        )
    ]
    jobs = [s.payload["job"] for s in given.submissions()] if given.pipeline is not None else []
    found: list[Row | None] = [
        shape_row(client, jobs, options),
        node_group_row(client, jobs, options),
        secret_row(client, jobs),
    ]
    rows += [row for row in found if row is not None]
    if not given.jobs:
        rows.append(unchecked("probe job", "a job runs on the storage and its log is read back", "--no-jobs"))
    elif given.pipeline is not None:
        rows += probe_rows(given, client)
    return outcome(workspace, [row for row in rows if row is not None], {"workspace": workspace})


def outcome(workspace: str, rows: list[Row], facts: dict[str, Any] | None = None) -> CheckOutcome:
    return CheckOutcome(
        target={"workspace": workspace}, profile_parts=("lepton", workspace), rows=rows, facts=facts or {}
    )


def shape_row(client: Any, jobs: list[dict], options: LeptonOptions) -> Row:
    assumes = "every resource shape the jobs name is offered by the workspace"
    named = sorted({job["spec"]["resource_shape"] for job in jobs} | {options.resource_shape})
    try:
        offered = set(call("the workspace's shapes", lambda: client.info(timeout=15)).supported_shapes)
    except BackendCallError as exc:
        return unchecked("resource shapes", assumes, str(exc))
    missing = [shape for shape in named if shape not in offered]
    if missing:
        return different(
            "resource shapes",
            assumes,
            f"not offered: {', '.join(missing)} (offered: {', '.join(sorted(offered))})",
            "set lepton.resource_shape to one offered",
        )
    return ok("resource shapes", assumes, ", ".join(named))


def node_group_row(client: Any, jobs: list[dict], options: LeptonOptions) -> Row | None:
    named = sorted(
        {g for job in jobs for g in (job["spec"].get("affinity") or {}).get("allowed_dedicated_node_groups", [])}
        | ({options.node_group} if options.node_group else set())
    )
    if not named:
        return None
    assumes = "every node group the jobs name exists"
    try:
        groups = call("the node groups", lambda: client.nodegroup.list_all())
    except BackendCallError as exc:
        return unchecked("node groups", assumes, str(exc))
    known = {g.metadata.id_ for g in groups} | {g.metadata.name for g in groups}
    missing = [g for g in named if g not in known]
    if missing:
        return different("node groups", assumes, f"not found: {', '.join(missing)}", "fix lepton.node_group")
    return ok("node groups", assumes, ", ".join(named))


def secret_row(client: Any, jobs: list[dict]) -> Row | None:
    named = sorted(
        {
            e["value_from"]["secret_name_ref"]
            for job in jobs
            for e in job["spec"].get("envs") or []
            if e.get("value_from")
        }
    )
    if not named:
        return None
    assumes = "every secret the jobs reference by name is in the workspace"
    try:
        held = {s.name for s in call("the workspace's secrets", lambda: client.secret.list_all())}
    except BackendCallError as exc:
        return unchecked("secrets", assumes, str(exc))
    missing = [s for s in named if s not in held]
    if missing:
        return different(
            "secrets",
            assumes,
            f"missing: {', '.join(missing)}",
            "create them (`lep secret create -n NAME -v ...`), never in pipelines.yaml",
        )
    return ok("secrets", assumes, ", ".join(named))


def probe_rows(given: CheckInput, client: Any) -> list[Row]:
    """A one-worker job of the first stage's shape and image: writes and reads a file on the storage mount and
    prints its ranks; its log read back through the SDK. Stopped at the end, whatever happens."""
    from leptonai.api.v2.types.job import LeptonJob

    first = given.submissions()[0].payload["job"]
    name = f"bp-check-{int(time.time()) % 10**8}"
    mount = first["spec"]["mounts"][0]["mount_path"]
    script = (
        f"mkdir -p {mount}/.bcp-pipeline && f={mount}/.bcp-pipeline/check-$LEPTON_JOB_NAME && "
        "echo ok > $f && read v < $f && rm -f $f && "
        f"echo {PROBE_LINE} worker=$LEPTON_JOB_WORKER_INDEX of=$LEPTON_JOB_TOTAL_WORKERS storage=$v"
    )
    spec = {
        **first["spec"],
        "container": {**first["spec"]["container"], "command": ["sh", "-c", script]},
        "completions": 1,
        "parallelism": 1,
        "envs": [],
        "max_failure_retry": 0,
    }
    spec.pop("intra_job_communication", None)
    job = {
        "metadata": {"id": name, "name": name, "labels": {"managed-by": "bcp-pipeline", "bcp-pipeline.kind": "check"}},
        "spec": spec,
    }
    assumes = "a job of the first stage's shape and image runs, writes to the storage, and its log is read back"
    given.announce(f"probe job {name}: one worker of {spec['resource_shape']} ({spec['container']['image']})")

    def stop(probe: Any) -> None:
        try:
            client.job.update(name, spec={"spec": {"stopped": True}})
        except Exception:  # noqa: BLE001 - gone already, or never created
            pass

    with removed_at_exit(stop) as probe:
        try:
            probe.id = call("creating the probe job", lambda: client.job.create(LeptonJob(**job))).metadata.id_
        except BackendCallError as exc:
            return [different("probe job", assumes, str(exc), "the service refused a job of the first stage")]

        def ended() -> str | None:
            state = call("the probe job", lambda: client.job.get(name)).status
            return state.state.value if state and state.state.value in ("Completed", "Failed", "Stopped") else None

        state = poll_until(ended, PROBE_SECONDS, max_delay=5.0)
        if state is None:
            return [unchecked("probe job", assumes, f"still not finished after {PROBE_SECONDS:.0f} s (queued?)")]
        log = ""
        for _ in range(20):  # the service's logs arrive late
            replicas = call("the probe's workers", lambda: client.job.get_replicas(name))
            log = "".join(
                chunk for r in replicas for chunk in client.job.get_log(id_or_job=name, replica=r, timeout=30)
            )
            if PROBE_LINE in log:
                break
            time.sleep(1.0)
    line = next((line for line in log.splitlines() if line.startswith(PROBE_LINE)), None)
    if state != "Completed" or line is None or "storage=ok" not in line:
        return [
            different(
                "probe job",
                assumes,
                f"{state}; log: {log.strip()[-300:] or '(none)'}",
                "the stages cannot run there: see the log",
            )
        ]
    return [ok("probe job", assumes, f"{state}; {line}")]
