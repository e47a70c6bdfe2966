"""`bcp-pipeline profile`: the pipeline's pretrain stage turned into a short profiling job, as `--set` overrides.

Pure. The profile run is the same stage rendered by the same renderers as `run`, changed only by overrides (kept
in the profile run's state, so `status`, `report` and `resume` of it load the same config):
- its own run name (`<name>-profile`) and so its own results folder: it never touches the real run's
  checkpoints, and saves none itself (NeMo: `nemo.checkpoints: false`, so no continuation either: one job, done
  when it exits 0);
- `max_steps` one past the window's last step;
- the smoke pretrain (stages/pretrain_local.py): torch.profiler over the window (`--profile-steps A:B`, a Chrome
  trace and a top-operators table) and its phase timers; verified by its trace file;
- NeMo (launcher): `model.nsys_profile` over the window (Nsight Systems, trace nvtx,cuda) and Megatron's timers,
  every key given with Hydra's `++` (add, or override where the config has it): 7b_improved's config has no
  `nsys_profile` section, so a plain key is refused ("Key 'nsys_profile' is not in struct"), and 126m's has one,
  so a `+` key is refused there ("Could not append to config. An item is already at ...");
- on BCP, `BASH_ENV` = stages/nsys_names.sh, which gives each rank's shell SLURM_JOB_ID, SLURM_NODEID and
  SLURM_PROCID from BCP's own values where bcprun sets none, so the launcher's per-rank file names are unique;
- Megatron-Bridge: `profiling.use_nsys_profiler` over the window on the given ranks (Bridge starts and stops the
  capture through the CUDA profiler API), every rank under Nsight Systems (`megatron_bridge.nsys_output`: the entry
  program re-runs itself under `nsys profile ... -o DIR/profile_%p`, one file a rank, %p its pid).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from bcp_pipeline.config.model import PipelineConfig, StageConfig

PROFILE_SUFFIX = "-profile"
SMOKE_PROGRAM = "pretrain_local.py"
DEFAULT_STEPS = "3:5"  # past the first steps' start-up, few enough for a quick answer
NSYS_TRACE = "[nvtx,cuda]"
# Unique Nsight file names per node and rank on BCP, where bcprun may not set the SLURM_* variables the launcher
# names them after: every bash of the job sources this (shipped with stages/).
NSYS_NAMES_SCRIPT = "${code}/nsys_names.sh"


@dataclass(frozen=True)
class ProfileWindow:
    first: int  # first step profiled, 1-based as the logs number steps
    last: int
    ranks: tuple[int, ...] = (0,)

    @property
    def max_steps(self) -> int:
        return self.last + 1  # just past the window: the last profiled step ends cleanly

    def as_text(self) -> str:
        return f"{self.first}:{self.last}"


def parse_window(steps: str, ranks: str) -> ProfileWindow:
    """`--steps A:B` and `--ranks 0,1`; ValueError naming the option and the fix."""
    match = re.fullmatch(r"(\d+):(\d+)", steps.strip())
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise ValueError(
            f"--steps {steps!r}: give A:B with 1 <= A <= B, the first and last step to profile "
            f"(e.g. --steps {DEFAULT_STEPS})"
        )
    if not re.fullmatch(r"\d+(,\d+)*", ranks.strip()):
        raise ValueError(f"--ranks {ranks!r}: give the ranks to profile as 0 or 0,1,...")
    return ProfileWindow(
        int(match.group(1)), int(match.group(2)), tuple(sorted({int(r) for r in ranks.strip().split(",")}))
    )


def profiled_stage(pipeline: PipelineConfig) -> StageConfig:
    """The pipeline's one pretrain stage (NeMo, or the smoke pretrain); ValueError when it has none or several."""
    found = [s for s in pipeline.stages.values() if s.engine is not None or s.program == SMOKE_PROGRAM]
    if len(found) != 1:
        names = ", ".join(s.name for s in found) or "none"
        raise ValueError(
            f"pipeline {pipeline.name} has {len(found)} pretrain stage(s) ({names}); `profile` needs "
            f"exactly one: a stage with a `nemo:` or `megatron_bridge:` section or program "
            f"{SMOKE_PROGRAM}"
        )
    return found[0]


def profile_overrides(pipeline: PipelineConfig, window: ProfileWindow) -> list[str]:
    """The `--set` overrides that make the pipeline's pretrain stage a profile job."""
    stage = profiled_stage(pipeline)
    smoke = smoke_overrides(stage, window) if stage.program == SMOKE_PROGRAM else []
    if stage.megatron_bridge is not None:
        return [*[o for o in smoke if o.startswith(f"{stage.name}.args=")], *bridge_overrides(stage, window)]
    if stage.nemo is None:
        return smoke
    nemo = stage.nemo
    # A NeMo stage's smoke stand-in (the local backend runs it) takes the profile args only: its verification,
    # shared by every backend, cannot be the smoke trace; the profile job is done when it exits 0.
    return [
        *[o for o in smoke if o.startswith(f"{stage.name}.args=")],
        f"{stage.name}.nemo.run_name={nemo.run_name}{PROFILE_SUFFIX}",
        f"{stage.name}.nemo.continue_run=null",  # never another NeMo run's folder and checkpoints
        f"{stage.name}.nemo.max_steps={window.max_steps}",
        f"{stage.name}.nemo.checkpoints=false",
        f"{stage.name}.continuation=null",
        f"{stage.name}.verify=[]",
        f"{stage.name}.nemo.overrides={json.dumps([*nemo.overrides, *nemo_profile_overrides(window)])}",
        f"{stage.name}.bcp.env={json.dumps({**stage.bcp.env, 'BASH_ENV': NSYS_NAMES_SCRIPT})}",
    ]


def bridge_overrides(stage: StageConfig, window: ProfileWindow) -> list[str]:
    """A Bridge stage as a profile job: its own run, train_iters one past the window, no checkpoint, Nsight over the
    window on the given ranks, one file a rank in the profile run's folder."""
    section, key = stage.megatron_bridge, f"{stage.name}.megatron_bridge"
    run_name = f"{section.run_name}{PROFILE_SUFFIX}"
    ranks = "[" + ",".join(map(str, window.ranks)) + "]"
    profiling = [
        "profiling.use_nsys_profiler=true",
        f"profiling.profile_step_start={window.first}",
        f"profiling.profile_step_end={window.last}",
        f"profiling.profile_ranks={ranks}",
    ]
    return [
        f"{key}.run_name={run_name}",
        f"{key}.continue_run=null",
        f"{key}.train_iters={window.max_steps}",
        f"{key}.checkpoints=false",
        f"{stage.name}.continuation=null",
        f"{stage.name}.verify=[]",
        f"{key}.nsys_output={section.results_dir.rstrip('/')}/{run_name}-${{run_id}}/profile",
        f"{key}.overrides={json.dumps([*section.overrides, *profiling])}",
    ]


def nemo_profile_overrides(window: ProfileWindow, prefix: str = "training.") -> list[str]:
    """The launcher's Hydra overrides for Nsight Systems over the window, Megatron's timers every step, and no
    checkpoint. `prefix` is where the training config sits: `training.` through the launcher's main.py, `` for
    the training script itself (megatron_gpt_pretraining.py)."""
    nsys = f"++{prefix}model.nsys_profile"
    ranks = "[" + ",".join(map(str, window.ranks)) + "]"
    return [
        f"{nsys}.enabled=True",
        f"{nsys}.start_step={window.first}",
        f"{nsys}.end_step={window.last}",
        f"{nsys}.ranks={ranks}",
        f"{nsys}.trace={NSYS_TRACE}",
        f"{nsys}.gen_shape=False",
        f"++{prefix}model.enable_megatron_timers=True",
        f"++{prefix}model.megatron_timer_kwargs.log_option=max",
        # Every step, so a block is one step's times (NeMo sums the steps between blocks otherwise).
        f"++{prefix}model.megatron_timer_kwargs.log_every_n_steps=1",
        f"++{prefix}exp_manager.create_checkpoint_callback=False",
        f"++{prefix}exp_manager.resume_if_exists=False",
    ]


def smoke_overrides(stage: StageConfig, window: ProfileWindow) -> list[str]:
    """The smoke pretrain's args with its own run name, the window's steps, the profiler and timers, and no
    checkpoint; verified by the lowest profiled rank's trace; no continuation (a profile is one attempt)."""
    args = list(stage.args)
    run_name = _option(args, "--run-name", "smoke") + PROFILE_SUFFIX
    _set_option(args, "--run-name", run_name)
    _set_option(args, "--steps", str(window.max_steps))
    args += [
        "--profile-steps",
        window.as_text(),
        "--profile-ranks",
        ",".join(map(str, window.ranks)),
        "--timers",
        "--no-checkpoints",
    ]
    results = _option(args, "--results", None)
    if results is None:
        raise ValueError(f"stage {stage.name}: its args give no --results folder, where the profile is written")
    trace = f"{results.rstrip('/')}/{run_name}/profile/trace_rank{window.ranks[0]}.json"
    return [
        f"{stage.name}.args={json.dumps(args)}",
        f"{stage.name}.continuation=null",
        f"{stage.name}.verify={json.dumps([{'glob': trace, 'expect': 1}])}",
    ]


def _option(args: list[str], name: str, default: str | None) -> str | None:
    return args[args.index(name) + 1] if name in args[:-1] else default


def _set_option(args: list[str], name: str, value: str) -> None:
    if name in args[:-1]:
        args[args.index(name) + 1] = value
    else:
        args += [name, value]
