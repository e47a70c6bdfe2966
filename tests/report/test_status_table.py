"""`status`'s table stays readable with Kubernetes' long Job names: each is shown less its `RUN-STAGE` prefix."""

from __future__ import annotations

from types import SimpleNamespace

from bcp_pipeline.backends.kubernetes.render import job_name
from bcp_pipeline.engine.state import JobRecord, RunState, StageState, StageStatus, new_run_id
from bcp_pipeline.report.text import render_status

STAGES = ("sample", "bpe", "download", "extract", "concat", "tokenize-preprocess", "pretrain")


def kubernetes_job(run_id: str, stage: str, kind: str, attempt: int) -> JobRecord:
    request = SimpleNamespace(run_id=run_id, stage=SimpleNamespace(name=stage), kind=kind, attempt=attempt)
    return JobRecord(
        job_id=job_name(request), kind=kind, attempt=attempt, submitted_at=0.0, state="succeeded", native="Complete"
    )


def test_kubernetes_status_table_fits_a_wide_terminal():
    run_id = new_run_id("demo")
    stages = {}
    for stage in STAGES:  # a stage that failed once: three jobs in its cell, as the trial's 285-character table had
        jobs = [
            kubernetes_job(run_id, stage, "stage", 1),
            kubernetes_job(run_id, stage, "stage", 2),
            kubernetes_job(run_id, stage, "verify", 2),
        ]
        stages[stage] = StageState(
            status=StageStatus.SUCCEEDED,
            sharding={"replicas": 2, "processes": 2},
            attempts=2,
            jobs=jobs,
            progress={"done": 8, "total": 8, "unit": "files"},
        )
    state = RunState(
        run_id=run_id,
        pipeline="demo",
        backend="kubernetes",
        config_file="pipelines.yaml",
        created_at=0.0,
        stages=stages,
    )
    text = render_status(state)
    assert max(len(line) for line in text.splitlines()) <= 150, text  # was 285 with whole names
    row = next(line for line in text.splitlines() if line.startswith("tokenize-preprocess "))
    assert "-a1(Complete), -a2(Complete), -verify-a2*(Complete)" in text
    assert "-tokenize-" in row and "-verify-a2*(Complete)" in row  # a name too long for Kubernetes: hashed
    assert f"(* = verification job; -X = job {run_id}-STAGE-X (or {run_id}-X, a name shortened to fit))" in text
    # Names the backend made otherwise (BCP's numbers) are shown whole, with no legend for them.
    stages["bpe"].jobs = [JobRecord(job_id="7794123", kind="stage", attempt=1, submitted_at=0.0, native="FINISHED")]
    assert "7794123(FINISHED)" in render_status(state)
