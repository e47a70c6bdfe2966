"""Pretraining with NVIDIA's Megatron-Bridge, one process a rank: a recipe, the overrides bcp-pipeline rendered,
then `pretrain()`. Built on the `megatron-bridge` wheel's public API only (the repository's runner script,
scripts/training/run_recipe.py, is not in the wheel), so what the job runs is what the tests check.

    python3 bridge_pretrain.py --recipe vanilla_gpt_pretrain_config [--overrides-file FILE]... KEY=VALUE ...
    python3 bridge_pretrain.py ... --dry-run --world-size 64     # build, override, finalize, print; no training
    python3 bridge_pretrain.py ... --layer-spec local            # megatron-core's own layers, no Transformer Engine

Each rank needs RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, as torchrun and bcprun set them; under
srun (which sets SLURM_PROCID and the like) they are derived here (_ranks.rendezvous). An overrides file holds one
KEY=VALUE a line: the data list (`dataset.data_path=[w,prefix,...]`, data_list.py's hydra format) is written into
one by the job's first step, from the preprocess manifests. A recipe that reads its architecture from the Hugging
Face Hub (the Llama ones) takes HF_TOKEN from the environment (a secret of the job), or `--hf-home DIR`, a cache
filled beforehand, read offline.

`--dry-run` builds the config as every rank would, applies `runtime_config_update` (mixed precision, the data-
parallel size for `--world-size` ranks, Bridge's own validation; what `pretrain()` runs first) and prints the
resolved config as YAML: it needs no GPU. Training does.

The recipe's process environment (ConfigContainer.env_vars: PYTORCH_CUDA_ALLOC_CONF, the NCCL settings) must be in
place before torch and Transformer Engine are imported, and building the recipe imports them; Bridge itself sets
them only inside `pretrain()`. So, as Bridge's own scripts/training/recipe_runner.py does, a first start builds the
config, sets each variable the environment lacks (setdefault: what the launcher or the job sets wins) and starts
this program again, which then finds them at start (RECIPE_ENV_APPLIED marks the second start: no loop).

`--layer-spec local` builds the model from megatron-core's local layer spec (its own linear, norm and attention
modules: no Transformer Engine, for a machine that lacks it) instead of Bridge's default TE spec. With PyTorch's
LayerNorm (no Apex either) megatron-core refuses a zero-centred gamma and sequence parallelism at model build.

Before a resume rank 0 replaces a torn `latest_train_state.pt` (Bridge copies it in place, not atomically, and
stops on one it cannot read) with the iteration folder's own copy (_bridge_tracker.py).

With `--nsys-output DIR` every rank runs under Nsight Systems, capturing the steps `profiling.profile_step_start`
to `profile_step_end` of the ranks `profiling.profile_ranks` (Bridge starts and stops the capture through the CUDA
profiler API), one file a rank: DIR/profile_<pid>.nsys-rep.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from _bridge_tracker import repair_torn_tracker
from _ranks import rendezvous

STARTED_WITH = dict(os.environ)  # this process's environment at start, before Bridge (and torch) is imported
UNDER_NSYS = "BCP_PIPELINE_UNDER_NSYS"  # set in the environment of the process nsys starts
RECIPE_ENV_APPLIED = "BCP_PIPELINE_RECIPE_ENV_APPLIED"  # set for the second start: the recipe's variables it set


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--recipe",
        default="vanilla_gpt_pretrain_config",
        help="a recipe of megatron.bridge.recipes (default: %(default)s)",
    )
    parser.add_argument(
        "--overrides-file",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="more KEY=VALUE overrides, one a line (repeatable; applied before those given here)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the resolved config; train nothing")
    parser.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="with --dry-run: the ranks to resolve the config for (default: WORLD_SIZE, else 1)",
    )
    parser.add_argument("--nsys-output", type=Path, metavar="DIR", help="run under Nsight Systems, files in DIR")
    parser.add_argument(
        "--hf-home",
        type=Path,
        metavar="DIR",
        help="a Hugging Face cache filled beforehand: recipes read it offline (HF_HUB_OFFLINE=1)",
    )
    parser.add_argument(
        "--layer-spec",
        choices=("te", "local"),
        default="te",
        help="the model's layers: Transformer Engine's (te, Bridge's default) or megatron-core's "
        "own (local: no Transformer Engine needed)",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    return parser.parse_args(argv)


def overrides_of(args: argparse.Namespace) -> list[str]:
    """The files' lines first (blank lines and `#` comments skipped), then the command line's."""
    found: list[str] = []
    for path in args.overrides_file:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise SystemExit(f"bridge_pretrain: cannot read --overrides-file {path}: {exc.strerror}") from None
        found += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    bad = [item for item in [*found, *args.overrides] if "=" not in item]
    if bad:
        raise SystemExit(f"bridge_pretrain: not KEY=VALUE: {', '.join(bad)}")
    return [*found, *args.overrides]


def set_rank_environment(environ: dict[str, str]) -> None:
    """torch.distributed's variables where the launcher (srun) gave only its own."""
    meet = rendezvous(environ)
    for key, value in (
        ("RANK", meet.rank),
        ("WORLD_SIZE", meet.world_size),
        ("LOCAL_RANK", meet.local_rank),
        ("MASTER_ADDR", meet.master_addr),
        ("MASTER_PORT", meet.master_port),
    ):
        environ.setdefault(key, str(value))


def build_config(recipe: str, overrides: list[str]):
    """The recipe's ConfigContainer with the overrides applied (Bridge refuses an unknown key: OverridesError)."""
    from megatron.bridge import recipes
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    factory = getattr(recipes, recipe, None)
    if factory is None or not callable(factory):
        raise SystemExit(f"bridge_pretrain: megatron.bridge.recipes has no recipe {recipe!r}")
    return process_config_with_overrides(factory(), cli_overrides=overrides)


def recipe_environment(config) -> dict[str, str]:
    """The recipe's variables this process's environment lacks, as Bridge's apply_environment_variables would set
    them (setdefault, the value as str)."""
    wanted = getattr(config, "env_vars", None) or {}  # a Bridge before env_vars has none to set
    return {str(name): str(value) for name, value in wanted.items() if name not in os.environ}


def start_again(args: argparse.Namespace, argv: list[str]) -> None:
    """Run this program again in this process with the environment as it now is (replaces it): under Nsight
    Systems where asked (the second start is then nsys's), else the same interpreter, its options (-u) kept."""
    if args.nsys_output is not None and not os.environ.get(UNDER_NSYS):
        under_nsys(args.nsys_output, argv)
    options = (
        sys.orig_argv[1 : len(sys.orig_argv) - len(sys.argv)]
        if sys.argv[0] == __file__ or Path(sys.argv[0]).resolve() == Path(__file__).resolve()
        else []
    )
    os.execv(sys.executable, [sys.executable, *options, __file__, *argv])


def apply_recipe_environment(config, args: argparse.Namespace, argv: list[str]) -> None:
    """Set what the recipe's environment adds, and start again so that torch and TE see it at import."""
    pending = recipe_environment(config)
    if not pending:
        return
    os.environ.update(pending)
    if os.environ.get(RECIPE_ENV_APPLIED):  # the second start still lacks them: applied here, as Bridge would
        print(
            f"bridge_pretrain: the recipe's {', '.join(sorted(pending))} were not in the environment at the "
            "second start; set now, after torch was imported",
            file=sys.stderr,
            flush=True,
        )
        return
    os.environ[RECIPE_ENV_APPLIED] = ",".join(sorted(pending))
    if first_rank():
        print(
            f"bridge_pretrain: the recipe sets {', '.join(f'{k}={v}' for k, v in sorted(pending.items()))}; "
            "starting again so that torch and Transformer Engine see them at import",
            file=sys.stderr,
            flush=True,
        )
    start_again(args, argv)


def first_rank() -> bool:
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"


def use_layer_spec(config, spec: str) -> None:
    """`local`: megatron-core's layers without Transformer Engine (Bridge's local_layer_spec over
    get_gpt_layer_local_spec), and transformer_impl saying so (Bridge's checks of TE-only features read it)."""
    if spec == "local":
        from megatron.bridge.models.gpt_provider import local_layer_spec

        config.model.transformer_layer_spec = local_layer_spec
        config.model.transformer_impl = "local"


def environment_lines(config) -> list[str]:
    """Each recipe variable, its value and whether this process had it at start (before Bridge was imported)."""
    wanted = getattr(config, "env_vars", None) or {}
    return [
        f"#   {name}={os.environ.get(name)} ({'at start' if name in STARTED_WITH else 'set after import'})"
        for name in sorted(wanted)
    ]


def dry_run(config, recipe: str, overrides: list[str], world_size: int) -> int:
    """Resolve the config as `pretrain()` would for `world_size` ranks, and print it."""
    from megatron.bridge.training.config import runtime_config_update

    runtime_config_update(config)
    print("# bridge_pretrain: the recipe's environment", *environment_lines(config), sep="\n")
    print(f"# bridge_pretrain --dry-run: recipe {recipe}, {len(overrides)} override(s), {world_size} rank(s)")
    config.print_yaml()
    return 0


def train(config, recipe: str) -> int:
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    if os.environ.get("RANK", "0") == "0":
        load = config.checkpoint.load
        # An evaluation (evaluate.py --from bridge) reads a running training's folder: it never writes there
        evaluating = bool(getattr(getattr(config, "validation", None), "skip_train", False))
        repaired = repair_torn_tracker(load) if load and os.path.isdir(load) and not evaluating else ""
        if repaired:  # before pretrain(): no rank reads the tracker before rank 0 joins the process group
            print(f"bridge_pretrain: {load}: {repaired}", file=sys.stderr, flush=True)
        print(
            f"bridge_pretrain: recipe {recipe}, {os.environ.get('WORLD_SIZE')} rank(s), checkpoints "
            f"{config.checkpoint.save}, exit after {config.train.exit_duration_in_mins} minute(s)",
            flush=True,
        )
    pretrain(config, forward_step)
    return 0


def under_nsys(output: Path, argv: list[str]) -> None:
    """Run this program again under Nsight Systems (replaces this process)."""
    nsys = shutil.which("nsys")
    if nsys is None:
        raise SystemExit(
            "bridge_pretrain: --nsys-output needs Nsight Systems (`nsys`) on PATH, as the NeMo images have it"
        )
    output.mkdir(parents=True, exist_ok=True)
    os.environ[UNDER_NSYS] = "1"
    os.execv(
        nsys,
        [
            nsys,
            "profile",
            "-s",
            "none",
            "-t",
            "cuda,nvtx",
            "--capture-range=cudaProfilerApi",
            "--capture-range-end=stop",
            "-o",
            str(output / "profile_%p"),
            sys.executable,
            __file__,
            *argv,
        ],
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.hf_home is not None:  # before Bridge (and huggingface_hub) is imported: both read these once
        os.environ["HF_HOME"] = str(args.hf_home)
        os.environ["HF_HUB_OFFLINE"] = "1"
    overrides = overrides_of(args)
    world_size = args.world_size or int(os.environ.get("WORLD_SIZE", "1"))
    if args.dry_run:  # the ranks to resolve for, as pretrain() reads them
        os.environ["WORLD_SIZE"] = str(world_size)
        os.environ.setdefault("RANK", "0")
    config = build_config(args.recipe, overrides)
    apply_recipe_environment(config, args, argv)  # may start this program again (a second start: a no-op)
    use_layer_spec(config, args.layer_spec)
    if args.dry_run:
        return dry_run(config, args.recipe, overrides, world_size)
    if args.nsys_output is not None and not os.environ.get(UNDER_NSYS):
        under_nsys(args.nsys_output, argv)
    set_rank_environment(os.environ)  # type: ignore[arg-type]
    return train(config, args.recipe)


if __name__ == "__main__":
    sys.exit(main())
