"""A held-out split for the evaluate tests, made the way the demo's tokenize-validation stage makes it: English-like
documents of their own seed, tokenized by the real preprocess stage into `validation_chunk_0.jsonl_text_document`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.smoke_pretrain import english_like_documents, preprocess


def make_heldout_split(folder: Path, documents: int = 40, split: str = "validation", seed: int = 99) -> Path:
    """SlimPajama's validation or test split: `{split}_chunk_0.jsonl_text_document` in folder/out."""
    (folder / "in").mkdir(parents=True)
    lines = [json.dumps({"text": text}) for text in english_like_documents(documents, seed=seed)]
    (folder / "in" / "example_holdout_chunk1_0.jsonl").write_text("\n".join(lines) + "\n")
    return preprocess(folder / "in", folder / "out", "--files-per-output", "1", "--output-stem", f"{split}_chunk")


@pytest.fixture(scope="module")
def heldout_split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_heldout_split(tmp_path_factory.mktemp("heldout"))
