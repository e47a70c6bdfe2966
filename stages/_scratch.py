"""Where a stage program puts its temporary files: node-local scratch where the job has some, else the workspace.

A backend that gives a job node-local scratch (Grid Engine's `gridengine.node_scratch`: the job's `$TMPDIR` on the
node's own disk, removed when the job ends) names the folder in BCP_PIPELINE_SCRATCH. Temporary files that are no
output (preprocess's spilled document lengths, read back by the same process) go there, off the shared file
system; outputs never do: they are still written to a temporary name next to their final one in the workspace
and renamed into place (`_atomic_outputs`), as a rename cannot cross file systems.
"""

from __future__ import annotations

import os
from pathlib import Path

from _atomic_outputs import temp_path_for

SCRATCH_ENV = "BCP_PIPELINE_SCRATCH"


def scratch_dir() -> Path | None:
    """The job's node-local scratch folder, None where it has none (or the folder is gone)."""
    value = os.environ.get(SCRATCH_ENV, "")
    return Path(value) if value and Path(value).is_dir() else None


def scratch_path_for(path: Path) -> Path:
    """A temporary file's name for work on `path`: in the scratch folder where there is one, else hidden next to
    `path` (never matched by an output glob)."""
    folder = scratch_dir()
    return temp_path_for(folder / path.name if folder else path)
