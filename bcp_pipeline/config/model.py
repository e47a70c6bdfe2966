"""The typed pipelines.yaml: a Config of pipelines, each a DAG of stages with their checks, continuation, NeMo
training and per-backend sections (config/sections/). Keys map 1:1 to fields; the field comments are the
reference for pipelines.yaml (docs/pipelines-yaml.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bcp_pipeline.config.placeholders import resolve_int, substitute
from bcp_pipeline.config.resources import (
    BcpResources,
    GridEngineResources,
    KubernetesResources,
    LeptonResources,
    LocalResources,
    SlurmResources,
)
from bcp_pipeline.config.typed import Duration, Where
from bcp_pipeline.errors import ConfigError


@dataclass(kw_only=True)
class Check:
    """One verification: count files matching `glob` and compare with a fixed or derived number."""

    glob: str  # under ${workspace}; hidden temporaries never match
    expect: int | str | None = None  # a number, or "${var}"
    expect_from: str | None = None  # derive from an upstream stage's (first) check ...
    per: int = 1  # ... times `per` (one .jsonl per .zst: 1; a .bin and an .idx per chunk: 1 each)
    group: int | str | None = None  # ... or divided by `group` (a number or "${var}"), rounded up: 800 per chunk;
    # with `expect` it divides that number: expect ${steps}, group ${every} is one result per checkpoint interval


@dataclass(kw_only=True)
class Continuation:
    """Resubmit a stage that ended before its work was done (training that hit its runtime or was preempted; an
    evaluation that hit its site's job limit before its training's last checkpoint).

    After each end listed in `resubmit_on`, a small verification job reads the step `checkpoints` has reached
    (stages/verify.py, `--progress`); below `target_steps` the same job is submitted again (NeMo resumes from its
    `-last` checkpoint, an evaluation from its last result), up to `max_attempts`. Two attempts in a row without
    progress stop the stage (an evaluation: once its training has ended, as until then it may wait for checkpoints).
    """

    checkpoints: str  # folder whose entries name their step: ...step=N... (NeMo's and the local smoke pretrain's),
    # Bridge's iter_NNNNNNN and trackers, an evaluation's step-NNNNNNNN.json results
    target_steps: int | str  # a number or "${var}"
    max_attempts: int = 10
    resubmit_on: list[Literal["succeeded", "timed_out", "lost", "failed"]] = field(
        default_factory=lambda: ["succeeded", "timed_out", "lost"]
    )
    # The --set key that raises max_attempts (`STAGE.KEY`): a derived continuation's comes from a section (the
    # training's `nemo.max_attempts`, say); "" for one written in the file: its own `continuation.max_attempts`.
    attempts_key: str = field(default="", metadata={"internal": True})


@dataclass(kw_only=True)
class StallGuard:
    """A training whose step count stops advancing is a hung attempt (a multi-node job hanging before step 1 holds
    every GPU of the job until its runtime ends): its job is cancelled and submitted again, up to `max_restarts`
    times (engine/stall_guard.py). Applies to training stages: those with nemo:, megatron_bridge: or continuation:.
    """

    enabled: bool = True
    after: Duration | None = None  # no new step for this long: stalled. Default: 3x the slowest step so far
    # (the longest wait between two step lines, a checkpoint save included), and at least `at_least`
    at_least: Duration = Duration("30m")  # the derived time's floor: a checkpoint save (about 96 GB for 8B) or an
    # evaluation runs between two step lines
    first_step: Duration = Duration("60m")  # before the job's first step line, from when it was seen running:
    # container start, model build, checkpoint load and the data index read
    max_restarts: int = 2  # stalled attempts submitted again (apart from the continuation's max_attempts); the
    # next stall fails the stage


@dataclass(kw_only=True)
class NemoTraining:
    """Pretraining with NVIDIA's NeMo launcher (on BCP and Slurm; on Grid Engine the launcher composes the config
    and torchrun runs NeMo's training script; the local and Kubernetes backends run `program` instead).

    The launcher's data list is built inside the job from the preprocess manifests under `data_dir`. Loading
    checks only the section's shape; preflight.py checks it against the nodes and runtime and derives the stage's
    continuation from it.
    """

    model: str  # training config, e.g. gpt3/7b_improved or gpt3/126m
    run_name: str  # the NeMo run is named RUN_NAME-<run id>: each bcp-pipeline run trains its own (nemo.py)
    data_dir: str  # preprocess outputs (.bin/.idx + manifests), as the job sees them
    bpe_dir: str  # vocab.json + merges.txt
    results_dir: str  # base_results_dir; checkpoints go to RESULTS/<NeMo run>/results/checkpoints
    valid_data_dir: str | None = None  # a held-out split's own outputs: the training validates (and tests) on them
    # (NeMo's per-split data_prefix, config/data_list_command.py) instead of a 99990,8,2 slice of data_dir
    test_data_dir: str | None = None  # with valid_data_dir: a second held-out split, the test blend in its place
    launcher_dir: str | None = None  # default: where the image's release keeps it (nemo.KNOWN_LAUNCHER_DIRS)
    nemo_dir: str = "/opt/NeMo"  # NeMo in the image, where the launcher's training command has it; Grid Engine's
    # torchrun runs its examples/nlp/language_modeling/megatron_gpt_pretraining.py (nemo.py)
    time_margin: Duration = Duration("45m")  # each job trains for its runtime minus this, then saves and stops
    continue_run: str | None = None  # take over this NeMo run (its folder under results_dir) and its checkpoints
    # instead of starting this run's own; several bcp-pipeline runs then train the same model (nemo.py)
    gpus_per_node: int | None = None  # default: from the instance name (dgxa100.80g.8.norm -> 8)
    max_steps: int | None = None  # default: the model's
    tensor_parallel: int | None = None  # required for a model, or an image release, without known facts (nemo.py);
    # like the next three and max_steps. Given, they are passed to the launcher.
    pipeline_parallel: int | None = None
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    max_attempts: int = 10  # continuation: resubmissions until max_steps
    checkpoints: bool = True  # false: one job that saves no checkpoint, done when it exits 0 (no continuation is
    # derived; `bcp-pipeline profile` sets it)
    overrides: list[str] = field(default_factory=list)  # more Hydra overrides, verbatim


@dataclass(kw_only=True)
class MegatronBridgeTraining:
    """Pretraining with NVIDIA's Megatron-Bridge (the NeMo images from 26.04 on: Bridge 0.4.0), through this
    project's entry program stages/bridge_pretrain.py: a recipe, the overrides bcp-pipeline renders (the model's
    shape, parallelism, batch sizes, data list, tokenizer, checkpoints, per-job time limit), then `pretrain()`.

    Where the section is silent, the values are those of the NeMo launcher config named by `model` (bridge.py), so
    `gpt3/7b_improved` on Bridge is the same model as on the launcher. The data list is built inside the job from
    the preprocess manifests under `data_dir`. Loading checks only the section's shape; preflight.py checks it
    against the nodes and runtime and derives the stage's continuation from it.
    """

    run_name: str  # the training is RUN_NAME-<run id>: its checkpoints are RESULTS/RUN_NAME-<run id>/checkpoints
    data_dir: str  # preprocess outputs (.bin/.idx + manifests), as the job sees them
    valid_data_dir: str | None = None  # a held-out split's own outputs: the training validates on them
    # (megatron-core's per-split blends, data_list.py --valid-data-dir) instead of a 99990,8,2 slice of data_dir
    test_data_dir: str | None = None  # with valid_data_dir: a second held-out split, scored once after training
    bpe_dir: str  # vocab.json + merges.txt (GPT-2 BPE)
    results_dir: str  # each run's folder (checkpoints, the data index cache, the training log) goes here
    recipe: str = "vanilla_gpt_pretrain_config"  # a recipe of megatron.bridge.recipes; a Llama recipe reads its
    # architecture from the Hugging Face Hub: it needs an HF_TOKEN secret or a cached hf_home (bridge.py)
    model: str = "gpt3/7b_improved"  # the launcher config whose model and sizes fill in what is not given
    num_layers: int | None = None
    hidden_size: int | None = None
    ffn_hidden_size: int | None = None
    num_attention_heads: int | None = None
    seq_length: int | None = None
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    context_parallel: int | None = None
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    train_iters: int | None = None  # steps to train in all (the continuation's target)
    gpus_per_node: int | None = None  # default: from the instance name (dgxh100.80g.8.norm -> 8)
    time_margin: Duration = Duration("20m")  # each job trains for its runtime minus this (bridge.py says why)
    save_interval: int = 1000  # a checkpoint every this many steps (and one when the job's time is up)
    most_recent_k: int = 2  # checkpoints kept; Bridge's default keeps every one (about 90 GB each for 8B)
    hf_home: str | None = None  # a Hugging Face cache filled beforehand (in the workspace): used offline
    continue_run: str | None = None  # take over this training (its folder under results_dir) and its checkpoints
    max_attempts: int = 10  # continuation: resubmissions until train_iters
    checkpoints: bool = True  # false: one job that saves no checkpoint, done when it exits 0 (`profile` sets it)
    nsys_output: str | None = None  # every rank under Nsight Systems, a file each (profile_<pid>) here (`profile`)
    # Typed knobs (bridge_knobs.py renders and guards them; docs/pretraining.md, "Settings and why"):
    # the matmul precision: bf16 (Bridge's bf16_mixed), or FP8 with Transformer Engine's delayed or current scaling
    # (bf16_with_fp8_{delayed,current}_scaling_mixed; `fp8` is fp8-current, the scaling Bridge's own FP8 8B recipe
    # uses). FP8 needs Hopper or newer: refused where the stage declares an A100 (a dgxa100 instance, say).
    precision: Literal["bf16", "fp8", "fp8-current", "fp8-delayed"] = "bf16"
    async_save: bool = False  # checkpoints written in the background while training goes on (torch_dist format)
    fsdp: bool = False  # Megatron-FSDP (parameters, gradients and optimizer state sharded over the data-parallel
    # ranks); its checkpoints are fsdp_dtensor, which a torch_dist run cannot continue from, nor the other way round
    activation_offload: int = 0  # the first N transformer layers keep their activations in CPU memory between the
    # forward and the backward pass (megatron-core cpu_offloading; 0: none; fewer than num_layers, no pipeline parallel)
    overrides: list[str] = field(default_factory=list)  # more KEY=VALUE overrides of the ConfigContainer, verbatim


@dataclass(kw_only=True)
class Workspace:
    """The workspace every stage mounts; `${workspace}` in args is its path as the job sees it."""

    name: str
    mount: str = "/mount_workspace"


@dataclass(kw_only=True)
class StageConfig:
    """One stage: a program from stages/, its dependencies, outputs, verification and per-backend resources."""

    program: str
    args: list[str] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)  # stage names; `{stage: X, stream: true}` entries too (needs.py)
    description: str = ""
    outputs: list[str] = field(default_factory=list)
    verify: list[Check] = field(default_factory=list)
    reshardable: bool = False  # may resume with a different replicas x processes than it started with
    # waits on the network or the disk more than it computes (a download): more processes than cores still help
    io_bound: bool = False
    # Outputs found in the stage's output folders that another config made (engine/output_digest.py): redone
    # (set aside first, never deleted), refused (the stage fails and names this setting), or reused as they are.
    other_outputs: Literal["redo", "refuse", "reuse"] = "redo"
    continuation: Continuation | None = None  # with `nemo:` and none given, preflight.py derives it
    stall_guard: StallGuard = field(default_factory=StallGuard)  # a training that stops advancing
    nemo: NemoTraining | None = None
    megatron_bridge: MegatronBridgeTraining | None = None  # the other training engine: one or the other
    # the megatron_bridge: stage whose data index this stage builds beforehand, on a CPU; its args, images and
    # verification are derived from that stage's (config/bridge_index.py)
    data_index_of: str | None = None
    # the training stage whose latest checkpoint this stage exports as a Hugging Face folder; its args, images and
    # verification are derived from that stage's (config/export.py)
    export_of: str | None = None
    # the megatron_bridge: stage whose checkpoints this stage evaluates on the held-out split as they land (a
    # streamed need); its args, images and verification are derived from that stage's (config/evaluate.py)
    evaluate_of: str | None = None
    bcp: BcpResources = field(default_factory=BcpResources)
    local: LocalResources = field(default_factory=LocalResources)
    slurm: SlurmResources = field(default_factory=SlurmResources)
    gridengine: GridEngineResources = field(default_factory=GridEngineResources)
    kubernetes: KubernetesResources = field(default_factory=KubernetesResources)
    lepton: LeptonResources = field(default_factory=LeptonResources)
    name: str = field(default="", metadata={"internal": True})
    line: int | None = field(default=None, metadata={"internal": True})
    # needs written `{stage: X, stream: true}`: this stage starts while X runs, on X's finished outputs (needs.py)
    streamed: list[str] = field(default_factory=list, metadata={"internal": True})
    # of stages/PROGRAM and the modules of stages/ it imports (programs.py), read when loaded
    program_sha256: str = field(default="", metadata={"internal": True})
    # Where each key was written (file:line, or the --set that gave it; a key left out points at the stage), so
    # the checks that run after loading (preflight.py) name the same place the loader's own errors do.
    locations: dict[str, Where] = field(default_factory=dict, repr=False, metadata={"internal": True})
    # The values --set gave, by key path in the stage ({"bcp.image": "--set pretrain.bcp.image=X"}): a check after
    # loading that refuses one of them names the --set, not the file's line for the section.
    set_values: dict[str, str] = field(default_factory=dict, repr=False, metadata={"internal": True})

    def resources(self, backend: str) -> Any:
        return getattr(self, backend)

    @property
    def engine(self) -> str | None:
        """The training engine the stage declares (its section's key: `nemo` or `megatron_bridge`), or None."""
        return "nemo" if self.nemo else "megatron_bridge" if self.megatron_bridge else None

    @property
    def trains(self) -> bool:
        """A training: an engine's, or a stage continued toward a step count from its checkpoints (the smoke
        pretrain). An evaluation is continued too, through its results (evaluate.py), but logs no training steps,
        so no stall guard watches it and it is no training in `status` or the report."""
        return self.engine is not None or (self.continuation is not None and self.evaluate_of is None)

    @property
    def resumes_from(self) -> str:
        """What a further job of this stage goes on from ("its last checkpoint", "its last result"), or "" for a
        stage that is not continued."""
        if self.continuation is None:
            return ""
        return "its last checkpoint" if self.trains else "its last result"

    def where(self, key: str) -> Where:
        """Where `key` of this stage came from, for errors raised after loading."""
        return self.locations[key]


@dataclass(kw_only=True)
class VerificationResources:
    """Resources of the small jobs that count a stage's outputs (merged over the pipeline defaults)."""

    bcp: BcpResources = field(default_factory=BcpResources)
    local: LocalResources = field(default_factory=LocalResources)
    slurm: SlurmResources = field(default_factory=SlurmResources)
    gridengine: GridEngineResources = field(default_factory=GridEngineResources)
    kubernetes: KubernetesResources = field(default_factory=KubernetesResources)
    lepton: LeptonResources = field(default_factory=LeptonResources)


@dataclass(kw_only=True)
class Estimates:
    """`estimates:` of a pipeline: the declared figures `plan` and `status` estimate from (estimates.py).

    Data-set sizes are numbers or `${var}` (YAML reads `895e9` as text; it is taken as a number here).
    docs/estimates-and-report.md ("Where the estimate figures come from") says where each default comes from.
    """

    compressed_bytes: float | str | None = None  # what download fetches (.jsonl.zst)
    text_bytes: float | str | None = None  # the same uncompressed (.jsonl)
    documents: float | str | None = None  # adds the .idx bytes (20 per document) when given
    tokens: float | str | None = None  # in the training tokenizer's count
    download_mb_per_s_per_node: float | None = None  # declared, never measured here; no figure: no download time
    storage_mb_per_s_per_node: float | None = None  # declared workspace read or write rate per node; caps the
    # data stages (no figure: their times are CPU-bound only)
    mfu: float = 0.40  # model FLOPs utilisation of pretraining (declared; docs/estimates-and-report.md says why 0.40)
    cpu_peak_tflops: float | None = None  # declared peak of one CPU process, the only peak MFU on CPU is held
    # against (report/mfu.py); none: a CPU run shows no MFU
    per_core: dict[str, float] = field(default_factory=dict)  # PROGRAM: per-core figure replacing the benchmark's
    # (extract.py, concat.py: MB/s written; preprocess.py: tokens/s)

    def number(self, key: str, variables: dict[str, str]) -> float | None:
        """A data-set size as a number, `${var}` resolved; ValueError naming the text otherwise."""
        value = getattr(self, key)
        if value is None or isinstance(value, float):
            return value
        resolved = substitute(value, variables)
        try:
            return float(resolved)
        except ValueError:
            raise ValueError(
                f"{value!r} is not a number" + (f" (it is {resolved!r})" if resolved != value else "")
            ) from None


ESTIMATE_SIZES = ("compressed_bytes", "text_bytes", "documents", "tokens")


@dataclass(kw_only=True)
class PipelineConfig:
    """A DAG of stages with shared workspace, variables and defaults."""

    workspace: Workspace
    stages: dict[str, StageConfig]
    description: str = ""
    backend: str = "local"  # used when --backend is not given: a name of config.resources.BACKENDS
    vars: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    verification: VerificationResources = field(default_factory=VerificationResources)
    estimates: Estimates = field(default_factory=Estimates)
    name: str = field(default="", metadata={"internal": True})
    # The vars --set gave (name -> `--set vars.NAME=VALUE`): a bad value made of them is blamed on the --set.
    var_origins: dict[str, str] = field(default_factory=dict, repr=False, metadata={"internal": True})

    def order(self) -> list[str]:
        """Stage names in a topological order (file order among independent stages)."""
        from bcp_pipeline.config.dag import topological_order

        return topological_order({name: stage.needs for name, stage in self.stages.items()})


@dataclass(kw_only=True)
class Config:
    """A whole pipelines.yaml."""

    file: Path
    stages_dir: Path
    options: dict[str, Any]
    pipelines: dict[str, PipelineConfig]
    notices: list[str] = field(default_factory=list)  # what the checks after loading want said (preflight.py)

    def pipeline(self, name: str) -> PipelineConfig:
        if name not in self.pipelines:
            raise ConfigError(
                f"no pipeline {name!r}; pipelines here: {', '.join(self.pipelines) or '(none)'}", file=str(self.file)
            )
        return self.pipelines[name]


def expected_count(pipeline: PipelineConfig, stage_name: str, check: Check, seen: tuple[str, ...] = ()) -> int:
    """The number of files `check` expects, derived through `expect_from` chains (pure, so `plan` can print it)."""
    if check.expect is not None:
        count = resolve_int(str(check.expect), pipeline.vars)
        # `group` divides a fixed count too: one evaluation per `every` steps of `steps` (and of the last).
        return -(-count // resolve_int(str(check.group), pipeline.vars)) if check.group is not None else count
    upstream = check.expect_from
    assert upstream is not None
    if upstream in seen:
        raise ConfigError(f"stage {stage_name!r}: expect_from loops through {' -> '.join((*seen, upstream))}")
    base = expected_count(pipeline, upstream, pipeline.stages[upstream].verify[0], (*seen, stage_name))
    if check.group is not None:
        return -(-base // resolve_int(str(check.group), pipeline.vars))
    return base * check.per
