"""Preprocess manifests made up for tests of what reads them (the data list, NeMo's data prefix, estimates): a
manifest as tokenize-preprocess writes it, with .bin/.idx of the sizes it promises (their contents irrelevant)."""

from __future__ import annotations

import json
from pathlib import Path

TOKENIZER = {"kind": "gpt2-bpe", "vocab_size": 50257, "eod": 50256}


def fabricate(
    folder: Path, name: str, tokens: int, documents: int = 10, with_files: bool = True, **overrides: object
) -> Path:
    """A manifest as preprocess writes it, with .bin/.idx of the sizes it promises (contents irrelevant here)."""
    folder.mkdir(parents=True, exist_ok=True)
    bin_bytes, idx_bytes = tokens * 2, 34 + 12 * documents + 8 * (documents + 1)
    if with_files:
        (folder / f"{name}.bin").write_bytes(b"\0" * bin_bytes)
        (folder / f"{name}.idx").write_bytes(b"\0" * idx_bytes)
    manifest = {
        "prefix": name,
        "documents": documents,
        "tokens": tokens,
        "bin_bytes": bin_bytes,
        "idx_bytes": idx_bytes,
        "sha256_bin": "0" * 64,
        "sha256_idx": "0" * 64,
        "sources": [f"{name}.jsonl"],
        "skipped_lines": 0,
        "tokenizer": TOKENIZER,
        "dtype": "uint16",
        **overrides,
    }
    path = folder / f"{name}.manifest.json"
    path.write_text(json.dumps(manifest))
    return path


def chunk_name(i: int) -> str:
    return f"train_chunk_{i}.jsonl_text_document"
