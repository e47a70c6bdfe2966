"""Pretraining with NVIDIA's NeMo launcher: preflight checks and the rendered training command.

The command is the guide's `python3 .../launcher_scripts/main.py cluster_type=bcp stages=[training] ...`, with
`training.model.data.data_prefix` built inside the job from the preprocess manifests (stages/data_list.py: every
.bin/.idx pair, weights proportional to tokens, summing to 1) instead of 74 hand-typed entries.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from .pipelines import Continuation, PipelineConfig, StageConfig, substitute
from .durations import format_clock, parse_duration


@dataclass(frozen=True)
class ModelConfig:
    """The parallelism facts of a launcher training config (conf/training/gpt3/*.yaml)."""

    tensor_parallel: int
    pipeline_parallel: int
    global_batch_size: int
    micro_batch_size: int
    max_steps: int


KNOWN_MODELS = {
    "gpt3/126m": ModelConfig(tensor_parallel=1, pipeline_parallel=1, global_batch_size=256, micro_batch_size=4,
                             max_steps=600000),
    "gpt3/7b_improved": ModelConfig(tensor_parallel=4, pipeline_parallel=1, global_batch_size=512,
                                    micro_batch_size=1, max_steps=300000),
}


@dataclass(frozen=True)
class ModelShape:
    """The shape facts of a launcher training config, for the FLOPs of a training token (estimates.py)."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    seq_length: int
    gated_mlp: bool  # swiglu: three FFN matrices instead of two
    make_vocab_size_divisible_by: int = 128  # Megatron pads the vocabulary to a multiple of this x TP
    vocab_size: int = 50257  # GPT-2 BPE, the tokenizer of both configs


# From conf/training/gpt3/{126m,7b_improved}.yaml of NVIDIA/NeMo-Framework-Launcher (model: section).
KNOWN_SHAPES = {
    "gpt3/126m": ModelShape(num_layers=12, hidden_size=768, ffn_hidden_size=3072, seq_length=2048, gated_mlp=False),
    "gpt3/7b_improved": ModelShape(num_layers=32, hidden_size=4096, ffn_hidden_size=10880, seq_length=2048,
                                   gated_mlp=True),  # activation: fast-swiglu
}
MAX_NODES_LISTED = 256
DATA_LIST_FILE = "data_prefix.txt"


def model_config(stage: StageConfig) -> ModelConfig:
    """The known model's facts, with any value the pipeline gives taking precedence."""
    nemo = stage.nemo
    assert nemo is not None
    known = KNOWN_MODELS.get(nemo.model)
    values = {}
    for field in ("tensor_parallel", "pipeline_parallel", "global_batch_size", "micro_batch_size", "max_steps"):
        value = getattr(nemo, field)
        if value is None and known is not None:
            value = getattr(known, field)
        if value is None:
            raise ValueError(f"model {nemo.model!r} is not one of the known configs ({', '.join(KNOWN_MODELS)}): "
                             f"give tensor_parallel, pipeline_parallel, global_batch_size, micro_batch_size and "
                             f"max_steps in the stage's nemo: section")
        values[field] = value
    return ModelConfig(**values)


def gpus_per_node(stage: StageConfig, instance: str | None) -> int:
    if stage.nemo and stage.nemo.gpus_per_node:
        return stage.nemo.gpus_per_node
    match = re.search(r"\.(\d+)\.[a-z]+$", instance or "")
    if not match:
        raise ValueError(f"cannot tell the GPUs per node of instance {instance!r}; set nemo.gpus_per_node")
    return int(match.group(1))


def valid_node_counts(model: ModelConfig, gpus: int, limit: int = MAX_NODES_LISTED) -> list[int]:
    return [n for n in range(1, limit + 1) if _parallel_error(model, n, gpus) is None]


def _parallel_error(model: ModelConfig, nodes: int, gpus: int) -> str | None:
    world = nodes * gpus
    model_parallel = model.tensor_parallel * model.pipeline_parallel
    if world % model_parallel:
        return f"{nodes} node(s) x {gpus} GPUs = {world} is not divisible by TP {model.tensor_parallel} x PP " \
               f"{model.pipeline_parallel}"
    data_parallel = world // model_parallel
    if model.global_batch_size % (model.micro_batch_size * data_parallel):
        return (f"global batch {model.global_batch_size} is not divisible by micro batch {model.micro_batch_size} x "
                f"data-parallel size {data_parallel} ({nodes} node(s) x {gpus} GPUs / TP {model.tensor_parallel} / "
                f"PP {model.pipeline_parallel})")
    return None


def check_parallelism(stage: StageConfig, nodes: int, gpus: int) -> None:
    model = model_config(stage)
    problem = _parallel_error(model, nodes, gpus)
    if problem:
        valid = valid_node_counts(model, gpus)
        raise ValueError(f"{stage.nemo.model} on {nodes} node(s): {problem}; valid node counts with {gpus} GPUs per "
                         f"node: {', '.join(map(str, valid)) or 'none up to ' + str(MAX_NODES_LISTED)}")


@dataclass(frozen=True)
class TimeLimits:
    max_time: str  # trainer.max_time, D:HH:MM:SS: NeMo saves a checkpoint and stops cleanly here
    time_limit: str  # run.time_limit, D-HH:MM:SS: the launcher's own limit, between max_time and the runtime


def time_limits(stage: StageConfig, total_runtime: str | None) -> TimeLimits:
    if not total_runtime:
        raise ValueError("pretraining needs total_runtime: max_time is derived from it")
    runtime = parse_duration(total_runtime)
    margin = parse_duration(stage.nemo.time_margin)
    if margin >= runtime:
        raise ValueError(f"time_margin {stage.nemo.time_margin} leaves no training time in total_runtime {total_runtime}")
    max_time = runtime - margin
    # The launcher's limit sits halfway through the margin: after NeMo's clean stop, before BCP's hard kill.
    limit = runtime - margin // 2
    days, rest = divmod(limit, 86400)
    return TimeLimits(max_time=format_clock(max_time),
                      time_limit=f"{days}-{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}")


def static_preflight(pipeline: PipelineConfig, stage: StageConfig) -> None:
    """Checks that need no data: parallel sizes vs nodes, time limits. Raises ValueError with the fix."""
    bcp = stage.bcp
    model_config(stage)
    if bcp.instance:
        check_parallelism(stage, bcp.replicas, gpus_per_node(stage, bcp.instance))
        time_limits(stage, bcp.total_runtime)
    if stage.slurm.nodes or stage.slurm.gpus_per_node:
        nodes = stage.slurm.nodes or bcp.replicas
        gpus = stage.slurm.gpus_per_node or gpus_per_node(stage, bcp.instance)
        check_parallelism(stage, nodes, gpus)


def checkpoint_dir(stage: StageConfig) -> str:
    nemo = stage.nemo
    return f"{nemo.results_dir.rstrip('/')}/{nemo.run_name}/results/checkpoints"


def derived_continuation(stage: StageConfig) -> Continuation:
    return Continuation(checkpoints=checkpoint_dir(stage), target_steps=model_config(stage).max_steps,
                        max_attempts=stage.nemo.max_attempts)


def launcher_overrides(stage: StageConfig, *, cluster_type: str, nodes: str, total_runtime: str | None,
                       values: dict[str, str]) -> list[str]:
    """The launcher's Hydra overrides (placeholders resolved with `values`), data_prefix excluded."""
    nemo = stage.nemo
    model = model_config(stage)
    limits = time_limits(stage, total_runtime)
    bpe = substitute(nemo.bpe_dir, values).rstrip("/")
    results = substitute(nemo.results_dir, values).rstrip("/")
    # The launcher's data_dir is where its default tokenizer paths point (DATA/bpe/...), as in the guide.
    data_root = bpe.rsplit("/", 1)[0]
    return [
        f"cluster_type={cluster_type}",
        "stages=[training]",
        f"training={nemo.model}",
        f"launcher_scripts_path={nemo.launcher_dir}",
        f"data_dir={data_root}",
        f"base_results_dir={results}",
        f"training.run.name={nemo.run_name}",
        f"training.run.time_limit={limits.time_limit}",
        f"training.trainer.max_time={limits.max_time}",
        f"training.trainer.num_nodes={nodes}",
        f"training.trainer.max_steps={model.max_steps}",
        f"training.model.tokenizer.vocab_file={bpe}/vocab.json",
        f"training.model.tokenizer.merge_file={bpe}/merges.txt",
        *[substitute(o, values) for o in nemo.overrides],
    ]


def training_commandline(stage: StageConfig, *, cluster_type: str, nodes: str, total_runtime: str | None,
                         values: dict[str, str], scratch: str, log_dir: str) -> str:
    """The whole job command: build the data list from the manifests, run the launcher, keep its log.

    `nodes` is shell text (e.g. `${NGC_ARRAY_SIZE}`) and the data list is read with `$(cat FILE)`: those two are
    double-quoted so the job's shell expands them; every other value is shell-quoted.
    """
    data_dir = substitute(stage.nemo.data_dir, values)
    data_list_file = f"{scratch.rstrip('/')}/{DATA_LIST_FILE}"
    build_list = ["python3", f"{values['code']}/data_list.py", "--data-dir", data_dir, "--format", "hydra",
                  "--key", "training.model.data.data_prefix", "--out", data_list_file]
    overrides = launcher_overrides(stage, cluster_type=cluster_type, nodes="NODES", total_runtime=total_runtime,
                                   values=values)
    words = [shlex.quote(o) if o != "training.trainer.num_nodes=NODES" else f'"training.trainer.num_nodes={nodes}"'
             for o in overrides]
    launcher = " ".join(["python3", shlex.quote(f"{stage.nemo.launcher_dir}/main.py"), *words,
                         f'"$(cat {shlex.quote(data_list_file)})"'])
    log = shlex.quote(f"{log_dir.rstrip('/')}/{stage.nemo.run_name}-pretrain.log")
    # After training, the run's small files (configs, logs; not the checkpoints) are copied to the job's result
    # folder, so they show with the job; the launcher's exit status is kept whatever the copy does.
    results = substitute(stage.nemo.results_dir, values).rstrip("/")
    sync = (f"tar -C {shlex.quote(results)} --exclude=checkpoints -cf - {shlex.quote(stage.nemo.run_name)} "
            f"| tar -C {shlex.quote(log_dir)} -xf - || echo 'could not copy the run folder to {log_dir}' >&2")
    script = (f"set -o pipefail; {' '.join(map(shlex.quote, build_list))} && {launcher} 2>&1 | tee -a {log}; "
              f"status=$?; {sync}; exit $status")
    return f"bash -c {shlex.quote(script)}"
