"""A BCP job's GPU utilization per replica, from its telemetry (`ngc base-command job telemetry ID:R`, ngcsdk
4.19.1's `basecommand.jobs.telemetry`), read at most every `backends.bcp.telemetry_seconds` a job.

NVIDIA's client asks the service for the job's measurements from its start to now in periods of `interval_time`
`interval_unit` (basecommand/api/measurements.py); for GPU_UTILIZATION it asks twice, once as one series for the
replica and once grouped by GPU (each series tagged `gpu`). Its answer, a list of MeasurementResult (`{"series":
[{"name", "tags", "values": [{"value": [TIME, VALUE]}]}]}`), is read here: the last value of the untagged series,
else the mean of the per-GPU series' last values. The service's own naming of the series is not known offline
(tests/fakes/ngc_telemetry.py says what the emulator answers); any series whose name holds the type is taken.
"""

from __future__ import annotations

import time
from typing import Any

from bcp_pipeline.errors import BackendCallError

TYPE = "GPU_UTILIZATION"
INTERVAL_UNIT, INTERVAL_TIME = "MINUTE", 1  # `job telemetry`'s defaults: a mean a minute


def utilization_of(measurements: Any) -> float | None:
    """The replica's latest GPU utilization (percent) in `job telemetry`'s answer; None where it holds none."""
    whole, per_gpu = None, []
    for result in measurements if isinstance(measurements, list) else []:
        for series in (result.get("series") if isinstance(result, dict) else None) or []:
            if not isinstance(series, dict) or TYPE not in str(series.get("name", "")):
                continue
            value = _last_value(series)
            if value is None:
                continue
            if series.get("tags"):
                per_gpu.append(value)
            else:
                whole = value
    if whole is not None:
        return whole
    return sum(per_gpu) / len(per_gpu) if per_gpu else None


def _last_value(series: dict[str, Any]) -> float | None:
    for item in reversed(series.get("values") or []):
        value = item.get("value") if isinstance(item, dict) else None
        if isinstance(value, list) and len(value) >= 2:
            try:
                return float(value[1])
            except (TypeError, ValueError):
                continue  # "N/A" (a MIG instance, NVIDIA's printer says) or an empty period
    return None


class TelemetryReader:
    """Each running job's GPU utilization per replica, read at most every `seconds` (None: never)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self._read: dict[str, tuple[float, dict[int, float] | None]] = {}  # job id -> (when read, what)

    def read(self, job_id: str, replicas: int, ask: Any) -> dict[int, float] | None:
        """`ask(replica)` is the transport's call; a replica whose call fails or that has no sample is left out."""
        if not self.seconds:
            return None
        now = time.monotonic()
        last = self._read.get(job_id)
        if last is not None and now - last[0] < self.seconds:
            return last[1]
        found: dict[int, float] = {}
        for replica in range(replicas):
            try:
                value = utilization_of(ask(replica))
            except BackendCallError:
                value = None  # a nicety: a failed read keeps what was read before
            if value is not None:
                found[replica] = value
        result = found or (last[1] if last else None)
        self._read[job_id] = (now, result)
        return result
