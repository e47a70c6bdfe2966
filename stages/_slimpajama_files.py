"""SlimPajama's built-in file list: which `SPLIT/chunkC/NAME_I.jsonl.zst` files exist, and their flat local names.

The real per-chunk counts of the train split are built in (the guide's 6,000-per-chunk loop asks for files that do
not exist); the other splits need an explicit count per chunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_BASE_URL = "https://huggingface.co/datasets/cerebras/SlimPajama-627B/resolve/main"
# Files in train/chunk1..chunk10 (59,166 in all); indices run from 0.
TRAIN_FILES_PER_CHUNK = (5912, 5911, 5919, 5917, 5933, 5915, 5906, 5921, 5920, 5912)
SPLIT_CHUNKS = {"train": 10, "validation": 5, "test": 5}


@dataclass(frozen=True)
class Item:
    """One shard: where it lives upstream and the flat name it gets locally."""

    split: str
    chunk: int
    index: int

    @property
    def stem(self) -> str:
        return "example_train" if self.split == "train" else "example_holdout"

    @property
    def name(self) -> str:
        return f"{self.stem}_chunk{self.chunk}_{self.index}.jsonl.zst"

    def url(self, base_url: str) -> str:
        return f"{base_url.rstrip('/')}/{self.split}/chunk{self.chunk}/{self.stem}_{self.index}.jsonl.zst"


def parse_chunks(spec: str, highest: int) -> list[int]:
    """`1-10`, `1,3,5` or a mix (`1-3,7`) -> sorted distinct chunk numbers in 1..highest."""
    chunks: set[int] = set()
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match:
            raise ValueError(f"{part!r} is not a chunk number or range like 1-10")
        low, high = int(match[1]), int(match[2] or match[1])
        if low > high or low < 1 or high > highest:
            raise ValueError(f"{part.strip()!r} is outside the chunks 1..{highest}")
        chunks.update(range(low, high + 1))
    return sorted(chunks)


def expected_items(split: str, chunks: list[int], files_per_chunk: int | None, max_files: int | None) -> list[Item]:
    """Every file the whole job fetches, sorted by output name (the order shards are cut from)."""
    items: list[Item] = []
    for chunk in chunks:
        real = TRAIN_FILES_PER_CHUNK[chunk - 1] if split == "train" else None
        count = real if files_per_chunk is None else min(files_per_chunk, real or files_per_chunk)
        items.extend(Item(split, chunk, index) for index in range(count))
    if max_files is not None:
        items = items[:max_files]  # the first N in chunk/index order, not name order (0, 1, 2 rather than 0, 1, 10)
    return sorted(items, key=lambda item: item.name)
