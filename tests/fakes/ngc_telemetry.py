"""The EMULATOR's job telemetry (NOT NVIDIA's service): what `ngc base-command job telemetry ID[:R]` reads.

NVIDIA's client (ngcsdk 4.19.1, basecommand/api/measurements.py `MeasurementsAPI.get_all_job_measurements`) asks
`GET /v2/org/ORG/jobs/ID[/replicas/R]/telemetry?q=<json>&telemetry-v3-ui=true`, where `q` is
`{"measurements": [{"type", "aggregation", "toDate", "fromDate", "period"[, "groupBy"]}, ...]}`; for
GPU_UTILIZATION (and the other per-GPU types) it asks twice, once more with `"groupBy": ["gpu"]`. It parses the
answer as a MeasurementResultListResponse: `{"measurements": [{"series": [{"name", "columns", "tags":
[{"tagKey", "tagValue"}], "values": [{"value": [TIME, VALUE]}]}]}]}`, a result per query in their order; its
printer shows each value as Name (the series' name, `_tagKey_tagValue` added), Time and Measurement.

What the real service puts in the series (their names, columns, how far back, how values are typed) is not known
offline; the emulator's guesses, kept small:
- a series is named after the measurement type, columns `["time", "value"]`, and holds one value: the current
  period's, stamped with its start (`%Y-%m-%dT%H:%M:%SZ`, the form NVIDIA's CSV printer sorts by). No history.
- GPU_UTILIZATION of a replica (percent) is what a test set (`FakeNgc.set_gpu_utilization`, TEST-SET VALUES named
  as such), else the emulator's model: BUSY_PERCENT while the job runs and the replica's log grew within the last
  BUSY_WINDOW_SECONDS, 0 otherwise (a job that stopped printing, as a hung training does, reads idle; on real GPUs
  a rank spinning in a hung NCCL collective can read busy). Every GPU of the replica reads the same.
- any other type: an empty result (no series).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import ngc_control as nc
from ngc_jobs import ApiError, instance_gpus

BUSY_PERCENT = 97.0
BUSY_WINDOW_SECONDS = 2.0


def telemetry(home: Path, entry: dict[str, Any], replica: int | None, query: str | None) -> dict[str, Any]:
    """The MeasurementResultListResponse for job `entry` (replica 0 where none is named)."""
    if entry["job"]["jobStatus"]["status"] in ("CREATED", "QUEUED", "STARTING"):
        raise ApiError(400, "the job has not started: no telemetry (emulator's wording)")
    try:
        wanted = json.loads(query or "")["measurements"]
    except (ValueError, KeyError, TypeError):
        raise ApiError(400, 'telemetry needs q={"measurements": [...]} (emulator\'s wording)') from None
    replicas = int(entry["job"]["jobDefinition"].get("replicaCount") or 1)
    replica = 0 if replica is None else replica
    if not 0 <= replica < replicas:
        raise ApiError(404, f"Replica '{replica}' of job '{entry['job']['id']}' could not be found.")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(nc.now()))
    gpus = instance_gpus((entry["job"]["jobDefinition"].get("resources") or {}).get("name") or "") or 1
    results = []
    for measurement in wanted:
        if measurement.get("type") != "GPU_UTILIZATION":
            results.append({"series": []})
            continue
        value = gpu_utilization(home, entry, replica)
        if "gpu" in (measurement.get("groupBy") or []):
            series = [
                {
                    "name": "GPU_UTILIZATION",
                    "columns": ["time", "value"],
                    "tags": [{"tagKey": "gpu", "tagValue": str(gpu)}],
                    "values": [{"value": [stamp, value]}],
                }
                for gpu in range(gpus)
            ]
        else:
            series = [{"name": "GPU_UTILIZATION", "columns": ["time", "value"], "values": [{"value": [stamp, value]}]}]
        results.append({"series": series})
    return {"measurements": results}


def gpu_utilization(home: Path, entry: dict[str, Any], replica: int) -> float:
    """A test-set value (job and replica, job, or every job), else the log-growth model of the module docstring."""
    job_id = str(entry["job"]["id"])
    set_values = nc.read_json(home / "control.json", {}).get("gpu_utilization") or {}
    for key in (f"{job_id}:{replica}", job_id, "*"):
        if key in set_values:
            return float(set_values[key])
    if entry["job"]["jobStatus"]["status"] != "RUNNING":
        return 0.0
    log = home / "jobs" / job_id / "results" / str(replica) / "joblog.log"
    try:
        grew = time.time() - log.stat().st_mtime <= BUSY_WINDOW_SECONDS
    except OSError:
        grew = False
    return BUSY_PERCENT if grew else 0.0
