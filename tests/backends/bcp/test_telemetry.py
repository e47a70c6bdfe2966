"""A running job's GPU utilization per replica, read through NVIDIA's client (`ngc base-command job telemetry`,
ngcsdk 4.19.1's `jobs.telemetry`) on each transport, from the NGC API EMULATOR (tests/fakes/ngc_api.py; what its
telemetry holds: tests/fakes/ngc_telemetry.py)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
from support.bcp_emulation import needs_ngcsdk

from bcp_pipeline.backends.bcp.backend import BcpBackend
from bcp_pipeline.backends.bcp.telemetry import utilization_of
from bcp_pipeline.config.resources import BcpOptions

pytestmark = [needs_ngcsdk, pytest.mark.both_transports]  # the transport is what this tests

PRINTING = "bash -c 'while true; do echo step; sleep 0.2; done'"


def running_job(fake, replicas: int = 2) -> str:
    several = ["--replicas", str(replicas), "--array-type", "PYTORCH"] if replicas > 1 else []
    result = fake.ngc(
        "base-command",
        "job",
        "run",
        "--name",
        "telemetry-probe",
        "--image",
        "nvidia/pytorch:24.01-py3",
        "--instance",
        "dgxa100.80g.8.norm",
        "--result",
        "/results",
        "--commandline",
        PRINTING,
        *several,
        "--total-runtime",
        "1h",
        "--format_type",
        "json",
    )
    assert result.returncode == 0, result.stderr
    job_id = str(json.loads(result.stdout)["job"]["id"])
    fake.wait_for(int(job_id), ["RUNNING"], timeout=30)
    time.sleep(0.5)  # its replicas have printed
    return job_id


def backend(fake, tmp_path, seconds: float | None = 60.0) -> BcpBackend:
    options = replace(BcpOptions(), transport=fake.transport, telemetry_seconds=seconds)
    return BcpBackend(
        options,
        pipeline=None,
        config_dir=tmp_path,
        stages_dir=tmp_path,  # type: ignore[arg-type]
        run_dir=tmp_path / "runs" / "r",
        workspace_name="main",
    )


def test_each_replicas_gpu_utilization_is_read_through_nvidias_client(fake, tmp_path):
    job_id = running_job(fake)
    fake.set_gpu_utilization(41.5, job_id=job_id, replica=1)  # a TEST-SET value for replica 1; replica 0 modelled
    found = backend(fake, tmp_path).gpu_utilization(job_id)
    assert found == {0: 97.0, 1: 41.5}
    asked = [r for r in fake.requests("GET", "*/telemetry") if r["status"] == 200]
    assert [r["path"].rsplit("/", 2)[-2] for r in asked] == ["0", "1"]  # .../replicas/R/telemetry, one call each
    assert all("GPU_UTILIZATION" in r["query"] for r in asked)


def test_reads_are_at_most_every_telemetry_seconds_and_never_when_switched_off(fake, tmp_path):
    job_id = running_job(fake, replicas=1)
    reader = backend(fake, tmp_path, seconds=60.0)
    first = reader.gpu_utilization(job_id)
    fake.set_gpu_utilization(5.0, job_id=job_id)
    assert reader.gpu_utilization(job_id) == first == {0: 97.0}  # within the minute: not asked again
    assert len(fake.requests("GET", "*/telemetry")) == 1
    assert backend(fake, tmp_path, seconds=None).gpu_utilization(job_id) is None
    assert len(fake.requests("GET", "*/telemetry")) == 1


def test_a_job_that_stopped_printing_reads_idle_in_the_emulators_model(fake, tmp_path):
    result = fake.ngc(
        "base-command",
        "job",
        "run",
        "--name",
        "quiet",
        "--image",
        "nvidia/pytorch:24.01-py3",
        "--instance",
        "dgxa100.80g.1.norm",
        "--result",
        "/results",
        "--commandline",
        "bash -c 'echo one line; sleep 60'",
        "--total-runtime",
        "1h",
        "--format_type",
        "json",
    )
    job_id = str(json.loads(result.stdout)["job"]["id"])
    fake.wait_for(int(job_id), ["RUNNING"], timeout=30)
    time.sleep(2.5)
    assert backend(fake, tmp_path).gpu_utilization(job_id) == {0: 0.0}


def test_the_answer_is_read_as_nvidias_printer_has_it():
    """The untagged series is the replica's; without it, the mean of the per-GPU series; "N/A" (a MIG instance, as
    NVIDIA's printer writes it) and other types are passed over."""

    def series(value, gpu=None, name="GPU_UTILIZATION"):
        return {
            "name": name,
            "columns": ["time", "value"],
            "values": [{"value": ["2026-12-01T00:00:00Z", value]}],
            **({"tags": [{"tagKey": "gpu", "tagValue": str(gpu)}]} if gpu is not None else {}),
        }

    assert utilization_of([{"series": [series(80.0)]}, {"series": [series(70.0, 0), series(90.0, 1)]}]) == 80.0
    assert utilization_of([{"series": [series(70.0, 0), series("90", 1)]}]) == 80.0
    assert utilization_of([{"series": [series("N/A", 0)]}, {"series": [series(3.0, name="CPU_UTILIZATION")]}]) is None
    assert utilization_of([]) is None and utilization_of(None) is None
