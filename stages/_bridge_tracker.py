"""Megatron-Bridge's record of its last complete save, read as Bridge's own loader reads it, without torch (the
verification job's image need not have it).

Rank 0 finishes a save (megatron-bridge 0.6.x training/checkpointing.py, the save's finalize step) by writing
`iter_NNNNNNN/train_state.pt` (torch.save of TrainState.state_dict(): `step`, `consumed_train_samples`, ... as
0-d tensors), copying it to `latest_train_state.pt` beside the iteration folders (shutil.copy: not atomic), then
writing the Megatron-LM tracker `latest_checkpointed_iteration.txt` (the step, or `release`). On resume Bridge reads
`latest_train_state.pt` first and the .txt only where the .pt is missing; a .pt it cannot read stops the resume
(RuntimeError). So: the .pt first, the .txt where there is no .pt, and a torn .pt is said, not taken as step 0.

A torch.save file is a zip archive: `<name>/data.pkl` (the pickled object; each tensor a call to
torch._utils._rebuild_tensor_v2 over a storage named by a persistent id) and `<name>/data/<key>` (each storage's
raw bytes, in `<name>/byteorder`'s order). Only 0-d tensors of the plain dtypes are decoded here; any other class in
the pickle is refused, as torch.load(weights_only=True) refuses what it does not know.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import zipfile
from dataclasses import dataclass

TRAIN_STATE_TRACKER = "latest_train_state.pt"  # Bridge's tracker, read first on resume
TRAIN_STATE_FILE = "train_state.pt"  # each iteration folder's own copy, written before the tracker
LEGACY_TRACKER = "latest_checkpointed_iteration.txt"  # Megatron-LM's, written last
STORAGE_FORMATS = {
    "LongStorage": "q",
    "IntStorage": "i",
    "ShortStorage": "h",
    "CharStorage": "b",
    "ByteStorage": "B",
    "BoolStorage": "?",
    "DoubleStorage": "d",
    "FloatStorage": "f",
}


class UnreadableTrainState(ValueError):
    """A train_state file that is not a whole torch.save'd dict with a `step` (torn, empty, something else)."""


@dataclass(frozen=True)
class TrackedStep:
    """The step Bridge would resume from, the file that says so, and what was wrong on the way (or "")."""

    step: int | None  # None: no tracker at all (or only a `release` one)
    source: str
    problem: str = ""


def _storage_class(name: str) -> tuple[str, str]:
    if name not in STORAGE_FORMATS:
        raise pickle.UnpicklingError(f"torch.{name}: not a plain tensor storage")
    return ("storage-type", name)


def _rebuild_tensor(storage, offset, size, stride, *rest):
    (kind, data, little) = storage
    if tuple(size) != ():
        raise pickle.UnpicklingError(f"a tensor of shape {tuple(size)}: only 0-d tensors are read here")
    code = STORAGE_FORMATS[kind]
    width = struct.calcsize(code)
    return struct.unpack_from(("<" if little else ">") + code, data, offset * width)[0]


class _TrainStateUnpickler(pickle.Unpickler):
    def __init__(self, file, archive: zipfile.ZipFile, prefix: str, little: bool):
        super().__init__(file)
        self.archive, self.prefix, self.little = archive, prefix, little

    def find_class(self, module: str, name: str):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch":  # torch.LongStorage, ...: only ever named by a storage's persistent id
            return _storage_class(name)
        raise pickle.UnpicklingError(f"{module}.{name}: not in a train state file")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"persistent id {pid!r}: not a storage")
        storage_type, key = pid[1], pid[2]
        name = storage_type[1] if isinstance(storage_type, tuple) else getattr(storage_type, "__name__", "")
        return (name, self.archive.read(f"{self.prefix}data/{key}"), self.little)


def read_train_state(path: str) -> dict:
    """The dict a train_state.pt holds, its 0-d tensors as Python numbers. UnreadableTrainState if it is not one."""
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("data.pkl")]
            if len(pickles) != 1:
                raise UnreadableTrainState(f"{path}: {len(pickles)} data.pkl entries, not one")
            prefix = pickles[0][: -len("data.pkl")]
            order = (
                archive.read(f"{prefix}byteorder").decode().strip()
                if f"{prefix}byteorder" in archive.namelist()
                else "little"
            )
            unpickler = _TrainStateUnpickler(io.BytesIO(archive.read(pickles[0])), archive, prefix, order == "little")
            state = unpickler.load()
    except UnreadableTrainState:
        raise
    except (
        OSError,
        zipfile.BadZipFile,
        KeyError,
        EOFError,
        pickle.UnpicklingError,
        struct.error,
        ValueError,
        TypeError,
        IndexError,
    ) as exc:
        raise UnreadableTrainState(f"{path}: {type(exc).__name__}: {exc}") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int) or isinstance(state["step"], bool):
        raise UnreadableTrainState(f"{path}: no integer `step` in it")
    return state


def legacy_step(folder: str) -> int | None:
    """The .txt tracker's step; None where there is none, or it says `release` (a converted checkpoint)."""
    path = os.path.join(folder, LEGACY_TRACKER)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        text = handle.read().strip()
    return int(text) if text.isdigit() else None


def tracked_step(folder: str) -> TrackedStep:
    """The step Bridge resumes `folder` from, in its loader's order: latest_train_state.pt, else the .txt."""
    tracker = os.path.join(folder, TRAIN_STATE_TRACKER)
    problem = ""
    if os.path.isfile(tracker):
        try:
            return TrackedStep(read_train_state(tracker)["step"], TRAIN_STATE_TRACKER)
        except UnreadableTrainState as exc:
            problem = (
                f"{TRAIN_STATE_TRACKER} is unreadable ({exc}); Bridge reads it first and would not resume "
                f"from it, so the step is {LEGACY_TRACKER}'s"
            )
    return TrackedStep(legacy_step(folder), LEGACY_TRACKER, problem)


def repair_torn_tracker(folder: str) -> str:
    """Before a resume (rank 0, before any rank reads it): a torn latest_train_state.pt, which would stop Bridge's
    resume, replaced by the copy in the iteration folder the .txt names (written whole before the tracker), or set
    aside where there is none (Bridge then resumes from the .txt). What was done, or "" where nothing was wrong."""
    tracked = tracked_step(folder)
    if not tracked.problem:
        return ""
    tracker = os.path.join(folder, TRAIN_STATE_TRACKER)
    if tracked.step is not None:
        copy = os.path.join(folder, f"iter_{tracked.step:07d}", TRAIN_STATE_FILE)
        try:
            whole = read_train_state(copy)["step"] == tracked.step
        except UnreadableTrainState:
            whole = False
        if whole:
            temporary = os.path.join(folder, f".{TRAIN_STATE_TRACKER}.tmp-{os.getpid()}")
            with open(copy, "rb") as source, open(temporary, "wb") as target:
                target.write(source.read())
                target.flush()
                os.fsync(target.fileno())
            os.replace(temporary, tracker)
            return f"{tracked.problem}: replaced it with {copy} (step {tracked.step})"
    aside = f"{tracker}.unreadable"
    os.replace(tracker, aside)
    return f"{tracked.problem}: moved it aside to {aside}, so that Bridge resumes from {LEGACY_TRACKER}"
