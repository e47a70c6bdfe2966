"""Estimates for `plan` and `status`: items, bytes, wall time, node-hours and GPU-hours of each stage. Pure (no I/O).

Every figure is for the backend planned: its rank layout (nodes x processes), and its node as node_type() reads it
(BCP: the instance; local: this machine; Slurm, Grid Engine, Kubernetes: the GPUs and CPUs their sections declare,
on nodes like the BCP instance). Data stages: the declared data-set sizes (`estimates:` of the pipeline) over per-core
throughputs (defaults from this project's benchmark, docs/performance.md) times the cores the stage uses on its node;
download over a declared per-node rate. Pretraining: tokens = steps x global batch x sequence; FLOPs per token from
the model shape; GPUs x peak dense BF16 x a declared MFU. docs/estimates-and-report.md ("Where the estimate figures come
from") sources every figure.
Queueing, job start-up, verification jobs and restarts between training attempts are not counted.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bcp_pipeline.config import evaluate
from bcp_pipeline.config.durations import format_elapsed, parse_duration
from bcp_pipeline.config.instances import InstanceType
from bcp_pipeline.config.model import PipelineConfig, StageConfig, expected_count
from bcp_pipeline.config.resources import RankLayout, rank_layout
from bcp_pipeline.config.training import training_plan
from bcp_pipeline.engine.state import StageState
from bcp_pipeline.report.heldout import EVALUATE_PROGRAM
from bcp_pipeline.report.measured import Measurement, measured_steps
from bcp_pipeline.report.mfu import Peak, flops_per_token, gpu_peak, params_for_flops, step_seconds_at
from bcp_pipeline.report.nodes import NodeType, node_type
from bcp_pipeline.report.schedule import schedule


@dataclass(frozen=True)
class Throughput:
    """A data program's per-core rate and how many cores one of its processes uses."""

    per_core: float  # default, from this project's benchmark (docs/performance.md)
    unit: str  # "MB/s" (of output written) or "tokens/s"
    threads_option: str | None = None  # the program's option giving cores per process
    default_threads: int | None = 1  # without the option; None: every core of the node
    engine: str | None = None  # what the rate assumes runs, where the program may run something slower instead


DATA_PROGRAMS = {
    "extract.py": Throughput(312.0, "MB/s", "--threads", 2),  # 625 MB/s with --threads 2 on 2 cores, 9.8 GB
    "concat.py": Throughput(976.0, "MB/s"),  # one process, 9.8 GB
    # Tokens per CPU-second of the stage with gigatoken, 2 workers (--only tokenize, median of 5, 2026-12-01); with
    # tiktoken (where a job's image cannot install gigatoken) about 1/9 of it.
    "preprocess.py": Throughput(27.1e6, "tokens/s", "--workers", None, "gigatoken"),
}
DOWNLOAD_PROGRAM = "download.py"
IDX_BYTES_PER_DOCUMENT = 20  # Megatron .idx: int32 size + int64 pointer + int64 document index per document
TOKEN_BYTES = 2  # .bin holds uint16 ids for vocabularies under 65,500 (GPT-2)


@dataclass
class StageEstimate:
    """One stage's estimate; None where a figure is unknown (its reason is in `notes`)."""

    stage: str
    instance: str | None
    nodes: int
    gpus_per_node: int
    items_in: int | None = None
    items_out: int | None = None
    unit_out: str = "files"
    bytes_in: float | None = None
    bytes_out: float | None = None
    seconds: float | None = None
    basis: str = ""  # how the time was reached, in words
    modelled: bool = True  # False: a program this module has no model for (small ones such as bpe); counted as 0
    notes: list[str] = field(default_factory=list)
    training: dict | None = None  # tokens, FLOPs per token, attempts (pretraining only)

    @property
    def node_hours(self) -> float | None:
        return None if self.seconds is None else self.seconds / 3600 * self.nodes

    @property
    def gpu_hours(self) -> float | None:
        return None if self.node_hours is None else self.node_hours * self.gpus_per_node

    def as_json(self) -> dict:
        return {**asdict(self), "node_hours": self.node_hours, "gpu_hours": self.gpu_hours}


@dataclass
class PlanEstimate:
    stages: list[StageEstimate]
    seconds: float  # along the longest path of the DAG; stages without a time count as 0
    complete: bool  # every modelled stage had a time
    warnings: list[str]
    data_seconds: float = 0.0  # until the last data stage ends, streamed edges overlapping (schedule.py)
    serial_data_seconds: float = 0.0  # the same with every stage waiting for its needs to end

    @property
    def node_hours(self) -> float:
        return sum(s.node_hours or 0.0 for s in self.stages)

    @property
    def gpu_hours(self) -> float:
        return sum(s.gpu_hours or 0.0 for s in self.stages)

    def as_json(self) -> dict:
        return {
            "stages": [s.as_json() for s in self.stages],
            "total": {
                "seconds": self.seconds,
                "node_hours": self.node_hours,
                "gpu_hours": self.gpu_hours,
                "complete": self.complete,
            },
            "data_preparation": {"seconds": self.data_seconds, "serial_seconds": self.serial_data_seconds},
            "warnings": self.warnings,
        }


def estimate_pipeline(
    pipeline: PipelineConfig,
    instances: dict[str, InstanceType],
    measured: Measurement | None = None,
    counted_tokens: dict[str, int] | None = None,
    backend: str = "bcp",
    here: InstanceType | None = None,
) -> PlanEstimate:
    """Every stage's estimate on `backend`, the total along the DAG's longest path (streamed edges overlapping,
    schedule.py), and warnings. `measured`: a
    profile run's step time, which replaces the declared MFU for its stage when it ran on the same backend,
    instance and nodes. `counted_tokens`: per training stage, the tokens its data holds as counted from the
    preprocess manifests (manifest_tokens), where they exist. `here`: this machine, the local backend's node."""
    stages = {
        name: estimate_stage(
            pipeline, pipeline.stages[name], instances, measured, (counted_tokens or {}).get(name), backend, here
        )
        for name in pipeline.order()
    }
    timing = schedule(
        pipeline,
        {name: est.seconds for name, est in stages.items()},
        {name: est.items_out for name, est in stages.items()},
        backend,
    )
    for name, note in timing.notes.items():
        stages[name].notes.append(note)
    warnings = [w for s in stages.values() for w in _warnings(pipeline.stages[s.stage], s)]
    return PlanEstimate(
        stages=list(stages.values()),
        seconds=max(timing.finish.values(), default=0.0),
        complete=all(s.seconds is not None for s in stages.values() if s.modelled),
        warnings=warnings,
        data_seconds=timing.data_seconds,
        serial_data_seconds=timing.serial_data_seconds,
    )


def estimate_stage(
    pipeline: PipelineConfig,
    stage: StageConfig,
    instances: dict[str, InstanceType],
    measured: Measurement | None = None,
    counted_tokens: int | None = None,
    backend: str = "bcp",
    here: InstanceType | None = None,
) -> StageEstimate:
    layout = rank_layout(stage, backend)  # the job's shape as the backend's renderer makes it (one place for both)
    node = node_type(stage, backend, instances, here)
    instance = node.facts
    est = StageEstimate(
        stage=stage.name,
        instance=node.label,
        nodes=layout.nodes,
        gpus_per_node=instance.gpus if instance else 0,
        notes=list(node.notes),
    )
    if stage.verify:
        est.items_out = expected_count(pipeline, stage.name, stage.verify[0])
    upstream = [pipeline.stages[n] for n in stage.needs if pipeline.stages[n].verify]
    if upstream:
        est.items_in = expected_count(pipeline, upstream[0].name, upstream[0].verify[0])
    share = data_share(pipeline, stage)
    size = {
        key: None if (value := pipeline.estimates.number(key, pipeline.vars)) is None else value * share
        for key in ("compressed_bytes", "text_bytes", "documents", "tokens")
    }
    if share != 1.0:
        est.notes.append(
            f"{share:.2g} of the declared data-set size: the files of its download against the "
            "largest download's (a held-out split, say)"
        )
    if stage.engine:
        _estimate_training(pipeline, stage, node, est, size, counted_tokens)
        if measured is not None and measured.stage == stage.name:
            _use_measurement(est, stage, measured, backend)
    elif stage.program == DOWNLOAD_PROGRAM:
        est.items_in = est.items_out
        est.bytes_in = est.bytes_out = size["compressed_bytes"]
        rate = pipeline.estimates.download_mb_per_s_per_node
        if rate is None:
            est.notes.append("no download rate declared (estimates.download_mb_per_s_per_node)")
        elif est.bytes_in is not None:
            est.seconds = est.bytes_in / (rate * 1e6 * layout.nodes)
            est.basis = f"{layout.nodes} node(s) x {rate:g} MB/s (declared)"
    elif stage.program in DATA_PROGRAMS:
        _estimate_data(pipeline, stage, instance, est, size, layout)
    elif stage.export_of in pipeline.stages and training_plan(pipeline.stages[stage.export_of], "bcp"):
        _estimate_export(pipeline, pipeline.stages[stage.export_of], est)
    elif measured is not None and measured.stage == stage.name and stage.trains:  # the smoke pretrain
        est.seconds, est.basis, est.modelled = measured_steps(measured, stage, backend, est, pipeline.vars)
    elif stage.evaluate_of in pipeline.stages and training_plan(pipeline.stages[stage.evaluate_of], "bcp"):
        target = pipeline.stages[stage.evaluate_of]
        _estimate_bridge_evaluation(pipeline, stage, target, est, instance, node_type(target, backend, instances, here))
    elif stage.program == EVALUATE_PROGRAM:
        # A forward pass over a few batches a checkpoint, beside the training it streams from: it ends with that
        # training's last checkpoint, plus one evaluation.
        est.unit_out, est.modelled = "results", False
        beside = f"beside {stage.streamed[0]} (streamed), " if stage.streamed else ""
        est.basis = f"{beside}one result per checkpoint; not timed (counted as 0)"
    else:
        est.modelled, est.basis = False, "not modelled (counted as 0)"
    return est


def _estimate_bridge_evaluation(
    pipeline: PipelineConfig,
    stage: StageConfig,
    target: StageConfig,
    est: StageEstimate,
    instance: InstanceType | None,
    training_node: NodeType,
) -> None:
    """An evaluate_of stage (config/evaluate.py): a forward pass (a third of a training step's FLOPs a token) over
    eval_iters global batches a checkpoint, on one data-parallel rank's GPUs, at the training's MFU; with the
    training's own step time, whether it keeps pace with the checkpoints (it must: the training prunes them)."""
    est.unit_out = "results"
    plan = training_plan(target, "bcp")
    if plan.shape is None or instance is None or not instance.gpus:
        est.modelled, est.basis = False, "not modelled (no model shape or no GPU instance; counted as 0)"
        return
    # Bridge scores each held-out split of the data list in turn: the test split (test_data_dir) is a second pass
    splits = 2 if target.megatron_bridge.test_data_dir else 1
    gpus, tokens = evaluate.world_size(target), evaluate.evaluated_tokens(target) * splits
    per_token = flops_per_token(plan.shape, plan.tensor_parallel) / 3
    mfu = pipeline.estimates.mfu
    per_result = tokens * per_token / (instance_peak(stage.bcp.instance, gpus, instance).flops_per_s * mfu)
    est.seconds = per_result * (est.items_out or 0)
    est.gpus_per_node = gpus
    est.basis = (
        f"beside {stage.evaluate_of} (streamed): {short_number(tokens)} tokens forward a checkpoint"
        f"{' (validation and test splits)' if splits == 2 else ''}, {gpus} GPUs x "
        f"{instance.gpu_peak_tflops:g} TFLOP/s x MFU {mfu:g}"
    )
    facts = training_node.facts
    if facts is None or not facts.gpus:
        return
    training_gpus = rank_layout(target, "bcp").nodes * facts.gpus
    peak = instance_peak(target.bcp.instance, training_gpus, facts)
    interval = target.megatron_bridge.save_interval * step_seconds_at(
        mfu, plan.global_batch_size * plan.shape.seq_length, flops_per_token(plan.shape, plan.tensor_parallel), peak
    )
    pace = (
        f"it keeps pace, busy {per_result / interval:.0%} of the time it holds its {gpus} GPUs (all the training's)"
        if per_result < interval
        else f"it falls behind, and megatron_bridge.most_recent_k={target.megatron_bridge.most_recent_k} "
        "prunes checkpoints it has not read: give the evaluation more GPUs or save less often"
    )
    est.notes.append(
        f"one evaluation takes {format_elapsed(per_result)}; a checkpoint lands every "
        f"{format_elapsed(interval)} ({target.megatron_bridge.save_interval} steps): {pace}"
    )


def _estimate_export(pipeline: PipelineConfig, target: StageConfig, est: StageEstimate) -> None:
    """An export (config/export.py) reads the model's weights out of the checkpoint and writes them once, in bf16
    (2 bytes a weight: the matrices and the untied input embedding), at the declared storage rate; AutoBridge's
    conversion on the CPU is not counted."""
    plan = training_plan(target, "bcp")
    if plan.shape is None:
        est.notes.append(f"no model shape for {plan.model!r}: the export's size is unknown")
        return
    weights = params_for_flops(plan.shape, plan.tensor_parallel) + plan.shape.vocab_size * plan.shape.hidden_size
    est.bytes_in = est.bytes_out = 2.0 * weights
    storage = pipeline.estimates.storage_mb_per_s_per_node
    if storage is None:
        est.notes.append("no storage_mb_per_s_per_node declared: the export's time is unknown")
        return
    est.seconds = (est.bytes_in + est.bytes_out) / (storage * 1e6)
    est.basis = f"{short_number(weights)} weights read and written in bf16 at {storage:g} MB/s (declared)"


def data_share(pipeline: PipelineConfig, stage: StageConfig) -> float:
    """The part of the declared data-set size a data stage handles: the files of the download it descends from
    against the pipeline's largest download (1 for the training data; 8 of 59,166 for a held-out split's 8 files).
    A training stage, or one without a counted download upstream, takes the whole."""
    if stage.engine is not None:
        return 1.0
    counts = {
        name: expected_count(pipeline, name, s.verify[0])
        for name, s in pipeline.stages.items()
        if s.program == DOWNLOAD_PROGRAM and s.verify
    }
    if not counts or not max(counts.values()):
        return 1.0
    seen, todo, found = set(), [stage.name], []
    while todo:  # every download upstream: a stage that reads the training data and a held-out split takes the whole
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in counts:
            found.append(counts[name])
        else:
            todo.extend(pipeline.stages[name].needs)
    return max(found) / max(counts.values()) if found else 1.0


def _estimate_data(
    pipeline: PipelineConfig,
    stage: StageConfig,
    instance: InstanceType | None,
    est: StageEstimate,
    size: dict[str, float | None],
    layout: RankLayout,
) -> None:
    program = DATA_PROGRAMS[stage.program]
    reads_zst = any(pipeline.stages[n].program == DOWNLOAD_PROGRAM for n in stage.needs)
    if stage.program == "extract.py":
        est.bytes_in, est.bytes_out = size["compressed_bytes"], size["text_bytes"]
    elif stage.program == "concat.py":
        est.bytes_in = est.bytes_out = size["text_bytes"]
    else:
        est.bytes_in = size["compressed_bytes"] if reads_zst else size["text_bytes"]
        est.bytes_out = token_file_bytes(size["tokens"], size["documents"])
    work = size["tokens"] if program.unit == "tokens/s" else est.bytes_out
    if instance is None or work is None:
        if work is None:
            est.notes.append("data-set size not declared (estimates: text_bytes, tokens)")
        return
    per_core = pipeline.estimates.per_core.get(stage.program, program.per_core)
    cores = cores_per_node(stage, program, instance, layout)
    scale = 1e6 if program.unit == "MB/s" else 1.0
    replicas = layout.nodes
    est.seconds = work / (per_core * scale * cores * replicas)
    source = "declared" if stage.program in pipeline.estimates.per_core else "benchmark"
    engine = f", {program.engine}" if program.engine and source == "benchmark" else ""
    est.basis = f"{replicas} x {cores} cores x {short_number(per_core)} {program.unit} ({source}{engine})"
    storage = pipeline.estimates.storage_mb_per_s_per_node
    io_bytes = max(est.bytes_in or 0.0, est.bytes_out or 0.0)
    if storage is None:
        est.notes.append("CPU-bound only: no storage_mb_per_s_per_node declared")
    elif io_bytes / (storage * 1e6 * replicas) > est.seconds:
        est.seconds = io_bytes / (storage * 1e6 * replicas)
        est.basis = f"{replicas} node(s) x {storage:g} MB/s storage (declared)"


def cores_per_node(stage: StageConfig, program: Throughput, instance: InstanceType, layout: RankLayout) -> int:
    """Processes x the program's threads (or workers) per process, at most the node's cores."""
    threads = _threads(stage, program)
    if threads is None:
        return instance.cpu_cores
    return max(1, min(layout.per_node * threads, instance.cpu_cores))


def _threads(stage: StageConfig, program: Throughput) -> int | None:
    """The program's threads (or workers) per process as the stage's args give them, else its default."""
    if program.threads_option and program.threads_option in stage.args:
        index = stage.args.index(program.threads_option)
        if index + 1 < len(stage.args) and re.fullmatch(r"\d+", stage.args[index + 1]):
            return int(stage.args[index + 1])
    return program.default_threads


def token_file_bytes(tokens: float | None, documents: float | None) -> float | None:
    if tokens is None:
        return None
    return tokens * TOKEN_BYTES + (documents or 0) * IDX_BYTES_PER_DOCUMENT


def _estimate_training(
    pipeline: PipelineConfig,
    stage: StageConfig,
    node: NodeType,
    est: StageEstimate,
    size: dict[str, float | None],
    counted_tokens: int | None,
) -> None:
    instance = node.facts
    model = training_plan(stage)
    shape = model.shape
    est.unit_out = "steps"
    est.items_out = model.steps
    est.bytes_in = token_file_bytes(size["tokens"], size["documents"])
    if node.training_gpus is not None:
        est.gpus_per_node = node.training_gpus
    elif model.gpus_per_node:
        est.gpus_per_node = model.gpus_per_node
    if shape is None:
        est.notes.append(f"no model shape for {model.model!r}: no FLOPs, no training time")
        return
    tokens = model.steps * model.global_batch_size * shape.seq_length
    per_token = flops_per_token(shape, model.tensor_parallel)
    mfu = pipeline.estimates.mfu
    est.training = {
        "tokens": tokens,
        "flops_per_token": per_token,
        "flops": tokens * per_token,
        "mfu": mfu,
        "steps": model.steps,
        "global_batch_size": model.global_batch_size,
        "seq_length": shape.seq_length,
        "steps_key": model.steps_key,
        "attempts_key": f"{model.engine}.max_attempts",
    }
    # Epochs: the tokens trained against the tokens the data holds (counted from the manifests once they exist).
    data_tokens, source = (
        (counted_tokens, "counted in the preprocess manifests")
        if counted_tokens
        else (size["tokens"], "declared: estimates.tokens")
    )
    if data_tokens:
        est.training.update(
            data_tokens=data_tokens,
            data_source=source,
            epochs=tokens / data_tokens,
            steps_per_epoch=int(data_tokens // (model.global_batch_size * shape.seq_length)),
        )
    else:
        est.notes.append("the data's size is not declared (estimates.tokens): epochs unknown until it is counted")
    if instance is None:
        return
    if est.gpus_per_node == 0:
        est.notes.append("no GPUs: the training's time is not estimated (on CPU it is a smoke test)")
        return
    gpus = est.nodes * est.gpus_per_node
    peak = instance_peak(stage.bcp.instance, gpus, instance)
    est.seconds = tokens * per_token / (peak.flops_per_s * mfu)
    est.basis = f"{gpus} GPUs x {instance.gpu_peak_tflops:g} TFLOP/s x MFU {mfu:g}"
    est.training.update(
        peak=peak.source, step_seconds=step_seconds_at(mfu, model.global_batch_size * shape.seq_length, per_token, peak)
    )
    if stage.bcp.total_runtime:
        per_attempt = parse_duration(stage.bcp.total_runtime) - parse_duration(model.time_margin)
        max_attempts = stage.continuation.max_attempts if stage.continuation else model.max_attempts
        est.training.update(
            attempt_seconds=per_attempt,
            attempts=math.ceil(est.seconds / per_attempt),
            max_attempts=max_attempts,
            total_runtime=stage.bcp.total_runtime,
        )


def _use_measurement(est: StageEstimate, stage: StageConfig, measured: Measurement, backend: str) -> None:
    """The measured step time instead of the declared MFU, when it ran on this backend, instance and node count."""
    if est.training is None or est.seconds is None:
        return
    if (measured.backend, measured.instance, measured.nodes) != (backend, stage.bcp.instance, est.nodes):
        est.notes.append(
            f"{measured.source} ran on {measured.backend} ({measured.nodes} x "
            f"{measured.instance or 'no BCP instance'}), not {est.nodes} x {stage.bcp.instance} on "
            f"{backend}: its step time is not used"
        )
        return
    est.seconds = est.training["steps"] * measured.step_s
    mfu = f", MFU {measured.mfu:.0%}" if measured.mfu is not None else ""
    est.basis = f"from {measured.source}: {measured.step_s:.3g} s/step{mfu}"
    est.training.update(measured=est.basis, step_seconds=measured.step_s)
    if "attempt_seconds" in est.training:
        est.training["attempts"] = math.ceil(est.seconds / est.training["attempt_seconds"])


def instance_peak(name: str | None, gpus: int, instance: InstanceType) -> Peak:
    """The peak of a job's GPUs; the datasheet's where the instance's figure is the known GPU's, else declared."""
    known = gpu_peak(name, gpus)
    if known is not None and known.tflops_per_device == instance.gpu_peak_tflops:
        return known
    return gpu_peak(name, gpus, declared_tflops=instance.gpu_peak_tflops)


def _warnings(stage: StageConfig, est: StageEstimate) -> list[str]:
    training = est.training or {}
    return _epoch_warnings(stage, training) + _runtime_warnings(stage, est, training)


def _epoch_warnings(stage: StageConfig, training: dict) -> list[str]:
    if training.get("epochs", 0) <= 1:
        return []
    return [
        f"{stage.name}: {training['steps']:,} steps train {short_number(training['tokens'])} tokens, "
        f"{training['epochs']:.1f} epochs of the data's {short_number(training['data_tokens'])} "
        f"({training['data_source']}): the model sees every token {training['epochs']:.0f} times. One epoch is "
        f"{training['steps_per_epoch']:,} steps (--set {stage.name}.{training['steps_key']}="
        f"{training['steps_per_epoch']}), or give it more data."
    ]


def _runtime_warnings(stage: StageConfig, est: StageEstimate, training: dict) -> list[str]:
    if "attempts" in training:
        if training["attempts"] > training["max_attempts"]:
            return [
                f"{stage.name}: training needs {training['attempts']} attempts of {training['total_runtime']} "
                f"but max_attempts is {training['max_attempts']}: the stage stops short of "
                f"{training['steps']:,} steps. Set {stage.name}.{training['attempts_key']} to "
                f"{training['attempts']} or more (--set {stage.name}.{training['attempts_key']}="
                f"{training['attempts']}), or give it more nodes."
            ]
        return []
    runtime = stage.bcp.total_runtime
    if est.seconds is not None and runtime and not stage.continuation and est.seconds > parse_duration(runtime):
        return [
            f"{stage.name}: estimated {format_elapsed(est.seconds)} exceeds total_runtime {runtime}: raise "
            f"{stage.name}.bcp.total_runtime or replicas (a rerun continues from finished items)"
        ]
    return []


# -- estimate against actual (status) ---------------------------------------------------------------------------
def actual_rates(stage: StageConfig, state: StageState, now: float) -> dict:
    """Elapsed seconds and the effective throughput of a started stage, from its run state.

    Elapsed runs from the first submission to the end of its verification (or `now`), queueing included. Items
    and bytes are the first verification check's (bytes: what the outputs hold); the tokens of tokenize-preprocess
    are its .bin bytes / 2 (uint16 ids); steps are the checkpoint step its verification read.
    """
    if state.started_at is None:
        return {}
    elapsed = max((state.finished_at or now) - state.started_at, 1e-9)
    result: dict = {"elapsed_s": elapsed}
    checks = (state.verification or {}).get("checks") or []
    done = checks[0]["found"] if checks else (state.progress or {}).get("done")
    if done is not None:
        result["items_per_s"] = done / elapsed
    written = checks[0].get("bytes") if checks else None
    if written:
        result["mb_per_s"] = written / 1e6 / elapsed
        program = DATA_PROGRAMS.get(stage.program)
        if program is not None and state.sharding:
            cores = state.sharding["replicas"] * state.sharding["processes"] * (_threads(stage, program) or 1)
            per_core = (written / TOKEN_BYTES if program.unit == "tokens/s" else written / 1e6) / elapsed / cores
            result["tokens_per_s_per_core" if program.unit == "tokens/s" else "mb_per_s_per_core"] = per_core
    steps = (state.verification or {}).get("steps")
    if steps is not None:
        result["steps_per_s"] = steps / elapsed
    return result


# -- numbers ------------------------------------------------------------------------------------------------------
def short_number(value: float) -> str:
    """1.95e6 -> '1.95 M': three significant digits and an SI prefix."""
    for limit, suffix in ((1e12, " T"), (1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:g}"


def manifest_tokens(folder: Path) -> int | None:
    """The tokens the preprocess manifests in `folder` hold (each `*.manifest.json` has `tokens`); None when there
    are none (the data does not exist yet). Reads files: the one impure function here, kept with its only use."""
    total, found = 0, False
    for path in sorted(folder.glob("*.manifest.json")):
        try:
            total += int(json.loads(path.read_text()).get("tokens", 0))
            found = True
        except (OSError, ValueError):
            continue  # a manifest being written: the count is an estimate's input, not a check
    return total if found else None
