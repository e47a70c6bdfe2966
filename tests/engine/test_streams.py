"""Streamed edges in the engine (engine/streams.py): when the downstream is due, when its verification is, and
stopping it when its upstream failed; on slimpajama-8b-fast's edge (download -> tokenize-preprocess, bpe plain)."""

from __future__ import annotations

import time

from support.pipeline_fixtures import REPO

from bcp_pipeline.backends.contract import JobState
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.engine.state import JobRecord, RunState, StageState, StageStatus
from bcp_pipeline.engine.streams import Streams
from bcp_pipeline.engine.submitter import Submitter, job_request

PIPELINE = load_and_check(REPO / "pipelines.yaml").pipeline("slimpajama-8b-fast")


def state(**statuses: StageStatus) -> RunState:
    stages = {
        name: StageState(status=statuses.get(name.replace("-", "_"), StageStatus.PENDING)) for name in PIPELINE.stages
    }
    return RunState(run_id="r", pipeline=PIPELINE.name, backend="local", config_file="x", created_at=0.0, stages=stages)


def due(run: RunState, name: str) -> str | None:
    submitter = Submitter(
        pipeline=PIPELINE,
        backend=None,
        store=None,
        state=run,
        progress=None,
        outcomes=None,
        selected=set(PIPELINE.stages),
    )
    return submitter.due(name)


def test_the_downstream_is_due_once_the_upstream_runs_and_its_plain_needs_are_done():
    assert due(state(bpe=StageStatus.SUCCEEDED), "tokenize-preprocess") is None  # download not submitted
    assert due(state(bpe=StageStatus.SUCCEEDED, download=StageStatus.RUNNING), "tokenize-preprocess") == "stage"
    assert due(state(bpe=StageStatus.SUCCEEDED, download=StageStatus.VERIFYING), "tokenize-preprocess") == "stage"
    assert due(state(bpe=StageStatus.RUNNING, download=StageStatus.RUNNING), "tokenize-preprocess") is None  # bpe plain
    assert due(state(bpe=StageStatus.SUCCEEDED, download=StageStatus.SUBMITTING), "tokenize-preprocess") is None


def test_its_verification_waits_for_the_upstream_s():
    run = state(bpe=StageStatus.SUCCEEDED, download=StageStatus.VERIFYING, tokenize_preprocess=StageStatus.VERIFYING)
    assert due(run, "tokenize-preprocess") is None
    run.stages["download"].status = StageStatus.SUCCEEDED
    assert due(run, "tokenize-preprocess") == "verify"


def test_the_job_of_a_stage_learns_the_digest_of_what_it_streams_from():
    request = job_request(PIPELINE, PIPELINE.stages["tokenize-preprocess"], "stage", "r")
    download = job_request(PIPELINE, PIPELINE.stages["download"], "stage", "r")
    assert request.stream_digests == (download.output_digest,) and download.stream_digests == ()


class Recorder:
    def __init__(self) -> None:
        self.cancelled: list[list[str]] = []
        self.events: list[str] = []
        self.saved = 0

    def cancel(self, ids: list[str]) -> None:
        self.cancelled.append(ids)

    def event(self, text: str) -> None:
        self.events.append(text)

    def save(self, run: RunState) -> None:
        self.saved += 1


def test_a_failed_upstream_cancels_the_running_downstream_naming_why():
    run = state(bpe=StageStatus.SUCCEEDED, download=StageStatus.RUNNING, tokenize_preprocess=StageStatus.RUNNING)
    run.stages["tokenize-preprocess"].jobs.append(
        JobRecord(job_id="t1", kind="stage", attempt=1, submitted_at=time.time())
    )
    recorder = Recorder()
    streams = Streams(pipeline=PIPELINE, backend=recorder, store=recorder, state=run, progress=recorder)
    assert streams.stop_orphans() is False and recorder.cancelled == []  # the download still runs
    run.stages["download"].status = StageStatus.FAILED
    assert streams.stop_orphans() is True
    tokenize = run.stages["tokenize-preprocess"]
    assert recorder.cancelled == [["t1"]] and recorder.saved == 1
    assert tokenize.status is StageStatus.CANCELLED and tokenize.active_job() is None
    assert tokenize.jobs[0].state == JobState.CANCELLED.value
    assert "stopped because download failed" in tokenize.error and recorder.events
    assert streams.stop_orphans() is False  # once
