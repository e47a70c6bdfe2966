"""Retries of the BCP calls a busy API must not fail, on both transports, in this process: NVIDIA's
client (the ngc CLI's code, or ngcsdk) against the NGC API EMULATOR on loopback (tests/fakes/ngc_api.py, a fake),
whose `fail_requests` answers the next matching requests with a 429, a 5xx or a 401.

Only a 429/5xx is retried; a 401/403 is a refused key and fails at once. Retry sleeps are 10 ms here
(`backends.bcp.retry_backoff_seconds`).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from support.bcp_emulation import needs_ngcsdk
from support.pipeline_fixtures import bcp_chain_config, write_chain_project

from bcp_pipeline.backends.bcp.render import label
from bcp_pipeline.backends.bcp.transport import list_window
from bcp_pipeline.backends.bcp.transport_cli import http_status_in
from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.load import load_config
from bcp_pipeline.detach import driver as driver_program
from bcp_pipeline.detach.jobs import Lease, driver_jobs
from bcp_pipeline.detach.laptop import DetachedRun
from bcp_pipeline.engine.selection import Selection, new_run
from bcp_pipeline.engine.state import RunStore
from bcp_pipeline.errors import BackendCallError, is_not_found, is_refused_credentials, is_transient

pytestmark = [needs_ngcsdk, pytest.mark.both_transports]  # the transport is what this tests

SECRET = "bcp-pipeline-ngc"
RUN = "chain-retry"


@pytest.fixture
def project(tmp_path, fake):
    fake.set_secret(SECRET, {"api_key": fake.api_key})
    return write_chain_project(
        tmp_path / "project",
        bcp_chain_config(fake.transport).replace(
            "poll_max_seconds: 0.3}", "poll_max_seconds: 0.3, retry_backoff_seconds: 0.01}"
        ),
    )


def backend_of(project: Path, run_id: str = RUN):
    config = load_config(project)
    return config, make_backend("bcp", config, config.pipeline("chain"), project.parent / ".bcp-pipeline/runs" / run_id)


def statuses(fake, method: str, path: str) -> list[int]:
    return [r["status"] for r in fake.requests(method, path)]


def test_each_transport_says_which_http_status_failed_a_call(fake, project):
    _, backend = backend_of(project)
    seen = {}
    for status in (429, 500, 401, 403, 404):
        fake.fail_requests(1, method="GET", path="/v2/org/*/jobs", status=status, message="Told To Fail")
        with pytest.raises(BackendCallError) as info:
            backend.transport.list_jobs([label("run", RUN)])
        seen[status] = (info.value.http_status, is_transient(info.value))
    assert seen == {429: (429, True), 500: (500, True), 401: (401, False), 403: (403, False), 404: (404, False)}


def test_the_workspace_upload_of_prepare_is_retried_on_429(fake, project):
    config, backend = backend_of(project)
    fake.fail_requests(2, method="GET", path="/v2/org/*/workspaces/*", status=429, message="Slow Down")
    backend.prepare(config.pipeline("chain"), execute=True)
    assert statuses(fake, "GET", "/v2/org/*/workspaces/*")[:3] == [429, 429, 200]
    assert list((fake.workspace_path("main") / ".bcp-pipeline/code").rglob("*.py"))


def test_the_upload_of_a_detached_run_is_retried_on_a_5xx_and_the_driver_submitted_once(fake, project):
    config, backend = backend_of(project)
    pipeline = config.pipeline("chain")
    store = RunStore(project.parent / ".bcp-pipeline")
    state = new_run(pipeline, "bcp", str(project), [], Selection())
    fake.hold_queued(times=None)  # the driver need not run: what is tested is how it got there
    fake.fail_requests(1, method="GET", path="/v2/org/*/workspaces/*", status=500, message="Busy")
    detached = DetachedRun(
        config=config,
        pipeline=pipeline,
        store=store,
        state=state,
        backend=make_backend("bcp", config, pipeline, store.run_dir(state.run_id)),
    )
    job_id, resumed = detached.start({})
    assert not resumed and [str(j["id"]) for j in driver_jobs(backend.transport, state.run_id)] == [job_id]
    assert statuses(fake, "GET", "/v2/org/*/workspaces/*")[:2] == [500, 200]
    assert (fake.workspace_path("main") / ".bcp-pipeline/runs" / state.run_id / "driver/pipelines.yaml").is_file()
    fake.release()


def test_a_429_on_the_drivers_credential_check_is_retried_and_the_driver_goes_on(fake, project, capsys):
    config, backend = backend_of(project)
    fake.fail_requests(2, method="GET", path="/v2/org/*/jobs", status=429, message="Too Many Requests")
    driver_program.check_credentials(backend, RUN, config.options["bcp"].driver)
    assert statuses(fake, "GET", "/v2/org/*/jobs")[:3] == [429, 429, 200]
    assert "the first NGC API call: " in capsys.readouterr().out  # the driver's log says it retried


def test_a_401_on_the_drivers_credential_check_fails_at_once_naming_the_secret(fake, project):
    config, backend = backend_of(project)
    fake.fail_requests(1, method="GET", path="/v2/org/*/jobs", status=401, message="Unauthorized")
    with pytest.raises(BackendCallError, match=f"cannot call the NGC API with the key from BCP secret {SECRET}"):
        driver_program.check_credentials(backend, RUN, config.options["bcp"].driver)
    assert statuses(fake, "GET", "/v2/org/*/jobs") == [401]


def test_a_busy_api_that_stays_busy_is_not_called_a_wrong_key(fake, project):
    config, backend = backend_of(project)
    fake.fail_requests(5, method="GET", path="/v2/org/*/jobs", status=429, message="Too Many Requests")
    with pytest.raises(BackendCallError) as info:
        driver_program.check_credentials(backend, RUN, config.options["bcp"].driver)
    assert "failed 5 times" in str(info.value) and "did not refuse the key" in str(info.value)
    assert "cannot call the NGC API with the key" not in str(info.value)


def test_the_lease_look_up_of_the_last_driver_is_retried(fake, project, tmp_path):
    _, backend = backend_of(project)
    ended = fake.ngc(
        "base-command",
        "job",
        "run",
        "--name",
        "old-driver",
        "--image",
        "nvcr.io/nvaie/nemo-framework-training:23.11",
        "--instance",
        "dgxa100.80g.1.norm",
        "--result",
        "/results",
        "--commandline",
        "true",
        "--format_type",
        "json",
    )
    old = int(json.loads(ended.stdout)["job"]["id"])
    fake.wait_for(old, {"FINISHED_SUCCESS"})
    lease = Lease(tmp_path / "driver.lease", "999")
    (tmp_path / "driver.lease").write_text(f'{{"job_id": "{old}"}}')
    fake.fail_requests(2, method="GET", path=f"/v2/org/*/jobs/{old}", status=500, message="Busy")
    lease.take(backend, deadline=time.monotonic() + 60, sleep=lambda _: None)
    assert lease.holder() == "999"
    assert statuses(fake, "GET", f"/v2/org/*/jobs/{old}")[:3] == [500, 500, 200]


def test_the_hand_over_list_and_successor_submit_are_retried_and_submit_one_successor(fake, project):
    config, backend = backend_of(project)
    fake.hold_queued(times=None)
    fake.fail_requests(1, method="GET", path="/v2/org/*/jobs", status=429, message="Too Many Requests")
    fake.fail_requests(1, method="POST", path="/v2/org/*/jobs", status=429, message="Too Many Requests")
    successor, submitted = driver_program.hand_over(
        backend, config, config.pipeline("chain"), RUN, "1", {}, sleep=lambda _: None
    )
    assert submitted and [str(j["id"]) for j in driver_jobs(backend.transport, RUN)] == [successor]
    assert statuses(fake, "POST", "/v2/org/*/jobs") == [429, 200]
    # A driver that finds another live one (its successor, or a user's `resume --detach`) submits none.
    assert driver_program.hand_over(backend, config, config.pipeline("chain"), RUN, "1", {}) == (successor, False)
    assert len(fake.jobs()) == 1
    fake.release()


def test_the_status_in_each_of_nvidias_error_wordings():
    assert http_status_in("Client Error: 429 Response: Slow Down - Request Id: x Url: u") == 429
    assert http_status_in("Server Error: 503 Response: - Request Id:  Url: u") == 503
    assert http_status_in("Error (unexpected format) : 429 : rate limited") == 429  # the token exchange
    assert http_status_in("Invalid SAK key: 401 Client Error: Unauthorized for url: https://x") == 401
    assert http_status_in("Invalid apikey") == 401
    assert http_status_in("Missing org - If Authenticated, org is also required.") is None
    # the list window: 30 days back and a day ahead of this machine's clock
    end, duration = list_window("30D", datetime(2026, 1, 31, 12, 0, 5, 123, tzinfo=timezone.utc))
    assert (end, duration) == (datetime(2026, 2, 1, 12, 0, 5), "31D")


def test_a_refused_key_and_a_missing_thing_by_status_first_then_by_nvidias_words():
    def error(message: str, status: int | None = None, unreachable: bool = False) -> BackendCallError:
        return BackendCallError(message, http_status=status, unreachable=unreachable)

    assert is_refused_credentials(error("Client Error: 401 Response: Unauthorized", 401))
    assert is_refused_credentials(error("Client Error: 403 Response: Forbidden", 403))
    # a 429 is never a wrong key, whatever else its text says; nor is a 404
    assert not is_refused_credentials(error("Client Error: 429 Response: Forbidden for now, slow down", 429))
    assert not is_refused_credentials(error("Client Error: 404 Response: not found", 404))
    # ngcsdk refuses the org before any call, with no status
    assert is_refused_credentials(
        error("Provided organization: 'a', doesn't match organization for which API Key has permissions:'b'")
    )
    assert is_refused_credentials(error("Invalid org. Choose from ['a', 'b']."))
    assert not is_refused_credentials(error("Connection refused: forbidden host?", unreachable=True))
    assert not is_refused_credentials(ValueError("Invalid apikey"))  # not a call that failed

    assert is_not_found(error("Client Error: 404 Response: Image repository not found", 404))
    assert is_not_found(error("Workspace 'x' could not be found."))  # NVIDIA's words, no status
    assert not is_not_found(error("Server Error: 503 Response: backend not found", 503))  # busy: ask again
    assert not is_not_found(error("Client Error: 429 Response: Too Many Requests", 429))
    assert not is_not_found(error("Client Error: 403 Response: Forbidden", 403))
