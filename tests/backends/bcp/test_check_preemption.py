"""`check`'s preemption probe (row `preemption`, fact `probe.runonce_preemption`) under the NGC API EMULATOR's
`runonce_preemption` variants (tests/fakes/README.md "Variants"), once per transport, and what the backend does with
the profile it saves. The default, `resumable`, is tests/backends/bcp/test_check_jobs.py's probe test. The row reader
is also given outcomes this tool cannot read: never `ok`."""

from __future__ import annotations

import pytest
from support.bcp_emulation import needs_ngcsdk
from support.check_fixtures import REPO, checked

from bcp_pipeline.backends.bcp import probe as bcp_probe
from bcp_pipeline.backends.bcp import probe_findings
from bcp_pipeline.backends.bcp.probe_findings import Preemption, preemption_row
from bcp_pipeline.backends.bcp.render import JobSpec
from bcp_pipeline.backends.bcp.transport_sdk import SdkTransport
from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.load import load_config
from bcp_pipeline.errors import BackendCallError


@needs_ngcsdk
@pytest.mark.emulator(variants={"runonce_preemption": "refused"})
def test_a_refused_preempt_of_a_runonce_job_is_ok_and_the_kill_is_timed_as_before(tmp_path, fake):
    _, rows, result = checked(tmp_path, fake)
    row = rows["preemption"]
    assert row.verdict.value == "ok", row
    assert row.showed.startswith("`job preempt` refused: ") and "cannot be preempted" in row.showed
    assert "not preempted on request here" in row.meaning
    probe = result.facts["probe"]
    assert probe["runonce_preemption"] == "refused"
    assert rows["kill"].verdict.value == "ok" and probe["kill_seconds"] is not None  # still running when killed
    assert {fake.status(job_id) for job_id in fake.jobs()} == {"FINISHED_SUCCESS", "KILLED_BY_USER"}


@needs_ngcsdk
@pytest.mark.emulator(variants={"runonce_preemption": "not_resumable"})
def test_a_runonce_job_bcp_will_not_resume_is_different_and_the_backend_then_asks_no_resume(tmp_path, fake):
    config, rows, result = checked(tmp_path, fake)
    row = rows["preemption"]
    assert row.verdict.value == "different", row
    assert "`job preempt` accepted: PREEMPTED; `job resume` refused: " in row.showed
    assert "cannot be resumed" in row.showed and "statuses: PREEMPTED" in row.showed
    assert row.meaning == "the backend resubmits a preempted RUNONCE job instead of resuming it (from this profile)"
    probe = result.facts["probe"]
    assert probe["runonce_preemption"] == "not_resumable"
    # Killed from PREEMPTED: that kill says nothing about how long a running job takes to stop.
    assert rows["kill"].verdict.value == "could not check" and "was PREEMPTED when killed" in rows["kill"].showed
    assert probe["kill_seconds"] is None and probe["pending_termination"] is None
    assert {fake.status(job_id) for job_id in fake.jobs()} == {"FINISHED_SUCCESS", "KILLED_BY_USER"}
    # The backend reads the profile `check` saved: a preempted RUNONCE job is not resumed (no request made), a
    # RESUMABLE one is.
    loaded = load_config(config)
    backend = make_backend("bcp", loaded, loaded.pipeline("demo"), config.parent / ".bcp-pipeline/runs/demo-RUN")
    assert backend.probe_fact("runonce_preemption") == "not_resumable"
    fake.inject("PREEMPTED", after_seconds=0, times=None)
    runonce, resumable = (
        backend.transport.submit(
            JobSpec(
                name=f"preempted-{kind}",
                image="nvcr.io/nvaie/x:1",
                instance="dgxa100.80g.1.norm",
                result="/results",
                commandline="exec sleep 60",
                preempt=kind,
            )
        )
        for kind in ("RUNONCE", "RESUMABLE")
    )
    for job_id in (runonce, resumable):
        fake.wait_for(int(job_id), {"PREEMPTED"})
    assert backend.resume(runonce) is False and fake.requests("PATCH", f"/v2/org/*/jobs/{runonce}/resume") == []
    assert backend.resume(resumable) is True and fake.wait_for(int(resumable), {"RUNNING"}) == "RUNNING"


@needs_ngcsdk
@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
@pytest.mark.emulator(variants={"runonce_preemption": "refused"})
def test_a_refusal_counts_only_while_the_job_still_runs(fake):
    """A preempt refused for a job that had ended meanwhile says nothing about RUNONCE jobs: no answer."""
    transport = SdkTransport(load_config(REPO / "pipelines.yaml").options["bcp"])
    job_id = transport.submit(
        JobSpec(
            name="ended-runonce",
            image="nvcr.io/nvaie/x:1",
            instance="dgxa100.80g.1.norm",
            result="/results",
            commandline="true",
        )
    )
    assert fake.wait_for(int(job_id)) == "FINISHED_SUCCESS"
    preemption = bcp_probe.probe_preemption(transport, job_id)
    assert preemption.answer is None and preemption.steps[0].startswith("`job preempt` refused: ")
    assert preemption.steps[0].endswith("; the job is FINISHED_SUCCESS now")
    assert preemption_row(preemption).verdict.value == "could not check"


# -- outcomes the tool cannot read are never ok (pure) ---------------------------------------------------------------
def test_unknown_preemption_outcomes_are_never_ok():
    assert preemption_row(None).verdict.value == "could not check"  # the kill probe never ran
    no_answer = Preemption(answer=None, steps=("`job preempt` failed: `ngc` exited 1: Server Error: 503",))
    assert preemption_row(no_answer).verdict.value == "could not check"
    never_preempted = Preemption(
        answer=None, steps=("`job preempt` accepted, but the job was not PREEMPTED after 300 s",), statuses=()
    )
    assert preemption_row(never_preempted).verdict.value == "could not check"
    ended = Preemption(
        answer=None,
        steps=("`job preempt` accepted, but the job ended KILLED_BY_SYSTEM",),
        statuses=("KILLED_BY_SYSTEM",),
    )
    row = preemption_row(ended)
    assert row.verdict.value == "different" and "ended KILLED_BY_SYSTEM instead of waiting" in row.meaning
    strange = Preemption(
        answer="resumable",
        steps=("`job resume` accepted: RUNNING again",),
        statuses=("PREEMPTED", "REQUEUED", "RUNNING"),
    )
    row = preemption_row(strange)
    assert row.verdict.value == "different" and "not known: REQUEUED" in row.showed
    assert (
        preemption_row(
            Preemption(answer="resumable", steps=(), statuses=("PREEMPTED", "QUEUED", "RUNNING"))
        ).verdict.value
        == "ok"
    )


def test_only_a_refusal_by_the_service_counts_as_refused():
    assert bcp_probe.refusal(BackendCallError("no", http_status=400))
    for status in (None, 401, 404, 429, 500, 503):
        assert not bcp_probe.refusal(BackendCallError("busy or away", http_status=status)), status


def test_the_log_shows_the_commandline_started_again():
    first = "BCPP-SINGLE bcprun=/x\nBCPP-WAITING\n"
    assert probe_findings.started_again(first, first + "BCPP-SINGLE bcprun=/x\nBCPP-WAITING\n")  # appended to
    assert probe_findings.started_again(first, "BCPP-SINGLE bcprun=/y\nBCPP-WAITING\n")  # a new log
    assert not probe_findings.started_again(first, first) and not probe_findings.started_again(first, None)
