"""What removing a run takes away: its state folder and, where the workspace is a folder on this machine, the
outputs named after it (its checkpoints and results, its job scripts). Outputs shared between runs (the prepared
data) carry no run id and are never touched. Listing reads only; the CLI deletes, after a dry run if asked."""

from __future__ import annotations

import shutil
from pathlib import Path

SEARCH_DEPTH = 4  # results/<run-name>, .bcp-pipeline/jobs/<pipeline>-<run>: a run's names sit this shallow


def run_outputs(workspace: Path, run_id: str, depth: int = SEARCH_DEPTH) -> list[Path]:
    """The files and folders under `workspace` whose name holds `run_id` (a run id is unique: a timestamp and a
    random tail), shallowest first; nothing inside one already found, no link followed."""
    found: list[Path] = []
    level = [workspace]
    for _ in range(depth):
        below: list[Path] = []
        for folder in level:
            try:
                entries = sorted(folder.iterdir())
            except OSError:
                continue
            for entry in entries:
                if run_id in entry.name:
                    found.append(entry)
                elif entry.is_dir() and not entry.is_symlink():
                    below.append(entry)
        level = below
    return found


def size_of(path: Path) -> int:
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def remove_paths(paths: list[Path]) -> None:
    """Each path, a folder with all it holds (a link itself, never its target)."""
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
