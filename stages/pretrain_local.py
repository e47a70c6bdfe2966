"""Local smoke pretrain: a small GPT in plain PyTorch trained on the preprocess outputs, resumable like NeMo.

The data path is the one NeMo uses: the data list of `data_list.py` (weights proportional to tokens) goes to
megatron-core's `BlendedMegatronDatasetBuilder(GPTDataset, ...)`, which reads the .bin/.idx files. Megatron's
own GPTModel needs CUDA internals, so the model is a small pre-LayerNorm GPT (tied input/output embedding over the
full GPT-2 vocabulary) that trains on 2 CPU cores in seconds and uses a CUDA device when `--device auto` finds one.

Checkpoints and resume (NeMo's `resume_if_exists` semantics):
* `<results>/<run-name>/checkpoints/step=NNNNNN[-last].pt`, one every `--checkpoint-every` steps and at the end;
  each written to a hidden temporary and renamed, so a file under its final name is always complete. The newest
  carries `-last`; the previous `-last` is renamed after the new one is in place, and only the newest
  `--keep-checkpoints` are kept. A kill between those renames can leave two `-last` files: the highest step
  wins, and the next save repairs the names.
* Rerunning with the same `--run-name` continues from the highest-step checkpoint: model, optimizer, RNG state,
  loss history and data position (sample `step * global_batch_size` of a fixed, seeded sample order), so an
  interrupted and resumed run ends with the same step count, and on the same machine, world size and thread count
  the same weights bit for bit (`weights_sha256` in the summary), as an uninterrupted one. Model shape, sequence
  length, global batch, seed and data list must match the checkpoint; `--steps` may grow (the sample order is then
  rebuilt for the new length, as NeMo's is when max_steps changes); the number of ranks may change.
* `<results>/<run-name>/train_summary.json` is written (atomically) when `--steps` are done; exit 0 only then.
  SIGTERM/SIGINT finish the current step, save a checkpoint and exit 1 ("rerun to continue").

Ranks (data parallel): with WORLD_SIZE > 1 every rank trains, through torch DistributedDataParallel (gloo on CPU,
nccl with `--device cuda`, one GPU per LOCAL_RANK), meeting where `_common.rendezvous()` says (torchrun, bcprun,
Slurm). A step is `--global-batch-size` samples whatever the world size: rank r takes its contiguous share of them
in micro batches of `--micro-batch-size` (gradient accumulation makes up the rest), and the loss is the global
token mean, so N ranks follow the one-process curve up to float summation order. Rank 0 alone writes checkpoints,
the summary and the loss lines; every rank loads the checkpoint rank 0 picked, so a run may resume on any world
size that divides the global batch. The results folder must be shared by all ranks (as NeMo's). Every collective
has `--collective-timeout`: a rank that dies or hangs makes the others exit 1 with a message, never wait forever.
A stop signal on any rank stops all of them after the same step.

Validation (`--valid-data-dir DIR`, a held-out split's own .bin/.idx, as Megatron's per-split data paths): every
`--eval-interval` steps and at the last, rank 0 prints Megatron's `validation loss at iteration N | lm loss value:
...` line for the first `--eval-iters` global batches of that split (stages/_pretrain_eval.py, the function the
evaluate stage runs on each checkpoint, so both give the same numbers).

Each step line ends with the step's own wall time (`... 2.34 steps/s 0.4123 s/step`), and rank 0 prints the
model's shape once (`model shape: layers L hidden H ...`): the report's step time, tokens/s and MFU come from them.
Profiling (`bcp-pipeline profile`, stages/_profiling.py): `--profile-steps A:B` records those steps with
torch.profiler (a Chrome trace and a top-operators table in `<results>/<run-name>/profile/`), `--timers` prints
each logged step's forward/backward/optimizer times in Megatron's timer layout, `--no-checkpoints` saves none.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import sys
import time
from pathlib import Path

import _common
import _index_manifest
import _profiling
import data_list
import torch
from _pretrain_checkpoints import latest_checkpoint, restore
from _pretrain_comm import CollectiveFailed, Comm, pick_device
from _pretrain_data import IdsTokenizer, build_train_dataset
from _pretrain_eval import VALID_CACHE, build_heldout_dataset, eval_samples, heldout_loss, validation_line
from _pretrain_loop import loop
from _smoke_gpt import SmokeGPT, make_optimizer, weights_digest
from torch import nn

STAGE = "pretrain_local"
SUMMARY = "train_summary.json"
DEFAULT_COLLECTIVE_TIMEOUT = 600  # seconds; NCCL's own default, and more than a checkpoint save takes


def make_deterministic(threads: int, device: torch.device) -> None:
    """Same thread count + deterministic kernels: a resumed run repeats the uninterrupted one bit for bit."""
    torch.set_num_threads(threads)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for determinism
    # CUDA's fused attention backward has no deterministic variant: warn there instead of refusing to run.
    torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")


def keep_freed_memory() -> None:
    """Ask glibc to keep freed memory for reuse instead of returning it to the OS (a speed hint only).

    Every CPU step allocates and frees ~100 MB of logits and their gradients; glibc serves blocks that large with
    mmap and gives them back with munmap, so each step page-faults them in again: measured here, that is 4x the
    system time and ~15% of all CPU time. Not glibc (or not Linux): nothing to do.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    libc.mallopt(m_mmap_threshold, 1 << 30)
    libc.mallopt(m_trim_threshold, 1 << 30)


def run_config(args: argparse.Namespace, entries: list[data_list.DataEntry], world: int) -> dict:
    """Everything that defines this run, saved in every checkpoint (world size and micro batch for information)."""
    tokenizer = entries[0].tokenizer
    return {
        "vocab_size": int(tokenizer.get("vocab_size", 50257)),
        "eod": int(tokenizer.get("eod", 50256)),
        "layers": args.layers,
        "hidden": args.hidden,
        "heads": args.heads,
        "seq_length": args.seq_length,
        "global_batch_size": args.global_batch_size,
        "micro_batch_size": args.micro_batch_size,
        "world_size": world,
        "seed": args.seed,
        "split": args.split,
        "lr": args.lr,
        "warmup_steps": args.warmup_steps,
        "weight_decay": args.weight_decay,
        "data": data_list.blend(entries),
        "data_names": [[e.weight, e.name] for e in entries],
        "threads": args.threads,
        "eval_iters": args.eval_iters,
        "precision": args.precision,
    }


def check_batch_split(args: argparse.Namespace, world: int) -> None:
    """The global batch must split evenly over the ranks, and each rank's share into whole micro batches."""
    divisors = [n for n in range(1, args.global_batch_size + 1) if args.global_batch_size % n == 0]
    if args.global_batch_size % world:
        raise _common.StageError(
            f"--global-batch-size {args.global_batch_size} does not split over {world} ranks; "
            f"run on a world size that divides it ({', '.join(map(str, divisors))})"
        )
    share = args.global_batch_size // world
    if args.micro_batch_size is None:
        args.micro_batch_size = share
    if share % args.micro_batch_size:
        raise _common.StageError(
            f"--micro-batch-size {args.micro_batch_size} does not divide this rank's "
            f"{share} sample(s) of --global-batch-size {args.global_batch_size} over {world} "
            "rank(s)"
        )


def train(args: argparse.Namespace, comm: Comm) -> dict:
    """Train to `args.steps`, resuming from the run's last checkpoint; return the summary (all ranks)."""
    run_dir = args.results / args.run_name
    ckpt_dir = run_dir / "checkpoints"
    lead = comm.rank == 0  # rank 0 alone touches the run folder and speaks for the job
    if lead:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        removed = _common.remove_stale_temporaries(ckpt_dir) + _common.remove_stale_temporaries(run_dir)
        if removed:
            print(f"removed {removed} partial file(s) left by a killed run")
        # The summary means "done": a stale one from a shorter earlier run must not outlive this run's start.
        (run_dir / SUMMARY).unlink(missing_ok=True)
    entries = data_list.build_data_list(args.data_dir)
    cfg = run_config(args, entries, comm.world)
    device = comm.device
    make_deterministic(args.threads, device)
    if device.type == "cpu":
        keep_freed_memory()
    torch.manual_seed(args.seed)
    model = SmokeGPT(cfg["vocab_size"], args.hidden, args.layers, args.heads, args.seq_length).to(device)
    optimizer = make_optimizer(model, args.lr, args.weight_decay)
    state = {"step": 0, "losses": []}
    # Every rank loads the checkpoint rank 0 found: ranks listing the folder themselves could disagree.
    resume_from = comm.from_rank0(latest_checkpoint(ckpt_dir) if lead else None, "agreeing on the checkpoint")
    if resume_from is not None:
        state = restore(resume_from, cfg, model, optimizer, device, lead)
    if lead:
        print(
            f"resuming from {resume_from} at step {state['step']} of {args.steps}"
            if resume_from is not None
            else f"no checkpoint in {ckpt_dir}: starting at step 0 of {args.steps}",
            flush=True,
        )
        print(
            f"data: {len(entries)} output(s), {sum(e.tokens for e in entries)} tokens; model: "
            f"{sum(p.numel() for p in model.parameters())} parameters on {device}, {args.threads} thread(s); "
            f"{comm.world} rank(s), global batch {args.global_batch_size} = micro batch {args.micro_batch_size} x "
            f"{comm.world} rank(s) x {accumulation(args, comm.world)} accumulation step(s)",
            flush=True,
        )
        # The shape the report computes model FLOPs per token from (bcp_pipeline/report/throughput.py).
        print(
            f"model shape: layers {args.layers} hidden {args.hidden} heads {args.heads} seq_length "
            f"{args.seq_length} vocab {cfg['vocab_size']} global_batch {args.global_batch_size} world {comm.world} "
            f"device {device.type} precision {args.precision}",
            flush=True,
        )
    start = state["step"]
    dataset = None
    if start < args.steps:  # a finished run (NeMo: max_steps reached) needs no data, and megatron's import is slow
        prefixes, weights = data_list.split_blend(cfg["data"])
        with comm.guard("building the dataset"):
            dataset = build_train_dataset(
                prefixes,
                weights,
                IdsTokenizer(cfg["vocab_size"], cfg["eod"]),
                cfg,
                args.steps * args.global_batch_size,
                run_dir / "index_cache",
                lead,
            )
    validate = None
    if args.valid_data_dir is not None and start < args.steps:
        with comm.guard("building the held-out dataset"):
            heldout = build_heldout_dataset(
                args.valid_data_dir,
                cfg,
                eval_samples(args.eval_iters, args.global_batch_size),
                run_dir / VALID_CACHE,
                lead,
            )

        def validate(step: int) -> None:  # rank 0 only: the others go on to the next step's all-reduce and wait
            loss, _tokens = heldout_loss(
                model,
                heldout,
                eval_samples(args.eval_iters, args.global_batch_size),
                args.micro_batch_size,
                device,
                args.precision,
            )
            print(validation_line(step, loss), flush=True)

    stats = loop(args, comm, model, optimizer, dataset, state, cfg, ckpt_dir, validate)
    return summarize(args, comm, cfg, state, model, start, stats)


def build_data_index(args: argparse.Namespace) -> int:
    """Only the dataset's index (megatron-core's, into RESULTS/NAME/index_cache), as the training would build it,
    with a manifest (stages/_index_manifest.py): the local stand-in of a Megatron-Bridge training's index stage. The
    training then finds the index complete and reads it."""
    run_dir = args.results / args.run_name
    entries = data_list.build_data_list(args.data_dir)
    cfg = run_config(args, entries, 1)
    cache, manifest = run_dir / "index_cache", args.index_manifest or run_dir / _index_manifest.MANIFEST_NAME
    before = _index_manifest.begin(manifest, cache)
    samples = args.steps * args.global_batch_size
    print(
        f"building the data index of {len(entries)} output(s) into {cache} ({samples} training samples; "
        f"{len(before)} file(s) there already)",
        flush=True,
    )
    start = time.monotonic()
    prefixes, weights = data_list.split_blend(cfg["data"])
    dataset = build_train_dataset(
        prefixes, weights, IdsTokenizer(cfg["vocab_size"], cfg["eod"]), cfg, samples, cache, lead=True
    )
    record = _index_manifest.finish(
        manifest,
        cache,
        _index_manifest.datasets_of(dataset),
        before,
        seconds=time.monotonic() - start,
        samples=[samples, 0, 0],
        what=f"the smoke pretrain {args.run_name}",
    )
    print(_index_manifest.summary_line(STAGE, record, len(prefixes)), flush=True)
    return 0


def accumulation(args: argparse.Namespace, world: int) -> int:
    return args.global_batch_size // (world * args.micro_batch_size)


def summarize(
    args: argparse.Namespace, comm: Comm, cfg: dict, state: dict, model: nn.Module, start: int, stats: dict
) -> dict:
    losses = state["losses"]
    rate = stats["steps_this_run"] / stats["seconds"] if stats["steps_this_run"] else 0.0
    return {
        "run_name": args.run_name,
        "steps": state["step"],
        "target_steps": args.steps,
        "resumed_from_step": start,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "losses": losses,
        "tokens_seen": state["step"] * cfg["global_batch_size"] * cfg["seq_length"],
        "consumed_samples": state["step"] * cfg["global_batch_size"],
        "weights_sha256": weights_digest(model),
        "device": str(comm.device),
        "threads": cfg["threads"],
        "steps_per_s_this_run": round(rate, 3),
        "world_size": comm.world,
        "global_batch_size": cfg["global_batch_size"],
        "micro_batch_size": cfg["micro_batch_size"],
        "gradient_accumulation": accumulation(args, comm.world),
        "checkpoint": str(latest_checkpoint(args.results / args.run_name / "checkpoints")),
        "data_prefix": cfg["data"],
        "config": {k: v for k, v in cfg.items() if k not in ("data", "data_names")},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, type=Path, help="preprocess output: .bin/.idx + manifests")
    parser.add_argument("--results", required=True, type=Path, help="results folder; the run lives in RESULTS/NAME")
    parser.add_argument("--run-name", default="smoke", help="same name -> continue from its last checkpoint")
    parser.add_argument("--steps", type=_common.positive_int, default=60)
    parser.add_argument("--checkpoint-every", type=_common.positive_int, default=20)
    parser.add_argument("--keep-checkpoints", type=_common.positive_int, default=3)
    parser.add_argument("--seq-length", type=_common.positive_int, default=128)
    parser.add_argument(
        "--global-batch-size",
        type=_common.positive_int,
        default=4,
        help="samples per optimizer step over all ranks (fixed for the run)",
    )
    parser.add_argument(
        "--micro-batch-size",
        type=_common.positive_int,
        default=None,
        help="samples per forward on each rank (default: the rank's whole share of the step; "
        "smaller means gradient accumulation)",
    )
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup-steps", type=int, default=None, help="default: steps // 10")
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--layers", type=_common.positive_int, default=2)
    parser.add_argument("--hidden", type=_common.positive_int, default=128)
    parser.add_argument("--heads", type=_common.positive_int, default=4)
    parser.add_argument(
        "--split",
        default="100,0,0",
        help="megatron train,valid,test split of the training data (validation: --valid-data-dir)",
    )
    parser.add_argument(
        "--valid-data-dir",
        type=Path,
        default=None,
        help="a held-out split's preprocess outputs: validate on them (default: no validation)",
    )
    parser.add_argument(
        "--eval-interval",
        type=_common.positive_int,
        default=None,
        help="validate every N steps and at the last (default: --checkpoint-every)",
    )
    parser.add_argument(
        "--eval-iters",
        type=_common.positive_int,
        default=4,
        help="global batches of the held-out split each validation reads (default: %(default)s)",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16-mixed"),
        default="fp32",
        help="bf16-mixed: the forward in bfloat16 autocast, as NeMo trains on GPUs (default: fp32, "
        "bit-exact resume on CPU)",
    )
    parser.add_argument(
        "--threads",
        type=_common.positive_int,
        default=None,
        help="torch CPU threads (default: this node's CPUs / LOCAL_WORLD_SIZE, at most 8); keep it "
        "equal across a resume for bit-identical results",
    )
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=DEFAULT_COLLECTIVE_TIMEOUT,
        help="seconds a rank waits for the others in a collective (rendezvous included) before it "
        "fails the job (default: %(default)s)",
    )
    parser.add_argument("--log-every", type=_common.positive_int, default=1)
    parser.add_argument(
        "--profile-steps",
        metavar="A:B",
        default=None,
        help="record steps A through B with torch.profiler: a Chrome trace and a table of the top "
        "operators in RESULTS/NAME/profile/",
    )
    parser.add_argument("--profile-ranks", default="0", help="comma-separated ranks that profile (default: 0)")
    parser.add_argument(
        "--timers",
        action="store_true",
        help="print each logged step's forward, backward and optimizer times (Megatron's layout)",
    )
    parser.add_argument(
        "--no-checkpoints",
        dest="checkpoints",
        action="store_false",
        help="save no checkpoint (a profile run: it must not touch a real run's checkpoints)",
    )
    parser.add_argument(
        "--build-data-index",
        action="store_true",
        help="build the dataset's index (and its manifest) only, for the training to read; no training",
    )
    parser.add_argument(
        "--index-manifest",
        type=Path,
        default=None,
        help="with --build-data-index: the manifest to write (default: RESULTS/NAME/data_index.json)",
    )
    args = parser.parse_args(argv)
    try:
        args.profile_steps = _profiling.parse_window(args.profile_steps) if args.profile_steps else None
    except ValueError as exc:
        parser.error(str(exc))
    if not re.fullmatch(r"\d+(,\d+)*", args.profile_ranks):
        parser.error(f"--profile-ranks {args.profile_ranks!r}: give ranks as 0 or 0,1,...")
    args.profile_ranks = {int(r) for r in args.profile_ranks.split(",")}
    if args.hidden % args.heads:
        parser.error(f"--hidden {args.hidden} is not divisible by --heads {args.heads}")
    if not re.fullmatch(r"[A-Za-z0-9_.=-]+", args.run_name) or args.run_name.startswith("."):
        parser.error(f"--run-name {args.run_name!r}: use letters, digits and _ . = - (it names a folder)")
    if args.collective_timeout <= 0:
        parser.error(f"--collective-timeout {args.collective_timeout:g}: must be > 0 seconds")
    if args.warmup_steps is None:
        args.warmup_steps = max(1, args.steps // 10)
    if args.eval_interval is None:
        args.eval_interval = args.checkpoint_every
    return args


def default_threads() -> int:
    """This rank's CPUs, at most 8: Slurm's SLURM_CPUS_PER_TASK where set (the task's own CPUs), else an equal
    share of the CPUs this process may use per local rank (torchrun and bcprun start a node's ranks on them all)."""
    try:
        cpus = int(os.environ["SLURM_CPUS_PER_TASK"])
    except (KeyError, ValueError):
        try:
            local_world = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        except ValueError:
            local_world = 1
        cpus = _common.usable_cpus() // local_world
    return max(1, min(cpus, 8))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is None:
        args.threads = default_threads()
    comm = None
    if args.build_data_index:
        try:
            return build_data_index(args)
        except (_common.StageError, data_list.DataListError, _index_manifest.IndexBuildError) as exc:
            print(f"{STAGE}: {exc}", file=sys.stderr)
            return 1
    try:
        rdzv = _common.rendezvous()
        check_batch_split(args, rdzv.world_size)
        comm = Comm(rdzv, pick_device(args.device, rdzv.local_rank), args.collective_timeout)
        if comm.world > 1:
            print(
                f"rank {comm.rank} of {comm.world}: met at {rdzv.master_addr}:{rdzv.master_port} "
                f"({torch.distributed.get_backend()}, {comm.device}); rank 0 logs the steps",
                flush=True,
            )
        summary = train(args, comm)
        print(f"rank {comm.rank} of {comm.world}: weights_sha256 {summary['weights_sha256']}", flush=True)
        comm.barrier("waiting for every rank to finish")  # the run is done when all ranks are
    except CollectiveFailed as exc:
        print(f"{STAGE}: {exc}", file=sys.stderr, flush=True)
        # The process group of a broken job can block in its teardown: leave without it.
        sys.stdout.flush()
        os._exit(1)
    except (_common.StageError, data_list.DataListError) as exc:
        print(f"{STAGE}: {exc}", file=sys.stderr)
        if comm is not None:
            comm.close()
        return 1
    if comm.rank == 0:
        _common.atomic_write_json(args.results / args.run_name / SUMMARY, summary)
        print(
            f"done: {summary['steps']} steps, loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}, "
            f"{summary['tokens_seen']} tokens, {summary['steps_per_s_this_run']} steps/s",
            flush=True,
        )
        _common.emit(
            "summary",
            {"text": f"loss {summary['first_loss']:.2f} -> {summary['last_loss']:.2f} over {summary['steps']} steps"},
        )
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
