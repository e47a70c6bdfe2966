"""stages/ into the Lepton storage, once per content hash: a small job of its own (NeMo-Run's LeptonExecutor moves
its code the same way, `move_data`: a busybox job unpacking a base64 tarball into the mounted storage), since the
storage is a file system of the node group, which no API call writes to.

The tarball travels in the job's environment, in pieces each below Linux's 128 KiB limit on one string of a
process's environment (MAX_ARG_STRLEN), never on its command line.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import io
import shlex
import tarfile
from pathlib import Path
from typing import Any

EXCLUDES = ("*__pycache__*",)
CHUNK = 64 * 1024  # characters of base64 an environment variable carries
CHUNK_ENV = "BCP_PIPELINE_CODE_"


def code_files(stages_dir: Path) -> list[Path]:
    return sorted(
        path
        for path in stages_dir.rglob("*")
        if path.is_file()
        and not any(fnmatch.fnmatch(path.relative_to(stages_dir).as_posix(), pattern) for pattern in EXCLUDES)
    )


def code_hash(stages_dir: Path) -> str:
    """Content hash of stages/ (every file, by its path): the folder it is copied to, so each version goes once."""
    digest = hashlib.sha256()
    for path in code_files(stages_dir):
        digest.update(path.relative_to(stages_dir).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def tarball(stages_dir: Path) -> bytes:
    """stages/ as a gzipped tar, its members' times and owners zeroed: the same bytes for the same files."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=9) as tar:
        for path in code_files(stages_dir):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(stages_dir).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    return buffer.getvalue()


def mover_script(destination: str, chunks: int) -> str:
    """Unpacks the pieces into DEST.tmp.$$ and renames it into place (a folder already there is the same code)."""
    dest = shlex.quote(destination)
    pieces = " ".join(f'"${CHUNK_ENV}{i}"' for i in range(chunks))
    return (
        f'[ -d {dest} ] && exit 0; tmp={dest}.tmp.$$; mkdir -p "$tmp" && '
        f'printf %s {pieces} | base64 -d | tar -xzf - -C "$tmp" && '
        f'{{ mv "$tmp" {dest} 2>/dev/null || {{ [ -d {dest} ] && rm -rf "$tmp"; }}; }}'
    )


def mover_job(
    name: str,
    stages_dir: Path,
    destination: str,
    *,
    image: str,
    shape: str,
    storage: str,
    storage_folder: str,
    mount: str,
    node_group: str | None,
    labels: dict[str, str],
) -> dict[str, Any]:
    """The LeptonJob that copies stages/ to `destination` (a path inside the job's mount of the storage)."""
    encoded = base64.b64encode(tarball(stages_dir)).decode()
    chunks = [encoded[i : i + CHUNK] for i in range(0, len(encoded), CHUNK)]
    spec: dict[str, Any] = {
        "resource_shape": shape,
        "container": {"image": image, "command": ["sh", "-c", mover_script(destination, len(chunks))]},
        "completions": 1,
        "parallelism": 1,
        "max_failure_retry": 0,
        "envs": [{"name": f"{CHUNK_ENV}{i}", "value": chunk} for i, chunk in enumerate(chunks)],
        "mounts": [{"path": storage_folder, "from": storage, "mount_path": mount}],
        "ttl_seconds_after_finished": 3600,
    }
    if node_group:
        spec["affinity"] = {"allowed_dedicated_node_groups": [node_group]}
    return {"metadata": {"id": name, "name": name, "labels": labels}, "spec": spec}
