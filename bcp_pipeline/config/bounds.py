"""How many processes a job may ask for, refused at load at the line (or --set) that asked: every node and process
count of a stage's (or the verification's) backend sections against what any job can hold, a local job against
this machine's cores, and a BCP job's processes against its instance's cores where the instance is known.

Without an upper bound a typo starts a fork bomb: `local: {replicas: 100000}` had the local supervisor start
processes until the machine stopped answering, and `bcp.replicas: 99999999999999999999` planned a download of 0 s.
BCP's own limit on replicas (the ACE's maxAllowedReplicas) is the service's, read by `check` (its saved profile)
and by `run`; backends/bcp/policy.py holds jobs against it.
"""

from __future__ import annotations

import os
from typing import Any

from bcp_pipeline.config.instances import instances_table
from bcp_pipeline.config.resources import RESOURCE_TYPES, BcpOptions, LocalOptions
from bcp_pipeline.config.typed import Where

# Past the largest training jobs run anywhere (16,384 GPUs for Llama 3 405B, 2024) four times over, and far short of
# a number that is only a typo: a job of more ranks is refused on every backend.
MAX_RANKS = 65_536
# Past the hardware threads of the largest nodes (2 x 192-core EPYC 9965: 768): more processes on one node is a typo.
MAX_PER_NODE = 1_024
# A local job's default bound per usable core, and a BCP replica's per core of its instance. An I/O-bound stage (a
# download) gains from a few processes per core (`check` lets it be wider than the cores); eight per core is past
# any useful width and far short of a fork bomb. `backends.local.max_processes` replaces it for a bigger machine.
PROCESSES_PER_CORE = 8
# The count fields of the backend sections (config/sections/): a job's nodes, and its processes on each node.
NODE_KEYS = ("replicas", "nodes")
PER_NODE_KEYS = ("processes", "ntasks_per_node", "processes_per_node")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container or `taskset` narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def local_max_processes(options: LocalOptions) -> tuple[int, str]:
    """The most processes a local job may start, and where that bound comes from (for the error)."""
    if options.max_processes is not None:
        return options.max_processes, "backends.local.max_processes"
    cores = usable_cores()
    return PROCESSES_PER_CORE * cores, f"{PROCESSES_PER_CORE} per usable core x {cores} core(s)"


def check_option_bounds(options: dict[str, Any], where: Where, raw: Any) -> None:
    """`backends.local.max_processes` is a count of processes like any other: 1..MAX_RANKS."""
    value = options["local"].max_processes
    if value is not None and not 1 <= value <= MAX_RANKS:
        section = raw.get("local") if isinstance(raw, dict) else None
        at = where.child("local", raw).child("max_processes", section) if isinstance(section, dict) else where
        raise at.error(f"max_processes must be 1..{MAX_RANKS:,}, got {value:,}")


def check_job_bounds(sections: Any, raw: Any, where: Where, options: dict[str, Any]) -> None:
    """Refuse a count of `sections` (a StageConfig or VerificationResources, read from the mapping `raw`: the stage
    merged over the pipeline's defaults) that no job could hold, at the key that gave it."""
    for backend in RESOURCE_TYPES:
        resources = getattr(sections, backend)
        for key in (*NODE_KEYS, *PER_NODE_KEYS, *type(resources).counts):
            value = getattr(resources, key, None)
            most = MAX_PER_NODE if key in PER_NODE_KEYS else MAX_RANKS
            if isinstance(value, int) and value > most:
                raise _key_where(where, raw, backend, key).error(
                    f"{value:,} is more than any job can hold: at most {most:,}"
                    + (" processes on one node" if key in PER_NODE_KEYS else "")
                )
        layout = resources.rank_layout(sections.bcp)
        if layout.world_size > MAX_RANKS:
            raise _key_where(where, raw, backend, _widest_key(resources, raw, backend)).error(
                f"{layout.nodes:,} node(s) x {layout.per_node:,} process(es) = {layout.world_size:,} ranks is more "
                f"than any job can hold: at most {MAX_RANKS:,}"
            )
    local = sections.local.rank_layout(sections.bcp)
    most, why = local_max_processes(options["local"])
    if local.world_size > most:
        raise _key_where(where, raw, "local", _widest_key(sections.local, raw, "local")).error(
            f"{local.nodes:,} replica(s) x {local.per_node:,} process(es) = {local.world_size:,} local processes, "
            f"more than this machine is let start: at most {most:,} ({why}); start fewer, or where this machine "
            f"takes more, raise the bound: --set backends.local.max_processes={local.world_size}"
        )
    _check_bcp_instance(sections, raw, where, options["bcp"])


def _key_where(where: Where, raw: Any, backend: str, key: str) -> Where:
    """Where `backend.key` was written (or set): the key's line, else its section's, else `where`."""
    section = raw.get(backend) if isinstance(raw, dict) else None
    if not isinstance(section, dict):
        return where
    return where.child(backend, raw).child(key, section) if key in section else where.child(backend, raw)


def _widest_key(resources: Any, raw: Any, backend: str) -> str:
    """The node or process count the section writes that makes its job widest (its largest); else, none written,
    its process count's name."""
    section = raw.get(backend) if isinstance(raw, dict) else None
    keys = [key for key in (*NODE_KEYS, *PER_NODE_KEYS) if hasattr(resources, key)]
    given = [
        key for key in keys if isinstance(section, dict) and key in section and isinstance(getattr(resources, key), int)
    ]
    return max(given, key=lambda key: getattr(resources, key)) if given else keys[-1]


def _check_bcp_instance(sections: Any, raw: Any, where: Where, options: BcpOptions) -> None:
    """A BCP replica's processes against its instance's cores, where the instance is known (config/instances.py
    or `backends.bcp.instances`)."""
    bcp = sections.bcp
    instance = instances_table(options.instances).get(bcp.instance or "")
    if instance is None or bcp.processes <= PROCESSES_PER_CORE * instance.cpu_cores:
        return
    most = PROCESSES_PER_CORE * instance.cpu_cores
    raise _key_where(where, raw, "bcp", "processes").error(
        f"{bcp.processes:,} processes on one {bcp.instance} replica, which has {instance.cpu_cores} cores: at most "
        f"{most:,} ({PROCESSES_PER_CORE} per core)"
    )
