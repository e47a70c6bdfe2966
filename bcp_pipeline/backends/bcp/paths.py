"""Where a BCP job finds things in the workspace: this version of stages/ (uploaded once per content hash) and the
${...} values of its command line (the workspace mount, the result folder, the code, the interpreter)."""

from __future__ import annotations

import fnmatch
import hashlib
from pathlib import Path

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.shared.command import placeholder_values
from bcp_pipeline.config.resources import BcpOptions, BcpResources

UPLOAD_EXCLUDES = ("*__pycache__*",)  # what of stages/ is never uploaded (nor hashed: code_hash)


def code_hash(stages_dir: Path) -> str:
    """Content hash of what is uploaded of stages/: the upload's destination, so each version is uploaded once.
    Every file the upload takes counts (in every folder, by its path), so a change to any of them, a private
    helper in a subfolder included, makes a new destination."""
    digest = hashlib.sha256()
    for path in uploaded_files(stages_dir):
        digest.update(path.relative_to(stages_dir).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def uploaded_files(stages_dir: Path) -> list[Path]:
    """The files of stages/ the upload takes: every one, in every folder, but those UPLOAD_EXCLUDES matches."""
    return sorted(
        path
        for path in stages_dir.rglob("*")
        if path.is_file()
        and not any(fnmatch.fnmatch(path.relative_to(stages_dir).as_posix(), pattern) for pattern in UPLOAD_EXCLUDES)
    )


def code_destination(options: BcpOptions, stages_dir: Path) -> str:
    """Folder inside the workspace that holds this version of stages/."""
    return f"{options.code_dir.strip('/')}/{code_hash(stages_dir)}"


def job_values(request: JobRequest, options: BcpOptions, stages_dir: Path) -> dict[str, str]:
    mount = request.pipeline.workspace.mount.rstrip("/")
    resources: BcpResources = request.resources("bcp")
    return placeholder_values(
        request,
        workspace=mount,
        results=resources.result,
        code=f"{mount}/{code_destination(options, stages_dir)}",
        python=options.python,
    )
