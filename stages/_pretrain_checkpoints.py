"""The smoke pretrain's checkpoints: `step=NNNNNN[-last].pt` files written atomically, pruned, and restored.

A file under its final name is always complete; the newest carries `-last`, and after a kill between renames the
highest step wins. A checkpoint holds the model, optimizer, RNG state, loss history and the run's config; a run is
resumed only with the settings that define it (RESUME_KEYS), never half-loaded.
"""

from __future__ import annotations

import re
from pathlib import Path

import _common
import torch
from torch import nn

CHECKPOINT_RE = re.compile(r"^step=(\d+)(-last)?\.pt$")
CHECKPOINT_FORMAT = 1
# What a resumed run must share with its checkpoint; anything else (lr, steps, logging) may change between runs.
# The data is compared by output names and weights, not paths, so a moved data folder can still be resumed.
# The micro batch and the world size may change: they split a step's samples, they do not choose them.
RESUME_KEYS = (
    "vocab_size",
    "layers",
    "hidden",
    "heads",
    "seq_length",
    "global_batch_size",
    "seed",
    "split",
    "data_names",
)


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
    diffs = [
        f"{key}: checkpoint {saved.get(key)!r}, now {wanted[key]!r}"
        for key in RESUME_KEYS
        if saved.get(key) != wanted[key]
    ]
    if diffs:
        raise _common.StageError(
            f"{path} cannot be continued with these settings ({'; '.join(diffs)}); "
            "use the same settings or another --run-name"
        )


def restore(
    path: Path, cfg: dict, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device, lead: bool
) -> dict:
    """Model, optimizer and RNG state from a checkpoint; returns {step, losses}."""
    payload = load_checkpoint(path, device)
    saved = payload["config"]
    # Checkpoints from before data parallelism ran one process whose micro batch was the whole step.
    saved.setdefault("global_batch_size", saved.get("micro_batch_size"))
    check_resumable(path, saved, cfg)
    if lead and saved.get("threads") != cfg["threads"]:
        print(
            f"note: the checkpoint ran with {saved.get('threads')} thread(s), this run with "
            f"{cfg['threads']}: the result may differ from an uninterrupted run in the last bits"
        )
    if lead and saved.get("world_size", 1) != cfg["world_size"]:
        print(
            f"note: the checkpoint ran on {saved.get('world_size', 1)} rank(s), this run on {cfg['world_size']}: "
            "same samples per step, float sums in another order"
        )
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    torch.set_rng_state(payload["rng"]["cpu"].cpu())
    if device.type == "cuda" and payload["rng"].get("cuda") is not None:
        torch.cuda.set_rng_state(payload["rng"]["cuda"].cpu())
    return {"step": int(payload["step"]), "losses": [float(x) for x in payload["losses"]]}


def checkpoint_payload(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, cfg: dict, device: torch.device
) -> dict:
    return {
        "format": CHECKPOINT_FORMAT,
        "step": state["step"],
        "consumed_samples": state["step"] * cfg["global_batch_size"],
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "config": cfg,
        "losses": state["losses"],
        "rng": {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if device.type == "cuda" else None},
    }
