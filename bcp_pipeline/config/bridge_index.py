"""A stage that builds a Megatron-Bridge training's data index before the training starts (`data_index_of: STAGE`).

Without one, the training's rank 0 builds megatron-core's sample and shuffle indices of the whole blend while every
other rank waits in a barrier, within the process group's timeout (Megatron-Bridge PR #4385; for slimpajama-8b-bridge
74 prefixes x 3 splits of 627 B tokens, on the job's 64 GPUs). The index stage does that build on one CPU process,
into the same `dataset.path_to_cache`, with what the training's ranks are given (bcp_pipeline/config/bridge.py):

- its args, derived here, run stages/bridge_index.py with the training's recipe, data folder, data list file and
  override list (less `train.exit_duration_in_mins`, a per-job limit that the data never reads), so megatron-core
  hashes every dataset's description to the names the training then finds complete;
- its images are the training's on every backend (the same Bridge and megatron-core, whose code makes the names),
  and it runs there as the training's ranks do: straight in the image, not through stages/bootstrap.sh;
- it is verified by its manifest (stages/_index_manifest.py, written last): verify.py --listed checks that every
  file it lists is there at its size and that nothing else is;
- on the local backend, where the training's `program` stands in for Bridge (stages/pretrain_local.py), it runs that
  program's own index build (`--build-data-index`), which the local training then reads.

The stage's resources are its own (a CPU node: one process, no GPU). Pure: preflight.py calls `prepare`.
"""

from __future__ import annotations

from bcp_pipeline.config import bridge
from bcp_pipeline.config.data_list_command import held_out_flags
from bcp_pipeline.config.durations import parse_duration
from bcp_pipeline.config.model import Check, PipelineConfig, StageConfig
from bcp_pipeline.config.resources import RESOURCE_TYPES

ENTRY_PROGRAM = "bridge_index.py"  # in stages/
LOCAL_STAND_IN = "pretrain_local.py"  # the smoke pretrain whose own index build the local backend runs instead
MANIFEST = "data_index.json"  # stages/_index_manifest.py MANIFEST_NAME, in the training's run folder
PER_JOB_KEYS = ("train.exit_duration_in_mins",)  # rendered from each job's runtime; no part of the data


def index_manifest(target: StageConfig) -> str:
    """The manifest's path, with the placeholders the backends resolve (the training's run folder)."""
    return f"{bridge.run_dir(target)}/{MANIFEST}"


def index_args(target: StageConfig) -> list[str]:
    """stages/bridge_index.py's arguments for the training `target`, placeholders kept for the backends."""
    section = target.megatron_bridge
    model = bridge.bridge_model(target)
    # A runtime only to render the list: the key it sets is dropped (PER_JOB_KEYS)
    runtime = f"{parse_duration(section.time_margin) + 3600}s"
    overrides = [
        o
        for o in bridge.bridge_overrides(target, values={}, runtime=runtime, run_id=bridge.RUN_ID)
        if o.split("=", 1)[0] not in PER_JOB_KEYS
    ]
    # One data-parallel rank: Bridge checks the parallel sizes against the world size; the data does not read it
    world = model.tensor_parallel * model.pipeline_parallel * model.context_parallel
    hub = ["--hf-home", section.hf_home] if section.hf_home else []
    held_out = held_out_flags(section)
    return [
        "--recipe",
        section.recipe,
        "--world-size",
        str(world),
        "--data-dir",
        section.data_dir,
        *held_out,
        "--data-list",
        f"{bridge.run_dir(target)}/{bridge.DATA_LIST_FILE}",
        "--manifest",
        index_manifest(target),
        *hub,
        *overrides,
    ]


def problem(pipeline: PipelineConfig, stage: StageConfig) -> tuple[str, str] | None:
    """(key, why) where `stage` cannot build its training's index as declared; None where it can."""
    name = stage.data_index_of
    target = pipeline.stages.get(name)
    if target is None or target.megatron_bridge is None:
        bridge_stages = [n for n, s in pipeline.stages.items() if s.megatron_bridge is not None]
        return "data_index_of", (
            f"{name!r} is no megatron_bridge: stage of this pipeline (those are: {', '.join(bridge_stages) or 'none'})"
        )
    if stage.program != ENTRY_PROGRAM:
        return "program", f"a stage with data_index_of runs {ENTRY_PROGRAM}, not {stage.program}"
    if stage.args:
        return "args", (
            f"the args of a data_index_of stage are derived from stage {name}'s megatron_bridge: "
            "section (the same recipe and overrides as its ranks'); leave them out"
        )
    if stage.name not in target.needs:
        return "data_index_of", (
            f"stage {name} does not wait for its data index: add {stage.name} to its needs "
            "(else its rank 0 may build the index while this stage does)"
        )
    missing = [need for need in target.needs if need != stage.name and need not in stage.needs]
    if missing:
        return "needs", (
            f"stage {name} needs {', '.join(missing)}, and so does its data index (it reads the "
            f"data): add {', '.join(missing)} to the needs of {stage.name}"
        )
    return None


def prepare(pipeline: PipelineConfig, stage: StageConfig) -> None:
    """Derive what the stage runs from its training (call after `problem` found none); ValueError where the
    training's section cannot be rendered."""
    target = pipeline.stages[stage.data_index_of]
    stage.args = index_args(target)
    run_in_training_image(stage, target, ENTRY_PROGRAM)
    if target.program == LOCAL_STAND_IN and not stage.local.command:
        stage.local.command = [
            "${python}",
            f"${{code}}/{LOCAL_STAND_IN}",
            *target.args,
            "--build-data-index",
            "--index-manifest",
            index_manifest(target),
        ]
    if not stage.verify:
        stage.verify = [Check(glob=index_manifest(target), expect=1)]


def run_in_training_image(stage: StageConfig, target: StageConfig, program: str) -> None:
    """`stage` takes the training `target`'s image on every backend, and where its jobs do not run here, a command
    that starts `program` with its args straight in it, as the training's ranks run: not through
    stages/bootstrap.sh, which would pip-install the data stages' packages into Bridge's environment (it needs
    none of them). A command the stage gives itself is kept."""
    for backend, resources in RESOURCE_TYPES.items():
        if resources.image_field:
            setattr(
                stage.resources(backend),
                resources.image_field,
                getattr(target.resources(backend), resources.image_field),
            )
        if not resources.runs_here and not stage.resources(backend).command:
            stage.resources(backend).command = ["${python}", "-u", f"${{code}}/{program}", *stage.args]


def unindexed_notice(pipeline: PipelineConfig, stage: StageConfig) -> str | None:
    """What `plan` says of a Bridge training whose data index no stage builds beforehand."""
    if any(s.data_index_of == stage.name for s in pipeline.stages.values()):
        return None
    return (
        f"pipeline {pipeline.name}, stage {stage.name}: no stage builds its data index beforehand, so its rank 0 "
        f"builds it while the other ranks wait (up to dist.distributed_timeout_minutes="
        f"{bridge.DISTRIBUTED_TIMEOUT_MINUTES}); a stage with `data_index_of: {stage.name}` builds it on a CPU "
        'first (docs/pretraining.md, "The data index")'
    )
