"""The read-only look-ups `bcp-pipeline check` makes on BCP, through either transport (bcp_transport.py).

Who the key belongs to, an image, a workspace, the user's secrets (names and key names: never values), and
the client's version. Each returns the JSON shape NVIDIA's printer prints for the CLI (and ngcsdk's `toDict()`),
and raises BackendCallError when the call fails. Kept apart from the transports; `run` needs only the workspaces' (check_workspaces_exist), before a run is
recorded (the ACE, which `run` needs too, is `Transport.ace`).
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from bcp_pipeline.config.model import PipelineConfig
from bcp_pipeline.config.resources import BcpOptions
from bcp_pipeline.errors import BackendCallError, ConfigError, is_not_found
from bcp_pipeline.backends.bcp.transport import CliTransport, SdkTransport, Transport, first_json, make_transport


def _cli(transport: CliTransport, args: list[str]) -> Any:
    return _json(transport.run_ngc([*args, *transport.global_flags()]), args)


def _json(output: str, args: list[str]) -> Any:
    try:
        return first_json(output)
    except ValueError:  # NVIDIA's printer words some answers as a sentence even in JSON mode
        raise BackendCallError(f"`ngc {' '.join(args)}` printed no JSON: {' '.join(output.split())[:200]}") from None


NO_USER = "User not found in specified org/team."  # NVIDIA's printer, when `user who` has no user to show


def who(transport: Transport) -> dict[str, Any]:
    """`ngc user who` (ngcsdk's `users.who()`, the command's own call), by the kind of key:
    a legacy API key: {"user": {"id", "name", "roles": [{"org": {"name"}, "team"?: {"name"}, ...}]}};
    a personal key (nvapi-): what the key service says of it, {"type": "PERSONAL_KEY", "orgName", "user": {...}};
    a service key (nvapi-): {}, as NVIDIA's client asks nothing for one ("Service keys are not associated with
    users"; its printer says NO_USER)."""
    if isinstance(transport, CliTransport):
        output = transport.run_ngc(["user", "who", *transport.global_flags()])
        return {} if output.strip() == NO_USER else _json(output, ["user", "who"])
    return _as_dict(transport.call("users.who", lambda c: c.users.who()) or {})


def image(transport: Transport, name: str) -> dict[str, Any]:
    """`ngc registry image info ORG/[TEAM/]REPO:TAG` (`nvcr.io/` dropped): the tag's metadata."""
    name = name.removeprefix("nvcr.io/")
    if isinstance(transport, CliTransport):
        return _cli(transport, ["registry", "image", "info", name])
    return transport.call("registry.image.info", lambda c: c.registry.image.info(name)[0].toDict())


def workspace(transport: Transport, name: str) -> dict[str, Any]:
    """`ngc workspace info NAME`: {"name", "sizeInBytes", "aceName", ...}."""
    if isinstance(transport, CliTransport):
        return _cli(transport, ["workspace", "info", name])
    return transport.call("basecommand.workspace.info",
                           lambda c: _as_dict(c.basecommand.workspace.info(name)))


def check_workspaces_exist(options: BcpOptions, pipeline: PipelineConfig,
                           transport: Transport | None = None) -> None:
    """Every workspace the pipeline's jobs mount exists, or a ConfigError naming it and `ngc workspace create`:
    found before a run is recorded, not as a failed first submission. Only "not found" refuses: another failure of
    the look-up is left to the submission, which reports it with its own hint."""
    names = [pipeline.workspace.name]
    for section in [pipeline.verification.bcp, *(stage.bcp for stage in pipeline.stages.values())]:
        names += [mount.name for mount in section.workspaces if mount.name not in names]
    transport = transport or make_transport(options)
    for name in names:
        try:
            workspace(transport, name)
        except BackendCallError as exc:
            if is_not_found(exc):
                ace = f" --ace {options.ace}" if options.ace else ""
                raise ConfigError(f"BCP workspace {name!r} (pipeline {pipeline.name}) does not exist in this org: "
                                  f"create it with `ngc workspace create --name {name}{ace}`, or name an existing "
                                  "one (`ngc workspace list`). Nothing was submitted or recorded") from None


def secret_keys(transport: Transport) -> dict[str, list[str]]:
    """`ngc user secret list`: each secret's name -> its key names (values are never asked for)."""
    if isinstance(transport, CliTransport):
        data = _cli(transport, ["user", "secret", "list"])
    else:
        data = transport.call("organization.secrets.list", lambda c: c.organization.secrets.list().toDict())
    # NVIDIA's printer (and toDict) leave out an empty list: {"version": "1"} is "no secrets".
    items = (data.get("secrets") or []) if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise BackendCallError(f"`user secret list` answered no list of secrets: {str(data)[:200]}")
    return {str(s.get("name")): [str(kv.get("key")) for kv in s.get("kv") or [] if isinstance(kv, dict)]
            for s in items if isinstance(s, dict)}


def client_version(transport: Transport) -> str:
    """`ngc version info` (the standalone CLI's command; ngcsdk's CLI code has none), or ngcsdk's version."""
    if isinstance(transport, SdkTransport):
        return f"ngcsdk {importlib.metadata.version('ngcsdk')}"
    return " ".join(transport.run_ngc(["version", "info"], timeout=60).split())[:200]


def _as_dict(value: Any) -> dict[str, Any]:
    if hasattr(value, "toDict"):
        return value.toDict()
    return value if isinstance(value, dict) else {}


def job_history(transport: Transport, job_id: str) -> list[str]:
    """The statuses a job went through, oldest first (`job info`'s jobStatusHistory)."""
    if isinstance(transport, CliTransport):
        data = _cli(transport, ["base-command", "job", "info", job_id])
        history = data.get("jobStatusHistory") if isinstance(data, dict) else None
    else:
        _job, history = transport.call("basecommand.jobs.info", lambda c: c.basecommand.jobs.info(int(job_id)))
        history = [_as_dict(item) for item in history or []]
    items = [item for item in history or [] if isinstance(item, dict)]
    items.sort(key=lambda item: item.get("timestamp") or 0)
    return [str(item.get("status")) for item in items]


def storage_quota(transport: Transport) -> list[dict[str, Any]]:
    """`ngc user storage`: the user's storage quotas ({"quota", "available", "aceName", ...} per storage cluster)."""
    if isinstance(transport, CliTransport):
        data = _cli(transport, ["user", "storage"])
        items = data if isinstance(data, list) else [data]
    else:
        def quota(c: Any) -> Any:
            return c.users.storage_quota(user_id=c.users.user_who().user.id)[0]
        items = transport.call("users.storage_quota", quota)
    return [_as_dict(item) for item in items or [] if item is not None]
