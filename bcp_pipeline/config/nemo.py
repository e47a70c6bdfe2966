"""Pretraining with NVIDIA's NeMo launcher: its facts by release, the preflight checks and its Hydra overrides.

The job is the guide's `python3 .../launcher_scripts/main.py cluster_type=bcp stages=[training] ...`, with
`training.model.data.data_prefix` built inside the job from the preprocess manifests (stages/data_list.py: every
.bin/.idx pair, weights proportional to tokens, summing to 1) instead of 74 hand-typed entries. How a BCP job runs
the launcher is backends/shared/nemo_script.py's; how a Slurm cluster does, backends/slurm/render.py's. Facts
about the launcher and NeMo with their sources (NVIDIA's repositories at named tags): the comments below,
docs/pretraining.md and tests/fakes/README.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bcp_pipeline.config.data_list_command import DataListForm, held_out_error
from bcp_pipeline.config.durations import format_clock, parse_duration
from bcp_pipeline.config.model import Continuation, PipelineConfig, StageConfig
from bcp_pipeline.config.placeholders import substitute
from bcp_pipeline.config.resources import RESOURCE_TYPES, rank_layout


@dataclass(frozen=True)
class ModelConfig:
    """The parallelism facts of a launcher training config (conf/training/gpt3/*.yaml)."""

    tensor_parallel: int
    pipeline_parallel: int
    global_batch_size: int
    micro_batch_size: int
    max_steps: int


FACT_FIELDS = ("tensor_parallel", "pipeline_parallel", "global_batch_size", "micro_batch_size", "max_steps")
LauncherVersion = tuple[int, int]  # (YY, MM) of a NeMo Framework release, from its image tag: 23.08.03 -> (23, 8)

# The facts move between launcher releases, so they are keyed by the release the stage's image carries; a release
# takes the facts of the newest key not after it (24.05 -> 23.11), and one before every key has none. Read from
# launcher_scripts/conf/training/gpt3/{126m,7b_improved}.yaml in NVIDIA's launcher repository
# (NeMo-Framework-Launcher, formerly NeMo-Megatron-Launcher), at the commits named below; a commit is tied to a
# release by the container its conf/config.yaml names.
KNOWN_MODELS: dict[LauncherVersion, dict[str, ModelConfig]] = {
    # 23.08: NeMo-Framework-Launcher@056a90ed (pre-mcore configs): 7b_improved TP 2, PP 1, MBS 1, GBS 512,
    # 300000 steps; 126m TP 1, PP 1, MBS 4, GBS 256, 600000 steps. Not verified against the 23.08.03 tag itself
    # (the index holds no conf/config.yaml at 056a90ed); what ties TP 2 to 23.08 is that the first TP 4 version
    # (NeMo-Framework-Launcher@6247dc87) still names the 23.08.03 container, i.e. TP 4 came after that release.
    # 126m's values are the same in a fork on the 23.08.03 container (Riccorl/NeMo-Megatron-Launcher@46b7bcba).
    (23, 8): {
        "gpt3/126m": ModelConfig(
            tensor_parallel=1, pipeline_parallel=1, global_batch_size=256, micro_batch_size=4, max_steps=600000
        ),
        "gpt3/7b_improved": ModelConfig(
            tensor_parallel=2, pipeline_parallel=1, global_batch_size=512, micro_batch_size=1, max_steps=300000
        ),
    },
    # 23.11: NeMo-Megatron-Launcher@0c6c960d, whose conf/config.yaml names nemofw-training:23.11: 7b_improved TP 4,
    # PP 1, MBS 1, GBS 512, 300000 steps; 126m TP 1, PP 1, MBS 4, GBS 256, 600000 steps. Later releases take these:
    # NVIDIA/NeMo-Framework-Launcher's conf/training/gpt3/7b_improved.yaml has tensor_model_parallel_size 2 at tags
    # 23.04 through 23.08.03 and 4 from 23.11 through 24.12, its last release; no 24.x value is checked here.
    (23, 11): {
        "gpt3/126m": ModelConfig(
            tensor_parallel=1, pipeline_parallel=1, global_batch_size=256, micro_batch_size=4, max_steps=600000
        ),
        "gpt3/7b_improved": ModelConfig(
            tensor_parallel=4, pipeline_parallel=1, global_batch_size=512, micro_batch_size=1, max_steps=300000
        ),
    },
}
# A declared size reaches the launcher as this override, so the job trains with the sizes the preflight checked.
SIZE_OVERRIDES = {
    "tensor_parallel": "training.model.tensor_model_parallel_size",
    "pipeline_parallel": "training.model.pipeline_model_parallel_size",
    "global_batch_size": "training.model.global_batch_size",
    "micro_batch_size": "training.model.micro_batch_size",
}
# Where the launcher is in the image, by release, keyed as KNOWN_MODELS is (the newest key not after the image's
# release): its Dockerfile's LAUNCHER_SCRIPTS_PATH and the path its BCP launcher hard-codes, at NVIDIA's launcher
# release tags. The repository was NeMo-Megatron-Launcher until 24.05 and the folder moved with its rename in 24.07
# (read at the tags 23.11 through 24.05, /opt/NeMo-Megatron-Launcher, and from 24.07 on, /opt/NeMo-Framework-Launcher;
# 23.08 takes the older name, which the repository had then, unread at that tag).
KNOWN_LAUNCHER_DIRS: dict[LauncherVersion, str] = {
    (23, 8): "/opt/NeMo-Megatron-Launcher/launcher_scripts",
    (24, 7): "/opt/NeMo-Framework-Launcher/launcher_scripts",
}
# NeMo's per-run time limit (nemo/utils/exp_manager.py, NeMo 1.22.0: a StatelessTimer replaces Lightning's Timer,
# whose elapsed time is saved in every checkpoint and makes `trainer.max_time` a budget over ALL jobs of a run: the
# second job of a run would stop at once). The launcher's training configs lack the key, hence Hydra's `+`.
PER_RUN_TIME_KEY = "+training.exp_manager.max_time_per_run"
_TAG_VERSION = re.compile(r"(\d{2})\.(\d{2})(?:[.-][0-9A-Za-z._-]*)?")


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


# From conf/training/gpt3/{126m,7b_improved}.yaml (model: section); the same at both keyed releases (the
# commits named above), so not keyed by release.
KNOWN_SHAPES = {
    "gpt3/126m": ModelShape(num_layers=12, hidden_size=768, ffn_hidden_size=3072, seq_length=2048, gated_mlp=False),
    "gpt3/7b_improved": ModelShape(
        num_layers=32, hidden_size=4096, ffn_hidden_size=10880, seq_length=2048, gated_mlp=True
    ),  # activation: fast-swiglu
}
MAX_NODES_LISTED = 256
DATA_LIST_FILE = "data_prefix.txt"
# The data list's key is NeMo's model.data.data_prefix; with nemo.valid_data_dir, NeMo's per-split dict of it.
DATA_LIST = DataListForm(key="training.model.data.data_prefix", split_form="nemo")
# NeMo's GPT pretraining script under nemo.nemo_dir: what the launcher's training command runs (its core/stages.py,
# GPT3 training: /opt/NeMo/examples/nlp/language_modeling/megatron_gpt_pretraining.py).
PRETRAINING_SCRIPT = "examples/nlp/language_modeling/megatron_gpt_pretraining.py"


def composed_config(results_dir: str, run_name: str) -> tuple[str, str]:
    """Where the launcher writes the training config it composed, as (folder, file name): its JobPaths'
    config_file, `<training.run.results_dir>/<run name>_hydra.yaml`, with run.results_dir =
    base_results_dir/<run name> (nemo_launcher/utils/job_utils.py; core/stages.py save_stage_hydra_config, which
    resolves the interpolations first). The launcher's own training command passes it to NeMo as
    `--config-path=FOLDER --config-name=FILE`."""
    folder = f"{results_dir.rstrip('/')}/{run_name}"
    return folder, f"{run_name}_hydra.yaml"


def launcher_version(image: str) -> LauncherVersion | None:
    """The NeMo launcher release an image carries, from its YY.MM tag; None when the tag is not one."""
    name = image.rsplit("/", 1)[-1].split("@", 1)[0]  # past the registry (its port has a colon too), no digest
    if ":" not in name:
        return None
    match = _TAG_VERSION.fullmatch(name.rsplit(":", 1)[1])
    if not match or not 1 <= int(match.group(2)) <= 12:
        return None
    return int(match.group(1)), int(match.group(2))


def known_models(version: LauncherVersion) -> dict[str, ModelConfig] | None:
    """The facts of the newest keyed release not after `version`; None before the first."""
    keys = [key for key in KNOWN_MODELS if key <= version]
    return KNOWN_MODELS[max(keys)] if keys else None


def launcher_image(stage: StageConfig, backend: str | None = None) -> tuple[str | None, str]:
    """The image whose launcher runs the stage on `backend`, and the key that sets it: what the backend's section
    says (its `launcher_image` hook: BCP's bcp.image, Slurm's container_image, a Grid Engine docker:// reference,
    Kubernetes' image), else `bcp.image`, the pipeline's NeMo image, the best guess of the release (a Slurm stage
    without an image runs the launcher's own default container; a Grid Engine .sif path has no tag).
    No backend: the stage's BCP image, or, when it names none, the first image another section names (table order).
    """
    if backend is None:
        named = (name for name in RESOURCE_TYPES if stage.resources(name).launcher_image())
        backend = next(named, None) if stage.bcp.image is None else None
    image = stage.resources(backend).launcher_image() if backend else None
    if image:
        return image, f"{backend}.{RESOURCE_TYPES[backend].image_field}"
    return stage.bcp.image, "bcp.image"


def launcher_dir(stage: StageConfig, backend: str | None = None) -> str:
    """The launcher's `launcher_scripts` folder in the stage's image: `nemo.launcher_dir`, else where the image's
    release keeps it (KNOWN_LAUNCHER_DIRS). ValueError naming the setting when neither tells."""
    nemo = stage.nemo
    assert nemo is not None
    if nemo.launcher_dir:
        return nemo.launcher_dir.rstrip("/")
    image, key = launcher_image(stage, backend)
    version = launcher_version(image) if image else None
    keys = [release for release in KNOWN_LAUNCHER_DIRS if version is not None and release <= version]
    if not keys:
        what = f"image {image!r} ({key})" if image else f"no image ({key})"
        why = "whose tag is no YY.MM release" if image and version is None else "of no release with a known path"
        known = ", ".join(f"{yy:02d}.{mm:02d}: {path}" for (yy, mm), path in sorted(KNOWN_LAUNCHER_DIRS.items()))
        raise ValueError(
            f"stage {stage.name} runs {what}, {why}, so where its NeMo launcher is is unknown "
            f"(known from: {known}); set nemo.launcher_dir to the image's launcher_scripts folder"
        )
    return KNOWN_LAUNCHER_DIRS[max(keys)]


def model_config(stage: StageConfig, backend: str | None = None) -> ModelConfig:
    """The model's facts at the launcher release of the stage's image, any value the pipeline gives winning."""
    nemo = stage.nemo
    assert nemo is not None
    image, key = launcher_image(stage, backend)
    version = launcher_version(image) if image else None
    table = known_models(version) if version else None
    known = table.get(nemo.model) if table else None
    values = {field: getattr(nemo, field) for field in FACT_FIELDS}
    if known is not None:
        values = {field: getattr(known, field) if value is None else value for field, value in values.items()}
    if None in values.values():
        raise ValueError(_no_facts_message(stage, image, key, version, table))
    return ModelConfig(**values)


def _no_facts_message(
    stage: StageConfig,
    image: str | None,
    key: str,
    version: LauncherVersion | None,
    table: dict[str, ModelConfig] | None,
) -> str:
    model = stage.nemo.model
    declare = (
        "give tensor_parallel, pipeline_parallel, global_batch_size, micro_batch_size and max_steps in "
        "the stage's nemo: section"
    )
    anywhere = sorted({name for models in KNOWN_MODELS.values() for name in models})
    if table is not None or model not in anywhere:  # the release would not help: no release knows the model
        return f"model {model!r} is not one of the known configs ({', '.join(table or anywhere)}): {declare}"
    known = ", ".join(f"{yy:02d}.{mm:02d}" for yy, mm in sorted(KNOWN_MODELS))
    if image is None:
        problem = f"has no image ({key}) to tell its NeMo launcher release from"
    elif version is None:
        problem = f"runs image {image!r} ({key}), whose tag is no YY.MM release, so its NeMo launcher is unknown"
    else:
        problem = (
            f"runs image {image!r} ({key}), NeMo launcher {version[0]:02d}.{version[1]:02d}, older than "
            f"every release with known facts"
        )
    return (
        f"stage {stage.name} {problem}: the parallel sizes of {model} are known for launcher releases {known} "
        f"(a later release takes those of the newest one not after it). Set {key} to a NeMo image tagged with "
        f"its release (e.g. nvcr.io/nvidia/nemo:24.05), or {declare}"
    )


def tokens_per_step(stage: StageConfig, backend: str | None = None) -> int:
    """A NeMo stage's tokens a training step: global batch x sequence length. ValueError for a model whose shape
    is not known (KNOWN_SHAPES)."""
    shape = KNOWN_SHAPES.get(stage.nemo.model)
    if shape is None:
        raise ValueError(f"the sequence length of {stage.nemo.model} is not known")
    return model_config(stage, backend).global_batch_size * shape.seq_length


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
    return parallel_sizes_error(
        nodes,
        gpus,
        tp=model.tensor_parallel,
        pp=model.pipeline_parallel,
        global_batch=model.global_batch_size,
        micro_batch=model.micro_batch_size,
    )


def parallel_sizes_error(
    nodes: int, gpus: int, *, tp: int, pp: int, global_batch: int, micro_batch: int, cp: int | None = None
) -> str | None:
    """Why a training of these sizes cannot run on `nodes` x `gpus` (None: it can): the GPUs must split into
    model-parallel groups (TP x PP, x CP where the engine has it), and the data-parallel size x micro batch must
    divide the global batch. Both engines' preflight (this module's, bridge.py's) ask it."""
    world = nodes * gpus
    split = f"TP {tp} x PP {pp}" + (f" x CP {cp}" if cp is not None else "")
    model_parallel = tp * pp * (cp or 1)
    if world % model_parallel:
        return f"{nodes} node(s) x {gpus} GPUs = {world} is not divisible by {split}"
    data_parallel = world // model_parallel
    if global_batch % (micro_batch * data_parallel):
        return (
            f"global batch {global_batch} is not divisible by micro batch {micro_batch} x data-parallel size "
            f"{data_parallel} ({nodes} node(s) x {gpus} GPUs / {split.replace(' x ', ' / ')})"
        )
    return None


def check_parallelism(stage: StageConfig, nodes: int, gpus: int, backend: str | None = None) -> None:
    model = model_config(stage, backend)
    problem = _parallel_error(model, nodes, gpus)
    if problem:
        valid = valid_node_counts(model, gpus)
        raise ValueError(
            f"{stage.nemo.model} on {nodes} node(s): {problem}; valid node counts with {gpus} GPUs per "
            f"node: {', '.join(map(str, valid)) or 'none up to ' + str(MAX_NODES_LISTED)}"
        )


@dataclass(frozen=True)
class TimeLimits:
    """How long one training job trains, and when its scheduler kills it."""

    per_run: str  # exp_manager.max_time_per_run, D:HH:MM:SS: NeMo saves a checkpoint and stops here, every job
    hard_limit: str  # the job's runtime, D-HH:MM:SS (Slurm's form): BCP's --total-runtime, Slurm's --time


def time_limits(stage: StageConfig, runtime: str | None) -> TimeLimits:
    """Each job trains for its runtime minus `nemo.time_margin`. The per-run timer starts when training starts, so
    the margin covers what the runtime holds besides training: the container's start and image pull, building the
    model across the nodes, the first job's data index build (Megatron's index mappings over the whole data list),
    and, after NeMo's clean stop, the last step, a validation and the final checkpoint save (about 90 GB for 8B).
    The 45-minute default is the guide's 30-60 minutes; docs/pretraining.md gives the figures it covers."""
    if not runtime:
        raise ValueError(
            "pretraining needs a runtime (total_runtime on BCP, time on Slurm): each job's training "
            "time is derived from it"
        )
    seconds = parse_duration(runtime)
    margin = parse_duration(stage.nemo.time_margin)
    if margin >= seconds:
        raise ValueError(f"time_margin {stage.nemo.time_margin} leaves no training time in the runtime {runtime}")
    days, rest = divmod(seconds, 86400)
    return TimeLimits(
        per_run=format_clock(seconds - margin),
        hard_limit=f"{days}-{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}",
    )


# From 25.11 the NeMo Framework images hold no launcher model: NeMo 1.0's MegatronGPTModel left nemo_toolkit in
# 2.5.1 (October 2025; 25.09 ships 2.5.0, the last with it) and the images train with Megatron-Bridge. The launcher's
# last release is 24.12, so 25.02 through 25.09 are not known to work either way.
NO_LAUNCHER_FROM: LauncherVersion = (25, 11)
UNVERIFIED_FROM: LauncherVersion = (25, 2)


def release_notices(stage: StageConfig) -> list[str]:
    """Refuses (ValueError) an image of 25.11 or later, where `training=gpt3/*` cannot run; returns a notice for
    each image of 25.02-25.09, which no launcher release was made for."""
    images = {launcher_image(stage, backend) for backend in RESOURCE_TYPES}
    notices = []
    for image, key in sorted((i, k) for i, k in images if i):
        version = launcher_version(image)
        if version is not None and version >= NO_LAUNCHER_FROM:
            raise ValueError(
                f"{key} {image} is a NeMo Framework {version[0]:02d}.{version[1]:02d} image, which "
                "trains with Megatron-Bridge: the NeMo launcher's training=gpt3/* cannot run there (its "
                "model left NeMo in nemo_toolkit 2.5.1); give the stage a megatron_bridge: section "
                "instead of nemo: (docs/pretraining.md), or an image of 24.12 or earlier"
            )
        if version is not None and version >= UNVERIFIED_FROM:
            notices.append(
                f"stage {stage.name}: {key} {image}: the NeMo launcher's last release is 24.12, and "
                f"whether a {version[0]:02d}.{version[1]:02d} image still runs it is not verified; "
                "megatron_bridge: is NVIDIA's way from 25.11 on"
            )
    return notices


def static_preflight(pipeline: PipelineConfig, stage: StageConfig) -> list[str]:
    """Checks that need no data: the image's release, parallel sizes vs nodes, time limits, where the launcher
    is. Raises ValueError with the fix; returns notices to show (an unverified image)."""
    notices = release_notices(stage)
    bcp = stage.bcp
    model_config(stage)
    if problem := held_out_error(stage.nemo, "nemo"):
        raise ValueError(problem)
    if bcp.instance:
        check_parallelism(stage, rank_layout(stage, "bcp").nodes, gpus_per_node(stage, bcp.instance), "bcp")
        time_limits(stage, bcp.total_runtime)
        launcher_dir(stage, "bcp")
    for backend, resources in RESOURCE_TYPES.items():  # each backend whose section sizes the training
        section = stage.resources(backend)
        if not resources.gpus_field or not any(
            getattr(section, key) for key in (resources.nodes_field, resources.gpus_field) if key
        ):
            continue
        layout = rank_layout(stage, backend)  # a rank a GPU: its ranks a node, or the GPUs the section gives
        gpus = (
            layout.per_node
            if resources.gpus_are_ranks
            else getattr(section, resources.gpus_field) or gpus_per_node(stage, bcp.instance)
        )
        check_parallelism(stage, layout.nodes, gpus, backend)
    return notices


RUN_ID = "${run_id}"  # the bcp-pipeline run's id, as a placeholder the renderers resolve


def nemo_run_name(stage: StageConfig, run_id: str = RUN_ID) -> str:
    """The NeMo run (`training.run.name`, a folder under results_dir) that a bcp-pipeline run trains.

    Its own, RUN_NAME-RUN_ID: NeMo continues ANY job with the same results folder and run name from its `-last`
    checkpoint (`resume_if_exists`), so a shared name would let a new run (`run --restart`, a run after one that
    succeeded, another pipeline) continue an old training instead of starting at step 0. The jobs of one run (its
    continuations, `resume`) keep the name and continue. `nemo.continue_run` names another NeMo run to take over
    instead, explicitly."""
    nemo = stage.nemo
    return nemo.continue_run or f"{nemo.run_name}-{run_id}"


def checkpoint_dir(stage: StageConfig) -> str:
    return f"{stage.nemo.results_dir.rstrip('/')}/{nemo_run_name(stage)}/results/checkpoints"


def derived_continuation(stage: StageConfig) -> Continuation:
    return Continuation(
        checkpoints=checkpoint_dir(stage),
        target_steps=model_config(stage).max_steps,
        max_attempts=stage.nemo.max_attempts,
        attempts_key=f"{stage.name}.nemo.max_attempts",
    )


def launcher_overrides(
    stage: StageConfig,
    *,
    cluster_type: str,
    nodes: str,
    runtime: str | None,
    values: dict[str, str],
    backend: str,
    devices: str | None = None,
) -> list[str]:
    """The launcher's Hydra overrides (placeholders resolved with `values`, which hold the run id), without the
    data list. `cluster_type`: the launcher's (bcp; bcm, a Slurm cluster). `runtime`: the job's (BCP's
    total_runtime, Slurm's time, Grid Engine's h_rt). `backend`: whose image the launcher runs in (launcher_image).
    `devices`: trainer.devices, the ranks a node (default: the GPUs of the instance the backend's section names,
    BCP's; a backend whose section names none, the launcher config's own)."""
    nemo = stage.nemo
    model = model_config(stage, backend)
    limits = time_limits(stage, runtime)
    if devices is None and RESOURCE_TYPES[backend].instance_field:
        devices = str(gpus_per_node(stage, stage.resources(backend).instance_name()))
    bpe = substitute(nemo.bpe_dir, values).rstrip("/")
    results = substitute(nemo.results_dir, values).rstrip("/")
    verbatim = {o.split("=", 1)[0] for o in nemo.overrides}
    # The launcher's data_dir is where its default tokenizer paths point (DATA/bpe/...), as in the guide.
    data_root = bpe.rsplit("/", 1)[0]
    return [
        f"cluster_type={cluster_type}",
        "stages=[training]",
        f"training={nemo.model}",
        f"launcher_scripts_path={launcher_dir(stage, backend)}",
        f"data_dir={data_root}",
        f"base_results_dir={results}",
        f"training.run.name={nemo_run_name(stage, values['run_id'])}",
        # Only a Slurm launch reads run.time_limit (as its job's --time); BCP's launcher never does.
        *([f"training.run.time_limit={limits.hard_limit}"] if cluster_type == "bcm" else []),
        f"training.trainer.num_nodes={nodes}",
        # The BCP launcher starts trainer.devices ranks a node (its bcprun --npernode); the configs say 8.
        *([f"training.trainer.devices={devices}"] if devices is not None else []),
        f"training.trainer.max_steps={model.max_steps}",
        *([f"{PER_RUN_TIME_KEY}={limits.per_run}"] if PER_RUN_TIME_KEY not in verbatim else []),
        f"training.model.tokenizer.vocab_file={bpe}/vocab.json",
        f"training.model.tokenizer.merge_file={bpe}/merges.txt",
        *declared_sizes(stage),
        *[substitute(o, values) for o in nemo.overrides],
    ]


def declared_sizes(stage: StageConfig) -> list[str]:
    """Overrides for the parallel and batch sizes the stage's nemo: section gives (the launcher's own config
    supplies the others), except one its verbatim `overrides` already set: Hydra refuses a key given twice."""
    nemo = stage.nemo
    verbatim = {o.split("=", 1)[0].lstrip("+~") for o in nemo.overrides}
    return [
        f"{key}={getattr(nemo, field)}"
        for field, key in SIZE_OVERRIDES.items()
        if getattr(nemo, field) is not None and key not in verbatim
    ]
