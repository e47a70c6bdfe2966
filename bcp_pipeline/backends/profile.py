"""What `bcp-pipeline check` found about one service, kept in the state folder and read back by the backends.

`STATE/checks/<key>.json`: `<org>-<ace>` on BCP, `slurm-<cluster>` on Slurm, `local-<host>` locally. The `check`
wing writes it; a backend reads only its `facts`, a flat mapping of what it may adapt to (the ACE's termination
grace, whether `bcprun` exists in a one-replica job...). Here, below the backends, so that they can read it
without importing the wing that makes it. No profile: the backend keeps its safe defaults.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bcp_pipeline.atomic import atomic_write_json
from bcp_pipeline.errors import StateError

CHECKS_FOLDER = "checks"
PROFILE_VERSION = 1
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def profile_key(*parts: str) -> str:
    """`org-ace`, `slurm-cluster`, `local-host`: each part made safe for a file name (no `/`, no spaces)."""
    return "-".join(_UNSAFE.sub("_", part).strip("_") or "_" for part in parts)


def profile_path(state_root: Path, key: str) -> Path:
    return state_root / CHECKS_FOLDER / f"{key}.json"


def save_profile(state_root: Path, key: str, payload: dict[str, Any]) -> Path:
    """Atomically (a reader never sees half a profile)."""
    path = profile_path(state_root, key)
    atomic_write_json(path, {"version": PROFILE_VERSION, **payload})
    return path


def load_profile(state_root: Path, key: str) -> dict[str, Any] | None:
    """The saved profile, None where `check` has not run. A corrupt one is an error, never silently ignored."""
    path = profile_path(state_root, key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StateError(f"{path}: unreadable check profile ({exc}); run `bcp-pipeline check` again") from None
    if not isinstance(data, dict) or data.get("version") != PROFILE_VERSION or not isinstance(data.get("facts"), dict):
        raise StateError(f"{path}: not a check profile of version {PROFILE_VERSION}; run `bcp-pipeline check` again")
    return data
