"""Where the writer lock of a workspace that is no folder here lives (a BCP workspace, a Kubernetes claim)."""

from __future__ import annotations

import os
import re
from pathlib import Path


def user_writer_lock(service: str, workspace: str) -> Path:
    """The writer lock of a workspace that is no folder here (a BCP workspace, a Kubernetes volume claim): in this
    user's state folder ($XDG_STATE_HOME, else ~/.local/state), keyed by the service (an org, a cluster and
    namespace) and the workspace's name, so every orchestrator on this machine sees it, whatever its config file or
    --state-dir."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "bcp-pipeline" / "workspace-locks" / safe_file_name(service) / f"{safe_file_name(workspace)}.lock"


def safe_file_name(name: str) -> str:
    """A name as one path component: characters other than letters, digits, `-`, `_`, `.` become `_`."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    return cleaned if cleaned.strip(".") else "_"
