"""A backend whose status queries keep failing: the run waits, retrying, up to the backend's `status_outage_limit`,
then stops with exit 75 (EX_TEMPFAIL) and leaves its jobs as they are, for `resume`.

On the local backend, with its `poll` made to fail (an outage no local process can have) once stage `second` runs;
the same on a real Slurm controller that stops answering: tests/e2e/test_slurm_e2e.py.
"""

from __future__ import annotations

import time

import pytest
from support.cli import cli
from support.pipeline_fixtures import CHAIN_CONFIG, stall_stage, write_chain_project

from bcp_pipeline.backends.local.backend import LocalBackend
from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.load import load_config
from bcp_pipeline.engine.state import RunStore, StageStatus
from bcp_pipeline.errors import BackendCallError, ConfigError


def failing_once_second_runs(real_poll, calls: list[float]):
    def poll(self, job_ids):
        if any(job_id.startswith("second.") for job_id in job_ids):
            calls.append(time.monotonic())
            raise BackendCallError("the scheduler did not answer: connection refused", unreachable=True)
        return real_poll(self, job_ids)

    return poll


def test_failing_status_queries_stop_the_run_after_the_limit_and_leave_the_job(tmp_path, monkeypatch, capsys):
    config = write_chain_project(tmp_path, with_limit("local", "2s"))
    stall = stall_stage(tmp_path / "ws/main", "second")
    calls: list[float] = []
    monkeypatch.setattr(LocalBackend, "poll", failing_once_second_runs(LocalBackend.poll, calls))

    assert cli(config, "run", "chain") == 75
    printed = capsys.readouterr()
    err = printed.err
    state = RunStore(tmp_path / ".bcp-pipeline").latest()
    assert len(calls) >= 3 and calls[-1] - calls[0] >= 2  # never on one failure; only past the limit
    assert calls[-2] - calls[0] < 2  # ... and at the first failure past it
    assert (
        "status query failed 3 times in a row, still retrying (for 2S at most): the scheduler did not answer"
        in printed.out
    )
    message = err.strip().splitlines()[-1]
    assert message.startswith("bcp-pipeline: error: local has not answered a status query for "), message
    assert (
        f"({len(calls)} calls in a row failed; the last: the scheduler did not answer: connection refused). "
        f"The run stopped waiting and left its jobs as they are: they may well be running. Once local answers, "
        f"`bcp-pipeline resume {state.run_id}` re-attaches to them; `backends.local.status_outage_limit` in "
        f"pipelines.yaml sets how long a run waits (now 2S; null: for ever)"
    ) in message
    second = state.stages["second"]
    assert second.status is StageStatus.RUNNING and [j.job_id for j in second.jobs] == ["second.1"]

    monkeypatch.undo()  # the outage ends
    stall.unlink()
    assert cli(config, "resume") == 0
    state = RunStore(tmp_path / ".bcp-pipeline").latest()
    assert [j.job_id for j in state.stages["second"].jobs if j.kind == "stage"] == ["second.1"]  # re-attached
    assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())


def test_a_successful_query_ends_the_outage(tmp_path, monkeypatch, capsys):
    """Failures separated by an answer are not one outage: a limit shorter than the whole run never stops it."""
    config = write_chain_project(tmp_path)
    real_poll = LocalBackend.poll
    calls = {"n": 0}

    def every_other_call_fails(self, job_ids):
        calls["n"] += 1
        if calls["n"] % 2:
            time.sleep(1.2)  # longer than the limit, but one failure alone never stops a run
            raise BackendCallError("busy", http_status=503)
        return real_poll(self, job_ids)

    config.write_text(with_limit("local", "1s"))
    monkeypatch.setattr(LocalBackend, "poll", every_other_call_fails)
    assert cli(config, "run", "chain") == 0
    assert calls["n"] >= 6


def with_limit(backend: str, value: str) -> str:
    """CHAIN_CONFIG with `backends.BACKEND.status_outage_limit: VALUE` (on line 4)."""
    if backend == "local":
        return CHAIN_CONFIG.replace("poll_seconds: 0.05}", f"poll_seconds: 0.05, status_outage_limit: {value}}}")
    return CHAIN_CONFIG.replace("backends:\n", f"backends:\n  {backend}: {{status_outage_limit: {value}}}\n")


@pytest.mark.parametrize("backend", ["local", "slurm", "gridengine", "kubernetes", "bcp"])
def test_the_limit_is_a_duration_or_null(tmp_path, backend):
    config = write_chain_project(tmp_path, with_limit(backend, "30m"))
    assert load_config(config).options[backend].status_outage_limit == "30m"
    config.write_text(with_limit(backend, "null"))
    assert load_config(config).options[backend].status_outage_limit is None
    config.write_text(with_limit(backend, "soon"))
    with pytest.raises(
        ConfigError,
        match=rf"pipelines.yaml:4: backends.{backend}.status_outage_limit: 'soon' is not "
        r"a duration",
    ):
        load_config(config)


def test_defaults_an_hour_on_the_clusters_for_ever_on_bcp_and_local(tmp_path):
    """A cluster's scheduler that is gone for an hour ends the run; a detached BCP driver waits (nobody would resume
    it), and so does the local backend (its statuses are files)."""
    config = load_config(write_chain_project(tmp_path))
    limits = {
        name: make_backend(name, config, config.pipeline("chain"), tmp_path / "run").status_outage_seconds
        for name in ("local", "bcp", "slurm", "gridengine", "kubernetes")
    }
    assert limits == {"local": None, "bcp": None, "slurm": 3600.0, "gridengine": 3600.0, "kubernetes": 3600.0}
