"""A Hugging Face model folder as the export stage writes it: safetensors files, the GPT-2 tokenizer files, the
digest of the weights, and the record beside the folder that names where it came from.

Standard library only (the safetensors format is a little-endian u64 header length, a JSON header of
name -> dtype/shape/byte range, then the bytes), so the same digest is computed for a folder this project wrote and
for one Megatron-Bridge's AutoBridge wrote, in any environment.

Layout of an export (`--out EXPORT`): `EXPORT/hf/` the model folder (`from_pretrained(EXPORT/hf)`), and
`EXPORT/export.json`, written last: a folder without it is not (yet) an export.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

import _common

MODEL_DIR = "hf"
RECORD = "export.json"
RECORD_FORMAT = 1
EOT = "<|endoftext|>"  # GPT-2's one special token: beginning, end and unknown alike


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """Write `name -> (dtype, shape, raw little-endian bytes)` as one safetensors file, atomically."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format pads the header so that the data starts 8-byte aligned
    with _common.atomic_output(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for name in sorted(tensors):
            handle.write(tensors[name][2])


def read_header(path: Path) -> tuple[dict, int]:
    """A safetensors file's header and where its data starts."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(length)), 8 + length


def weights_digest(folder: Path) -> str:
    """sha256 over every tensor of the folder's safetensors files, by name, with its dtype and shape: the same for
    the same weights however they are sharded into files."""
    entries = []
    for path in sorted(folder.glob("*.safetensors")):
        header, start = read_header(path)
        entries += [(name, info, path, start) for name, info in header.items() if name != "__metadata__"]
    digest = hashlib.sha256()
    for name, info, path, start in sorted(entries, key=lambda e: e[0]):
        begin, end = info["data_offsets"]
        digest.update(f"{name}|{info['dtype']}|{info['shape']}|".encode())
        with open(path, "rb") as handle:
            handle.seek(start + begin)
            remaining = end - begin
            while remaining:
                chunk = handle.read(min(remaining, 1 << 24))
                if not chunk:
                    raise _common.StageError(f"{path}: tensor {name} is cut short (the file is truncated)")
                digest.update(chunk)
                remaining -= len(chunk)
    return digest.hexdigest()


def write_gpt2_tokenizer(folder: Path, bpe_dir: Path, max_length: int) -> None:
    """The tokenizer the data was tokenized with (GPT-2 BPE: vocab.json + merges.txt) and the two small files that
    make `AutoTokenizer.from_pretrained` build it (GPT2Tokenizer, <|endoftext|> as its special tokens)."""
    for name in ("vocab.json", "merges.txt"):
        source = bpe_dir / name
        if not source.is_file():
            raise _common.StageError(f"{source}: missing; the export ships the tokenizer the data was tokenized with")
        shutil.copyfile(source, folder / name)
    specials = {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}
    _common.atomic_write_json(
        folder / "tokenizer_config.json",
        {"tokenizer_class": "GPT2Tokenizer", "model_max_length": max_length, "add_prefix_space": False, **specials},
    )
    _common.atomic_write_json(folder / "special_tokens_map.json", specials)


def read_record(export_dir: Path) -> dict | None:
    """The export's record, or None where there is none (or an unreadable one: the export is then redone)."""
    try:
        record = json.loads((export_dir / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("format") == RECORD_FORMAT else None


def finished(export_dir: Path, step: int, source: str) -> dict | None:
    """The record of a complete export of exactly this checkpoint, its weights still what it says; else None."""
    record = read_record(export_dir)
    if not record or record.get("step") != step or record.get("source") != source:
        return None
    model = export_dir / MODEL_DIR
    return record if model.is_dir() and weights_digest(model) == record.get("weights_sha256") else None


def staging_dir(export_dir: Path) -> Path:
    """Where the next model folder is built before it replaces `hf/` (a leftover of a killed export is removed)."""
    staging = export_dir / f".{MODEL_DIR}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    return staging


def publish(export_dir: Path, staging: Path, record: dict) -> dict:
    """Move the staged folder into place and write the record last; returns the record with the digest."""
    (export_dir / RECORD).unlink(missing_ok=True)  # an old record must never describe the new folder
    model = export_dir / MODEL_DIR
    if model.exists():
        shutil.rmtree(model)
    os.replace(staging, model)
    _common.fsync_dir(export_dir)
    files = {p.name: p.stat().st_size for p in sorted(model.iterdir()) if p.is_file()}
    full = {
        "format": RECORD_FORMAT,
        **record,
        "model_dir": str(model),
        "weights_sha256": weights_digest(model),
        "files": files,
    }
    _common.atomic_write_json(export_dir / RECORD, full)
    return full
