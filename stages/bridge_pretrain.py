"""Pretraining with NVIDIA's Megatron-Bridge, one process a rank: a recipe, the overrides bcp-pipeline rendered,
then `pretrain()`. Built on the `megatron-bridge` wheel's public API only (the repository's runner script,
scripts/training/run_recipe.py, is not in the wheel), so what the job runs is what the tests check.

    python3 bridge_pretrain.py --recipe vanilla_gpt_pretrain_config [--overrides-file FILE]... KEY=VALUE ...
    python3 bridge_pretrain.py ... --dry-run --world-size 64     # build, override, finalize, print; no training

Each rank needs RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, as torchrun and bcprun set them; under
srun (which sets SLURM_PROCID and the like) they are derived here (_ranks.rendezvous). An overrides file holds one
KEY=VALUE a line: the data list (`dataset.data_path=[w,prefix,...]`, data_list.py's hydra format) is written into
one by the job's first step, from the preprocess manifests. A recipe that reads its architecture from the Hugging
Face Hub (the Llama ones) takes HF_TOKEN from the environment (a secret of the job), or `--hf-home DIR`, a cache
filled beforehand, read offline.

`--dry-run` builds the config as every rank would, applies `runtime_config_update` (mixed precision, the data-
parallel size for `--world-size` ranks, Bridge's own validation; what `pretrain()` runs first) and prints the
resolved config as YAML: it needs no GPU. Training does.

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

from _ranks import rendezvous

UNDER_NSYS = "BCP_PIPELINE_UNDER_NSYS"  # set in the environment of the process nsys starts


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="vanilla_gpt_pretrain_config",
                        help="a recipe of megatron.bridge.recipes (default: %(default)s)")
    parser.add_argument("--overrides-file", action="append", default=[], type=Path, metavar="FILE",
                        help="more KEY=VALUE overrides, one a line (repeatable; applied before those given here)")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved config; train nothing")
    parser.add_argument("--world-size", type=int, default=None,
                        help="with --dry-run: the ranks to resolve the config for (default: WORLD_SIZE, else 1)")
    parser.add_argument("--nsys-output", type=Path, metavar="DIR", help="run under Nsight Systems, files in DIR")
    parser.add_argument("--hf-home", type=Path, metavar="DIR",
                        help="a Hugging Face cache filled beforehand: recipes read it offline (HF_HUB_OFFLINE=1)")
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
    for key, value in (("RANK", meet.rank), ("WORLD_SIZE", meet.world_size), ("LOCAL_RANK", meet.local_rank),
                       ("MASTER_ADDR", meet.master_addr), ("MASTER_PORT", meet.master_port)):
        environ.setdefault(key, str(value))


def build_config(recipe: str, overrides: list[str]):
    """The recipe's ConfigContainer with the overrides applied (Bridge refuses an unknown key: OverridesError)."""
    from megatron.bridge import recipes
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    factory = getattr(recipes, recipe, None)
    if factory is None or not callable(factory):
        raise SystemExit(f"bridge_pretrain: megatron.bridge.recipes has no recipe {recipe!r}")
    return process_config_with_overrides(factory(), cli_overrides=overrides)


def dry_run(recipe: str, overrides: list[str], world_size: int) -> int:
    """Resolve the config as `pretrain()` would for `world_size` ranks, and print it."""
    from megatron.bridge.training.config import runtime_config_update

    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("RANK", "0")
    config = build_config(recipe, overrides)
    runtime_config_update(config)
    print(f"# bridge_pretrain --dry-run: recipe {recipe}, {len(overrides)} override(s), {world_size} rank(s)")
    config.print_yaml()
    return 0


def train(recipe: str, overrides: list[str]) -> int:
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    config = build_config(recipe, overrides)
    if os.environ.get("RANK", "0") == "0":
        print(f"bridge_pretrain: recipe {recipe}, {os.environ.get('WORLD_SIZE')} rank(s), checkpoints "
              f"{config.checkpoint.save}, exit after {config.train.exit_duration_in_mins} minute(s)", flush=True)
    pretrain(config, forward_step)
    return 0


def under_nsys(output: Path, argv: list[str]) -> None:
    """Run this program again under Nsight Systems (replaces this process)."""
    nsys = shutil.which("nsys")
    if nsys is None:
        raise SystemExit("bridge_pretrain: --nsys-output needs Nsight Systems (`nsys`) on PATH, as the NeMo images "
                         "have it")
    output.mkdir(parents=True, exist_ok=True)
    os.environ[UNDER_NSYS] = "1"
    os.execv(nsys, [nsys, "profile", "-s", "none", "-t", "cuda,nvtx", "--capture-range=cudaProfilerApi",
                    "--capture-range-end=stop", "-o", str(output / "profile_%p"), sys.executable, __file__, *argv])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.hf_home is not None:  # before Bridge (and huggingface_hub) is imported: both read these once
        os.environ["HF_HOME"] = str(args.hf_home)
        os.environ["HF_HUB_OFFLINE"] = "1"
    overrides = overrides_of(args)
    if args.dry_run:
        return dry_run(args.recipe, overrides, args.world_size or int(os.environ.get("WORLD_SIZE", "1")))
    if args.nsys_output is not None and not os.environ.get(UNDER_NSYS):
        under_nsys(args.nsys_output, argv)
    set_rank_environment(os.environ)  # type: ignore[arg-type]
    return train(args.recipe, overrides)


if __name__ == "__main__":
    sys.exit(main())
