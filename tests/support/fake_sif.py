"""FAKE SIF images for the Apptainer stand-in (tests/fakes/apptainer_bin/apptainer): NOT images Apptainer could run.

A fake image has the real SIF global header (the fields the stand-in checks, laid out as sylabs/apptainer's
`pkg/sif/sif.go` defines `header`: launch script [32]byte, magic [10]byte "SIF_MAGIC", version [3]byte "01",
arch [3]byte ("02" amd64), ID [16]byte, then eight little-endian int64s: Ctime, Mtime, Dfree, Dtotal, Descroff,
Descrlen, Dataoff, Datalen), no descriptors, and, where a real image has its squashfs root file system, a JSON
payload at Dataoff naming what the stand-in plays as the image's contents (the stand-in runs programs of this
machine, so the "image" is a list of this machine's paths, each read-only in the container) and the image's own
environment (what a real image keeps in /.singularity.d/env, e.g. a Docker image's ENV PATH=...).
"""

from __future__ import annotations

import json
import platform
import struct
import uuid
from pathlib import Path

LAUNCH = b"#!/usr/bin/env run-singularity\n"  # sif.go hdrLaunch, in a 32-byte field
MAGIC = b"SIF_MAGIC"  # sif.go hdrMagic, in a 10-byte field
VERSION = b"01"  # sif.go CurrentVersion (version01), "%02d", in a 3-byte field
ARCH = {"x86_64": b"02", "aarch64": b"04"}  # sif.go HdrArchAMD64, HdrArchARM64, in a 3-byte field
DESCRIPTORS_OFFSET = 4096  # sif.go DescrStartOffset
DATA_OFFSET = 32768  # sif.go DataStartOffset
DESCRIPTORS_TOTAL = 48  # sif.go DescrNumEntries
PAYLOAD_KEY = "bcp_pipeline_fake_image"  # marks the JSON as this fake's, not any real SIF object


def header(*, data_size: int, arch: bytes | None = None, magic: bytes = MAGIC, version: bytes = VERSION) -> bytes:
    """The 128-byte SIF global header of an image with no descriptors and `data_size` bytes of data."""
    arch = arch if arch is not None else ARCH.get(platform.machine(), b"00")
    return (
        LAUNCH.ljust(32, b"\0")
        + magic.ljust(10, b"\0")[:10]
        + version.ljust(3, b"\0")
        + arch.ljust(3, b"\0")
        + uuid.uuid4().bytes
        + struct.pack(
            "<8q",
            1_700_000_000,
            1_700_000_000,
            DESCRIPTORS_TOTAL,
            DESCRIPTORS_TOTAL,
            DESCRIPTORS_OFFSET,
            0,
            DATA_OFFSET,
            data_size,
        )
    )


def write_fake_sif(
    path: Path,
    *,
    contents: list[str] = (),
    env: dict[str, str] | None = None,
    arch: bytes | None = None,
    magic: bytes = MAGIC,
) -> Path:
    """A fake .sif at `path`: a valid SIF header; `contents` (this machine's paths the stand-in plays as the image's
    files, read-only in the container) and `env` (the image's own environment) as the fake's payload."""
    payload = json.dumps({PAYLOAD_KEY: {"contents": [str(p) for p in contents], "env": env or {}}}).encode()
    head = header(data_size=len(payload), arch=arch, magic=magic)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head.ljust(DATA_OFFSET, b"\0") + payload)
    return path
