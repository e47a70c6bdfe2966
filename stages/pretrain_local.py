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

Each step line ends with the step's own wall time (`... 2.34 steps/s 0.4123 s/step`), and rank 0 prints the
model's shape once (`model shape: layers L hidden H ...`): the report's step time, tokens/s and MFU come from them.
Profiling (`bcp-pipeline profile`, stages/_profiling.py): `--profile-steps A:B` records those steps with
torch.profiler (a Chrome trace and a top-operators table in `<results>/<run-name>/profile/`), `--timers` prints
each logged step's forward/backward/optimizer times in Megatron's timer layout, `--no-checkpoints` saves none.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import math
import os
import re
import shutil
import signal
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

import _common
import _profiling
import data_list

STAGE = "pretrain_local"
SUMMARY = "train_summary.json"
CHECKPOINT_RE = re.compile(r"^step=(\d+)(-last)?\.pt$")
CHECKPOINT_FORMAT = 1
# What a resumed run must share with its checkpoint; anything else (lr, steps, logging) may change between runs.
# The data is compared by output names and weights, not paths, so a moved data folder can still be resumed.
# The micro batch and the world size may change: they split a step's samples, they do not choose them.
RESUME_KEYS = ("vocab_size", "layers", "hidden", "heads", "seq_length", "global_batch_size", "seed", "split",
               "data_names")
DEFAULT_COLLECTIVE_TIMEOUT = 600  # seconds; NCCL's own default, and more than a checkpoint save takes


# ---------------------------------------------------------------- model

class Block(nn.Module):
    """Pre-LayerNorm transformer block with causal self-attention (SDPA) and a 4x GELU MLP."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc, self.out = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(batch, seq, 3, self.heads, hidden // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, hidden))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class SmokeGPT(nn.Module):
    """GPT with learned positions and the output layer tied to the token embedding (as GPT-2 and NeMo's GPT)."""

    def __init__(self, vocab_size: int, hidden: int, layers: int, heads: int, seq_length: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.positions = nn.Embedding(seq_length, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.final_ln = nn.LayerNorm(hidden)
        self.apply(self._init)
        for block in self.blocks:  # GPT-2's scaled init of the residual projections keeps early steps stable
            for proj in (block.proj, block.out):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.final_ln(x), self.embed.weight)


def masked_loss_sum(logits: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross entropy over the positions GPTDataset marks (padding is masked out); the caller
    divides by the step's global token count, so micro batches and ranks add up to the one-batch mean."""
    per_token = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none")
    return (per_token * loss_mask.flatten().to(per_token.dtype)).sum()


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW; no decay on biases and LayerNorm weights (as NeMo/Megatron)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup then cosine decay to lr/10; a pure function of the step, so resume needs no scheduler state."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def weights_digest(model: nn.Module) -> str:
    """sha256 over every parameter's bytes in a fixed order: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


# ---------------------------------------------------------------- data

class IdsTokenizer:
    """The attributes GPTDataset reads from a tokenizer (the data is already ids: no text methods needed)."""

    def __init__(self, vocab_size: int, eod: int) -> None:
        self.vocab_size, self.eod = vocab_size, eod
        # Part of megatron's cache key (it json-dumps `unique_identifiers` of the config's objects).
        self.unique_identifiers = {"class": "IdsTokenizer", "vocab_size": vocab_size, "eod": eod}


@contextlib.contextmanager
def single_process_group() -> Iterator[None]:
    """A world of one for megatron's dataset builder.

    `BlendedDataset` calls `torch.distributed.get_rank()` unguarded when its index cache is missing, which
    raises without a process group. A gloo group over an in-memory store needs no address, port or env vars.
    """
    dist = torch.distributed
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def prepare_cache(cache_dir: Path) -> None:
    """megatron writes its .npy indices in place (not atomically): a cache without our marker is rebuilt.

    The marker is absent while megatron may write (a new --steps adds files) and restored once the build returned,
    so a kill mid-build never leaves a half-written index that a later run would take for a cache hit.
    """
    marker = cache_dir / ".complete"
    if cache_dir.exists() and not marker.exists():
        shutil.rmtree(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)


def build_train_dataset(prefixes: list[str], weights: list[float], tokenizer: IdsTokenizer, cfg: dict,
                        num_samples: int, cache_dir: Path, lead: bool = True) -> Any:
    """megatron-core's blended GPT dataset over the data list, at least `num_samples` long.

    Under a process group megatron builds the indices on rank 0, barriers, then the other ranks read its cache;
    the caller (rank 0 only: `lead`) has prepared the cache folder and marks it complete."""
    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed": irrelevant to datasets
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    config = GPTDatasetConfig(
        random_seed=cfg["seed"], sequence_length=cfg["seq_length"], blend=(prefixes, weights), split=cfg["split"],
        tokenizer=tokenizer, path_to_cache=str(cache_dir), reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, create_attention_mask=False,  # the model masks causally itself (SDPA is_causal)
    )
    if lead:
        prepare_cache(cache_dir)
    with single_process_group():
        train, _valid, _test = BlendedMegatronDatasetBuilder(GPTDataset, [num_samples, 0, 0], lambda: True,
                                                             config).build()
    if lead:
        (cache_dir / ".complete").touch()
    if train is None or len(train) < num_samples:
        raise _common.StageError(f"the training split holds {0 if train is None else len(train)} samples, "
                                 f"{num_samples} needed; check --split {cfg['split']!r} and the data")
    return train


def sample_range(step: int, global_batch: int, rank: int, world: int) -> range:
    """This rank's samples of a step: its contiguous share of [step*G, (step+1)*G) of the fixed sample order, so the
    data position is a function of the step alone and the ranks together read exactly the one-process batch."""
    share = global_batch // world
    first = step * global_batch + rank * share
    return range(first, first + share)


def get_micro_batches(dataset: Any, samples: range, micro_batch_size: int,
                      device: torch.device) -> list[dict[str, torch.Tensor]]:
    """The samples in micro batches (one forward/backward each)."""
    batches = []
    for start in range(samples.start, samples.stop, micro_batch_size):
        items = [dataset[i] for i in range(start, min(start + micro_batch_size, samples.stop))]
        batches.append({key: torch.stack([s[key] for s in items]).to(device)
                        for key in ("tokens", "labels", "loss_mask")})
    return batches


# ---------------------------------------------------------------- checkpoints

def checkpoint_name(step: int, last: bool) -> str:
    return f"step={step:06d}{'-last' if last else ''}.pt"


def list_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints (final names only; temporaries are hidden), sorted by step then `-last` first."""
    found = []
    if folder.is_dir():
        for path in folder.iterdir():
            match = CHECKPOINT_RE.match(path.name)
            if match:
                found.append((int(match.group(1)), match.group(2) is None, path))
    return [(step, path) for step, _not_last, path in sorted(found)]


def latest_checkpoint(folder: Path) -> Path | None:
    """The checkpoint to resume from: the highest step (whatever the `-last` markers say after a crash)."""
    found = list_checkpoints(folder)
    return found[-1][1] if found else None


def save_checkpoint(folder: Path, step: int, payload: dict, keep: int) -> Path:
    """Write `step=N-last.pt` atomically, then move the `-last` marker off older ones and prune to `keep`."""
    path = folder / checkpoint_name(step, last=True)
    with _common.atomic_output(path, "wb") as handle:
        torch.save(payload, handle)
    for other_step, other in list_checkpoints(folder):
        if other == path:
            continue
        if other_step == step:  # a stale copy of this very step (older run): the new file supersedes it
            other.unlink()
        elif other.name.endswith("-last.pt"):
            other.rename(folder / checkpoint_name(other_step, last=False))
    for _old_step, old in list_checkpoints(folder)[:-keep]:
        old.unlink()
    _common.fsync_dir(folder)
    return path


def load_checkpoint(path: Path, device: torch.device) -> dict:
    """Load a checkpoint; a corrupt one is an error that says what to do (never silently skipped)."""
    try:
        payload = torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:
        raise _common.StageError(f"{path}: cannot load ({exc}); delete it to resume from the previous one") from exc
    if payload.get("format") != CHECKPOINT_FORMAT:
        raise _common.StageError(f"{path}: checkpoint format {payload.get('format')!r}, expected {CHECKPOINT_FORMAT}")
    return payload


def check_resumable(path: Path, saved: dict, wanted: dict) -> None:
    """NeMo resumes whatever is under the run name; here a changed model or data is refused, not half-loaded."""
    diffs = [f"{key}: checkpoint {saved.get(key)!r}, now {wanted[key]!r}" for key in RESUME_KEYS
             if saved.get(key) != wanted[key]]
    if diffs:
        raise _common.StageError(f"{path} cannot be continued with these settings ({'; '.join(diffs)}); "
                                 "use the same settings or another --run-name")


# ---------------------------------------------------------------- run

class StopFlag:
    """SIGTERM/SIGINT ask for a clean stop after the current step (checkpoint first), as NeMo's max_time does."""

    def __init__(self) -> None:
        self.signal: int | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.signal = signum


class CollectiveFailed(Exception):
    """A collective failed or timed out: another rank died, hangs, or cannot be reached."""


class Comm:
    """The job's ranks as this process sees them. In a world of one there is no process group and every
    collective is the identity, so a single process runs exactly the code (and numbers) it always ran."""

    def __init__(self, rdzv: _common.Rendezvous, device: torch.device, timeout_s: float) -> None:
        self.rank, self.world, self.local_rank = rdzv.rank, rdzv.world_size, rdzv.local_rank
        self.device, self.timeout_s = device, timeout_s
        if self.world == 1:
            return
        host = f"[{rdzv.master_addr}]" if ":" in rdzv.master_addr else rdzv.master_addr  # an IPv6 literal
        with self.guard("the rendezvous"):
            torch.distributed.init_process_group(
                "nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://{host}:{rdzv.master_port}",
                rank=self.rank, world_size=self.world, timeout=timedelta(seconds=timeout_s))

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Turn torch's errors of a broken job into CollectiveFailed. gloo reports a dead peer ("Connection reset by
        peer") and a timeout as plain RuntimeError (DistError is one too); the message keeps torch's first line."""
        if self.world == 1:
            yield
            return
        try:
            yield
        except RuntimeError as exc:
            raise CollectiveFailed(f"rank {self.rank} of {self.world}: {what} failed ({type(exc).__name__}: "
                                   f"{str(exc).strip().splitlines()[0] if str(exc).strip() else 'no detail'}); "
                                   f"another rank died, hangs or cannot be reached (--collective-timeout "
                                   f"{self.timeout_s:g} s)") from exc

    def sum(self, values: list[float], what: str) -> list[float]:
        if self.world == 1:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        with self.guard(what):
            torch.distributed.all_reduce(tensor)
        return tensor.tolist()

    def from_rank0(self, value: Any, what: str) -> Any:
        if self.world == 1:
            return value
        box = [value]
        with self.guard(what):
            torch.distributed.broadcast_object_list(box, src=0, device=self.device)
        return box[0]

    def barrier(self, what: str) -> None:
        if self.world > 1:
            with self.guard(what):
                torch.distributed.barrier(device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def close(self) -> None:
        if self.world > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def pick_device(choice: str, local_rank: int) -> torch.device:
    """CPU, or the GPU of this rank's LOCAL_RANK (one GPU per rank, as torchrun and bcprun lay them out)."""
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise _common.StageError("--device cuda: no CUDA device is visible")
    visible = torch.cuda.device_count()
    # A launcher that binds one GPU to each task (srun --gpus-per-task) leaves each rank a single visible device.
    index = 0 if visible == 1 else local_rank
    if index >= visible:
        raise _common.StageError(f"LOCAL_RANK {local_rank}: only {visible} CUDA device(s) visible; "
                                 "start one rank per GPU")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


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
        "vocab_size": int(tokenizer.get("vocab_size", 50257)), "eod": int(tokenizer.get("eod", 50256)),
        "layers": args.layers, "hidden": args.hidden, "heads": args.heads, "seq_length": args.seq_length,
        "global_batch_size": args.global_batch_size, "micro_batch_size": args.micro_batch_size,
        "world_size": world, "seed": args.seed, "split": args.split,
        "lr": args.lr, "warmup_steps": args.warmup_steps, "weight_decay": args.weight_decay,
        "data": data_list.blend(entries), "data_names": [[e.weight, e.name] for e in entries], "threads": args.threads,
    }


def check_batch_split(args: argparse.Namespace, world: int) -> None:
    """The global batch must split evenly over the ranks, and each rank's share into whole micro batches."""
    divisors = [n for n in range(1, args.global_batch_size + 1) if args.global_batch_size % n == 0]
    if args.global_batch_size % world:
        raise _common.StageError(f"--global-batch-size {args.global_batch_size} does not split over {world} ranks; "
                                 f"run on a world size that divides it ({', '.join(map(str, divisors))})")
    share = args.global_batch_size // world
    if args.micro_batch_size is None:
        args.micro_batch_size = share
    if share % args.micro_batch_size:
        raise _common.StageError(f"--micro-batch-size {args.micro_batch_size} does not divide this rank's "
                                 f"{share} sample(s) of --global-batch-size {args.global_batch_size} over {world} "
                                 "rank(s)")


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
        print(f"resuming from {resume_from} at step {state['step']} of {args.steps}" if resume_from is not None else
              f"no checkpoint in {ckpt_dir}: starting at step 0 of {args.steps}", flush=True)
        print(f"data: {len(entries)} output(s), {sum(e.tokens for e in entries)} tokens; model: "
              f"{sum(p.numel() for p in model.parameters())} parameters on {device}, {args.threads} thread(s); "
              f"{comm.world} rank(s), global batch {args.global_batch_size} = micro batch {args.micro_batch_size} x "
              f"{comm.world} rank(s) x {accumulation(args, comm.world)} accumulation step(s)", flush=True)
        # The shape the report computes model FLOPs per token from (bcp_pipeline/report/throughput.py).
        print(f"model shape: layers {args.layers} hidden {args.hidden} heads {args.heads} seq_length "
              f"{args.seq_length} vocab {cfg['vocab_size']} global_batch {args.global_batch_size} world {comm.world} "
              f"device {device.type} precision {args.precision}", flush=True)
    start = state["step"]
    dataset = None
    if start < args.steps:  # a finished run (NeMo: max_steps reached) needs no data, and megatron's import is slow
        prefixes, weights = data_list.split_blend(cfg["data"])
        with comm.guard("building the dataset"):
            dataset = build_train_dataset(prefixes, weights, IdsTokenizer(cfg["vocab_size"], cfg["eod"]), cfg,
                                          args.steps * args.global_batch_size, run_dir / "index_cache", lead)
    stats = loop(args, comm, model, optimizer, dataset, state, cfg, ckpt_dir)
    return summarize(args, comm, cfg, state, model, start, stats)


def accumulation(args: argparse.Namespace, world: int) -> int:
    return args.global_batch_size // (world * args.micro_batch_size)


def restore(path: Path, cfg: dict, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
            lead: bool) -> dict:
    """Model, optimizer and RNG state from a checkpoint; returns {step, losses}."""
    payload = load_checkpoint(path, device)
    saved = payload["config"]
    # Checkpoints from before data parallelism ran one process whose micro batch was the whole step.
    saved.setdefault("global_batch_size", saved.get("micro_batch_size"))
    check_resumable(path, saved, cfg)
    if lead and saved.get("threads") != cfg["threads"]:
        print(f"note: the checkpoint ran with {saved.get('threads')} thread(s), this run with "
              f"{cfg['threads']}: the result may differ from an uninterrupted run in the last bits")
    if lead and saved.get("world_size", 1) != cfg["world_size"]:
        print(f"note: the checkpoint ran on {saved.get('world_size', 1)} rank(s), this run on {cfg['world_size']}: "
              "same samples per step, float sums in another order")
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    torch.set_rng_state(payload["rng"]["cpu"].cpu())
    if device.type == "cuda" and payload["rng"].get("cuda") is not None:
        torch.cuda.set_rng_state(payload["rng"]["cuda"].cpu())
    return {"step": int(payload["step"]), "losses": [float(x) for x in payload["losses"]]}


def checkpoint_payload(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, cfg: dict,
                       device: torch.device) -> dict:
    return {
        "format": CHECKPOINT_FORMAT, "step": state["step"],
        "consumed_samples": state["step"] * cfg["global_batch_size"],
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "config": cfg, "losses": state["losses"],
        "rng": {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if device.type == "cuda" else None},
    }


def train_step(comm: Comm, ddp: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer,
               micro_batches: list[dict[str, torch.Tensor]],
               timers: _profiling.PhaseTimers | None = None, precision: str = "fp32") -> tuple[float, float]:
    """One optimizer step over this rank's micro batches; returns (this rank's loss sum, the step's global token
    count): the step's loss is the sum over ranks divided by the count.

    Each micro batch's loss sum is divided by the step's global token count and multiplied by the world size
    (DDP averages gradients over ranks), so the summed gradients are those of the one-batch mean loss."""
    local_tokens = sum(float(b["loss_mask"].sum()) for b in micro_batches)
    global_tokens = max(comm.sum([local_tokens], "counting the step's tokens")[0], 1.0)
    timers = timers or _profiling.PhaseTimers(comm.device, enabled=False)
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for index, batch in enumerate(micro_batches):
        last = index == len(micro_batches) - 1
        # DDP all-reduces gradients on the last micro batch only; the others accumulate locally.
        sync = contextlib.nullcontext() if last or ddp is model else ddp.no_sync()
        with sync, comm.guard("the gradient all-reduce"):
            with timers.time("forward-compute"), autocast(comm.device, precision):
                summed = masked_loss_sum(ddp(batch["tokens"]), batch["labels"], batch["loss_mask"])
            # With DDP the last micro batch's backward also all-reduces the gradients (overlapped).
            with timers.time("backward-compute"):
                (summed * comm.world / global_tokens).backward()
        loss_sum += float(summed.detach())
    with timers.time("optimizer"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return loss_sum, global_tokens


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The forward's precision: "bf16-mixed" (NeMo's name) runs matrix products in bfloat16 with fp32 weights,
    optimizer state and loss (masked_loss_sum upcasts the logits), as NeMo trains on A100/H100; "fp32" is plain."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def loop(args: argparse.Namespace, comm: Comm, model: nn.Module, optimizer: torch.optim.Optimizer, dataset: Any,
         state: dict, cfg: dict, ckpt_dir: Path) -> dict:
    """The training steps from state['step'] to args.steps, with logging, checkpoints and a clean stop."""
    device, lead = comm.device, comm.rank == 0
    stop = StopFlag()
    progress = _common.Progress(args.steps, comm.rank, unit="steps")
    if state["step"] and lead:
        progress.advance(state["step"])
    ddp = model
    if comm.world > 1:
        from torch.nn.parallel import DistributedDataParallel  # pylint: disable=import-outside-toplevel

        with comm.guard("wrapping the model in DDP"):  # DDP broadcasts rank 0's weights: a collective
            ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    model.train()
    window = _profiling.TorchProfilerWindow(args.profile_steps if comm.rank in args.profile_ranks else None,
                                      args.results / args.run_name / "profile", comm.rank, device)
    timers = _profiling.PhaseTimers(device, enabled=args.timers and lead)
    began, first = time.monotonic(), state["step"]
    while state["step"] < args.steps:
        step = state["step"]
        window.before(step + 1)
        step_began = time.monotonic()
        lr = lr_at(step, args.steps, args.lr, args.warmup_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        micro_batches = get_micro_batches(dataset, sample_range(step, args.global_batch_size, comm.rank, comm.world),
                                          args.micro_batch_size, device)
        with window.step(step + 1):
            loss_sum, tokens = train_step(comm, ddp, model, optimizer, micro_batches, timers, args.precision)
        # One all-reduce for the log and the stop: a signal may reach some ranks only, or at different steps,
        # and all must stop after the same one.
        loss_sum, stops = comm.sum([loss_sum, float(stop.signal is not None)], "summing the loss")
        loss, stopping = loss_sum / tokens, stops > 0
        state["step"] = step + 1
        state["losses"].append(loss)
        now = time.monotonic()
        rate = (state["step"] - first) / max(now - began, 1e-9)
        window.after(state["step"])
        if lead and (state["step"] % args.log_every == 0 or state["step"] == args.steps):
            # The step's own wall time last: the report's step time and tokens/s come from it.
            print(f"step {state['step']}/{args.steps} loss {loss:.4f} lr {lr:.3e} {rate:.2f} steps/s "
                  f"{now - step_began:.4f} s/step", flush=True)
            if (block := timers.report()) is not None:
                print(block, flush=True)
        if lead:
            progress.advance()
        done = state["step"] == args.steps
        if lead and args.checkpoints and (done or state["step"] % args.checkpoint_every == 0 or stopping):
            path = save_checkpoint(ckpt_dir, state["step"], checkpoint_payload(model, optimizer, state, cfg, device),
                                   args.keep_checkpoints)
            print(f"checkpoint saved: {path}", flush=True)
        if stopping and not done:
            window.finish()  # a window cut short by the stop still writes what it recorded
            comm.barrier("waiting for the checkpoint")  # no rank reports the stop before the checkpoint exists
            raise _common.StageError(f"stopped by signal {stop.signal or 'on another rank'} at step {state['step']} "
                                     f"of {args.steps} (checkpoint saved); rerun with --run-name {args.run_name} "
                                     "to continue")
    window.finish()  # a window past the last step ends with the training
    return {"steps_this_run": state["step"] - first, "seconds": time.monotonic() - began}


def summarize(args: argparse.Namespace, comm: Comm, cfg: dict, state: dict, model: nn.Module, start: int,
              stats: dict) -> dict:
    losses = state["losses"]
    rate = stats["steps_this_run"] / stats["seconds"] if stats["steps_this_run"] else 0.0
    return {
        "run_name": args.run_name, "steps": state["step"], "target_steps": args.steps, "resumed_from_step": start,
        "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
        "losses": losses, "tokens_seen": state["step"] * cfg["global_batch_size"] * cfg["seq_length"],
        "consumed_samples": state["step"] * cfg["global_batch_size"], "weights_sha256": weights_digest(model),
        "device": str(comm.device), "threads": cfg["threads"], "steps_per_s_this_run": round(rate, 3),
        "world_size": comm.world, "global_batch_size": cfg["global_batch_size"],
        "micro_batch_size": cfg["micro_batch_size"], "gradient_accumulation": accumulation(args, comm.world),
        "checkpoint": str(latest_checkpoint(args.results / args.run_name / "checkpoints")),
        "data_prefix": cfg["data"], "config": {k: v for k, v in cfg.items() if k not in ("data", "data_names")},
    }


# ---------------------------------------------------------------- CLI

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, type=Path, help="preprocess output: .bin/.idx + manifests")
    parser.add_argument("--results", required=True, type=Path, help="results folder; the run lives in RESULTS/NAME")
    parser.add_argument("--run-name", default="smoke", help="same name -> continue from its last checkpoint")
    parser.add_argument("--steps", type=_common.positive_int, default=60)
    parser.add_argument("--checkpoint-every", type=_common.positive_int, default=20)
    parser.add_argument("--keep-checkpoints", type=_common.positive_int, default=3)
    parser.add_argument("--seq-length", type=_common.positive_int, default=128)
    parser.add_argument("--global-batch-size", type=_common.positive_int, default=4,
                        help="samples per optimizer step over all ranks (fixed for the run)")
    parser.add_argument("--micro-batch-size", type=_common.positive_int, default=None,
                        help="samples per forward on each rank (default: the rank's whole share of the step; "
                             "smaller means gradient accumulation)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup-steps", type=int, default=None, help="default: steps // 10")
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--layers", type=_common.positive_int, default=2)
    parser.add_argument("--hidden", type=_common.positive_int, default=128)
    parser.add_argument("--heads", type=_common.positive_int, default=4)
    parser.add_argument("--split", default="100,0,0", help="megatron train,valid,test split (no validation here)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--precision", choices=("fp32", "bf16-mixed"), default="fp32",
                        help="bf16-mixed: the forward in bfloat16 autocast, as NeMo trains on GPUs (default: fp32, "
                             "bit-exact resume on CPU)")
    parser.add_argument("--threads", type=_common.positive_int, default=None,
                        help="torch CPU threads (default: this node's CPUs / LOCAL_WORLD_SIZE, at most 8); keep it "
                             "equal across a resume for bit-identical results")
    parser.add_argument("--collective-timeout", type=float, default=DEFAULT_COLLECTIVE_TIMEOUT,
                        help="seconds a rank waits for the others in a collective (rendezvous included) before it "
                             "fails the job (default: %(default)s)")
    parser.add_argument("--log-every", type=_common.positive_int, default=1)
    parser.add_argument("--profile-steps", metavar="A:B", default=None,
                        help="record steps A through B with torch.profiler: a Chrome trace and a table of the top "
                             "operators in RESULTS/NAME/profile/")
    parser.add_argument("--profile-ranks", default="0", help="comma-separated ranks that profile (default: 0)")
    parser.add_argument("--timers", action="store_true",
                        help="print each logged step's forward, backward and optimizer times (Megatron's layout)")
    parser.add_argument("--no-checkpoints", dest="checkpoints", action="store_false",
                        help="save no checkpoint (a profile run: it must not touch a real run's checkpoints)")
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
    try:
        rdzv = _common.rendezvous()
        check_batch_split(args, rdzv.world_size)
        comm = Comm(rdzv, pick_device(args.device, rdzv.local_rank), args.collective_timeout)
        if comm.world > 1:
            print(f"rank {comm.rank} of {comm.world}: met at {rdzv.master_addr}:{rdzv.master_port} "
                  f"({torch.distributed.get_backend()}, {comm.device}); rank 0 logs the steps", flush=True)
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
        print(f"done: {summary['steps']} steps, loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}, "
              f"{summary['tokens_seen']} tokens, {summary['steps_per_s_this_run']} steps/s", flush=True)
        _common.emit("summary", {"text": f"loss {summary['first_loss']:.2f} -> {summary['last_loss']:.2f} over "
                                         f"{summary['steps']} steps"})
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
