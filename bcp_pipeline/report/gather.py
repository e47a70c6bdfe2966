"""`bcp-pipeline report RUN [--out FILE]`: gather what a run left behind, turn it into the report's data
(report_data.py, pure) and its HTML (report_html.py, pure), and write the file atomically.

What is read: the run state; each training stage's job logs through the backend (rank 0, the rank that logs the
loss; one `job log` call per training attempt on BCP); each evaluate stage's latest job log (its held-out losses);
the command lines the submitter kept in
`<run>/submitted/<job id>.txt`, or, for jobs submitted before it kept them, the command re-rendered from the config.
Works on every backend and for failed runs: whatever cannot be read becomes a note in the report, not an error.
"""

from __future__ import annotations

import time
from pathlib import Path

from bcp_pipeline.atomic import atomic_write_text
from bcp_pipeline.backends.contract import Backend
from bcp_pipeline.config.instances import InstanceType
from bcp_pipeline.config.model import PipelineConfig, StageConfig
from bcp_pipeline.config.profiling import SMOKE_PROGRAM
from bcp_pipeline.config.resources import BACKENDS, rank_layout
from bcp_pipeline.config.training import training_plan
from bcp_pipeline.engine.state import RunState, RunStore
from bcp_pipeline.engine.submitter import job_request
from bcp_pipeline.errors import PipelineError, ReportError
from bcp_pipeline.redact import secret_values
from bcp_pipeline.report.data import SubmittedCommand, report_data
from bcp_pipeline.report.estimates import PlanEstimate, instance_peak
from bcp_pipeline.report.heldout import evaluated_trainings, evaluation_points
from bcp_pipeline.report.html import render_report, require_plotly
from bcp_pipeline.report.mfu import flops_per_token
from bcp_pipeline.report.nodes import node_type
from bcp_pipeline.report.throughput import StageFacts, TrainingFacts

RECORDED = "recorded at submission"
RERENDERED = "re-rendered from the config: not recorded at submission"


def write_report(
    store: RunStore,
    state: RunState,
    *,
    pipeline: PipelineConfig | None,
    backend: Backend | None,
    estimate: PlanEstimate | None,
    actual: dict[str, dict],
    out: Path | None = None,
    notes: list[str] | None = None,
    instances: dict[str, InstanceType] | None = None,
) -> Path:
    """Write the report of `state` to `out` (default `<run>/report.html`); returns the path written."""
    require_plotly()
    notes = list(notes or [])
    run_dir = store.run_dir(state.run_id)
    logs = training_logs(state, pipeline, backend, notes)
    heldout = heldout_results(state, pipeline, backend, notes)
    commands = submitted_commands(state, run_dir, pipeline, backend, notes)
    facts = {
        name: stage_facts(pipeline.stages[name], state.backend, instances or {})
        for name in state.stages
        if pipeline is not None and name in pipeline.stages
    }
    data = report_data(
        state,
        now=time.time(),
        estimate=estimate,
        actual=actual,
        training_logs=logs,
        commands=commands,
        secrets=secret_values(),
        notes=notes,
        stage_facts=facts,
        heldout=heldout,
        cpu_peak_tflops=pipeline.estimates.cpu_peak_tflops if pipeline is not None else None,
    )
    page = render_report(data)
    path = out or run_dir / "report.html"
    try:
        atomic_write_text(path, page)
    except OSError as exc:
        raise ReportError(f"cannot write the report to {path}: {exc}; choose another file with --out FILE") from None
    return path


def latest_throughput(
    state: RunState, pipeline: PipelineConfig, backend: Backend, instances: dict[str, InstanceType]
) -> list[dict]:
    """`status`: step time, tokens/s and MFU of each training stage's latest attempt, from rank 0's log (one log
    read per training stage); a log that cannot be read leaves its stage out."""
    logs: dict[str, str] = {}
    for name, stage_state in state.stages.items():
        jobs = [job for job in stage_state.jobs if job.kind == "stage"]
        if jobs and is_training_stage(name, pipeline.stages.get(name), state):
            try:
                logs[jobs[-1].job_id] = backend.logs(jobs[-1].job_id, rank=0)
            except (PipelineError, OSError):
                continue
    facts = {
        name: stage_facts(pipeline.stages[name], state.backend, instances)
        for name in state.stages
        if name in pipeline.stages
    }
    return report_data(
        state,
        now=time.time(),
        training_logs=logs,
        stage_facts=facts,
        cpu_peak_tflops=pipeline.estimates.cpu_peak_tflops,
    )["throughput"]


def heldout_results(
    state: RunState, pipeline: PipelineConfig | None, backend: Backend | None, notes: list[str] | None = None
) -> dict[str, dict]:
    """Per evaluate stage: the training it evaluates and its results so far, from its latest job's log (which
    repeats the earlier jobs' results); a log that cannot be read is a note."""
    found: dict[str, dict] = {}
    if pipeline is None or backend is None:
        return found
    for name, training in evaluated_trainings(pipeline).items():
        jobs = [job for job in state.stages[name].jobs if job.kind == "stage"] if name in state.stages else []
        if not jobs:
            continue
        try:
            text = backend.logs(jobs[-1].job_id, rank=0)
        except (PipelineError, OSError) as exc:
            if notes is not None:
                notes.append(f"{name}: could not read the log of job {jobs[-1].job_id}: {exc}")
            continue
        found[name] = {"stage": name, "training": training, "points": evaluation_points([text])}
    return found


def stage_facts(stage: StageConfig, backend: str, instances: dict[str, InstanceType]) -> StageFacts:
    """A training stage's FLOPs per token, tokens per step and GPU peak from its config; the smoke pretrain's facts
    come from its log (facts None)."""
    if stage.engine is None:
        return StageFacts(None, None, "")
    on = backend if backend in BACKENDS else "bcp"  # the job's shape and image on the backend it ran on
    model = training_plan(stage, on)
    shape = model.shape
    if shape is None:
        return StageFacts(None, None, f"no tokens/s or MFU: no model shape for {model.model!r}")
    instance_name = stage.bcp.instance
    layout = rank_layout(stage, on)
    instance = instances.get(instance_name or "")
    declared = node_type(stage, on, instances, None).training_gpus
    gpus = layout.nodes * (declared or model.gpus_per_node or (instance.gpus if instance else 0))
    facts = TrainingFacts(
        flops_per_token(shape, model.tensor_parallel), model.global_batch_size * shape.seq_length, "gpu", gpus
    )
    if instance is None:
        return StageFacts(facts, None, f"no MFU: instance {instance_name!r} is not known (backends.bcp.instances)")
    peak = instance_peak(instance_name, gpus, instance)
    # The run's own node type where its section names one (BCP's instance is the one used); else the BCP one's.
    named = on == backend and stage.resources(on).instance_field
    where = "" if named else f" (the stage's BCP instance; the run is on {backend})"
    return StageFacts(facts, peak, f"MFU against {peak.source}{where}")


def is_training_stage(name: str, stage: StageConfig | None, state: RunState) -> bool:
    """A stage whose log holds loss lines: NeMo training, the smoke pretrain (its profile run has no continuation),
    a continued stage, or one that verified steps."""
    if stage is not None and (stage.trains or stage.program == SMOKE_PROGRAM):
        return True
    return "steps" in (state.stages[name].verification or {})


def training_logs(
    state: RunState, pipeline: PipelineConfig | None, backend: Backend | None, notes: list[str]
) -> dict[str, str]:
    """The training log (the one with the step lines: Backend.training_log) of every attempt of every training
    stage, by job id."""
    logs = {}
    for name, stage_state in state.stages.items():
        stage = pipeline.stages.get(name) if pipeline is not None else None
        jobs = [job for job in stage_state.jobs if job.kind == "stage"]
        if not jobs or not is_training_stage(name, stage, state):
            continue
        if backend is None:
            notes.append(f"{name}: training log not read (the run's config could not be loaded)")
            continue
        for job in jobs:
            try:
                logs[job.job_id] = backend.training_log(job.job_id)
            except (PipelineError, OSError) as exc:
                notes.append(f"{name}: could not read the log of job {job.job_id}: {exc}")
    return logs


def submitted_commands(
    state: RunState, run_dir: Path, pipeline: PipelineConfig | None, backend: Backend | None, notes: list[str]
) -> dict[str, SubmittedCommand]:
    """Each job's command as kept at submission; else re-rendered from the config (the same renderer `run` uses)."""
    commands, missing = {}, []
    for name, stage_state in state.stages.items():
        for job in stage_state.jobs:
            path = run_dir / "submitted" / f"{job.job_id}.txt"
            if path.is_file():
                commands[job.job_id] = SubmittedCommand(path.read_text(encoding="utf-8").rstrip("\n"), RECORDED)
            else:
                missing.append((name, job))
    if missing and pipeline is not None and backend is not None:
        try:
            backend.prepare(pipeline, execute=False)  # BCP: the code folder's content hash, which commands name
            for name, job in missing:
                request = job_request(pipeline, pipeline.stages[name], job.kind, state.run_id, attempt=job.attempt)
                commands[job.job_id] = SubmittedCommand(backend.render(request).printable, RERENDERED)
        except (PipelineError, OSError, KeyError) as exc:
            notes.append(f"commands not kept at submission could not be re-rendered: {exc}")
    return commands
