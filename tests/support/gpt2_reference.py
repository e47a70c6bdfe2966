"""The GPT-2 tokenization the stage programs' output is checked against: HF `tokenizers`' byte-level BPE on the
real vocab/merges (independent of the tiktoken the stages use), and megatron-core's own reader of .bin/.idx."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from megatron.core.datasets.indexed_dataset import IndexedDataset
from tokenizers import Tokenizer, models, pre_tokenizers

from support.stage_fixtures import gpt2_vocab_merges

VOCAB, MERGES = gpt2_vocab_merges()
GPT2 = ["--vocab", str(VOCAB), "--merges", str(MERGES)]
EOD = 50256
SPECIAL_TEXTS = [
    "Hello world",
    "a <|endoftext|> b, and <|endoftext|>",  # ordinary text inside a document, as in Megatron
    "  leading spaces\n\n\ttabs   and trailing   ",
    "Zürich 東京 😀 naïve façade — “quoted” ½ €200",
    "it's they're we'll I'M you'VE 12345678 3.14159 x=y+1;",
    "\n",
    " ",
]


def reference_tokenizer() -> Tokenizer:
    """GPT-2 BPE in HF `tokenizers` (byte-level BPE, no prefix space): independent of tiktoken."""
    tokenizer = Tokenizer(models.BPE.from_file(str(VOCAB), str(MERGES)))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tokenizer


def read_dataset(prefix: Path) -> list[list[int]]:
    """Every sequence through megatron-core's own reader, after checking its index invariants."""
    dataset = IndexedDataset(str(prefix))
    assert dataset.index.dtype == np.uint16
    assert list(dataset.document_indices) == list(range(len(dataset) + 1))
    sequences = [dataset[i].tolist() for i in range(len(dataset))]
    assert [len(s) for s in sequences] == dataset.sequence_lengths.tolist()
    return sequences
