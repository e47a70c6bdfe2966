"""The GPT-2 tokenization the stage programs' output is checked against: HF `tokenizers`' byte-level BPE on the
real vocab/merges (independent of the engines the stages use: gigatoken, tiktoken), megatron-core's own reader of
.bin/.idx, and the .bin/.idx that Megatron's preprocess_data.py writes (megatron-core's own writer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
from support.stage_fixtures import gpt2_vocab_merges
from tokenizers import Tokenizer, models, pre_tokenizers

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
# Texts where a BPE engine could part from GPT-2's (its split pattern, its caches, the stage's cutting of long
# texts): literal special tokens, long runs of whitespace and digits, whitespace that Python's \s and Unicode's
# White_Space disagree on (\x1c-\x1f), contractions, emoji (with joiners and skin tones), CJK, combining marks.
ADVERSARIAL_TEXTS = [
    "<|endoftext|>",
    "<|endoftext|><|endoftext|>x<|startoftext|> <|endoftext|>\n",
    "a" + " " * 5000 + "b",
    "\n" * 3000 + "end",
    "\t \n\r\n" * 700 + "tail   ",
    "x \x1c y \x1d\x1e\x1f z\u3000\u00a0w\u2028v\u0085u \u200b t",
    "1234567890" * 400 + " 3.14159" * 300,
    "it's 'll've're'd 'S 'LL 'M don't''s " * 50,
    "😀👍🏽👨\u200d👩\u200d👧\u200d👦 🇯🇵" * 300,
    "東京都の天気は晴れ。明日は雨でしょう。" * 300 + " 한국어 텍스트 " * 100,
    "e\u0301 n\u0303 a\u030a" * 500,
    "word " * 4000 + "x" * 6000 + " " + "y," * 3000,
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


def megatron_preprocess_data(texts: list[str], prefix: Path) -> None:
    """What Megatron's tools/preprocess_data.py writes for these documents with `--append-eod` (no sentence
    splitting, GPT-2 BPE): each document's ids and the EOD as one sequence, through megatron-core's own
    IndexedDatasetBuilder, in the dtype Megatron picks for 50,257 ids (uint16). The ids are the reference
    tokenizer's: HF `tokenizers`' byte-level BPE, which gave Megatron's GPT2BPETokenizer's ids on 10 MB of text
    (independent of both stage engines). Texts without tokens are left out: Megatron would add a document of no
    sequences for one, where the stage adds nothing."""
    tokenizer = reference_tokenizer()
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for text in texts:
        ids = tokenizer.encode(text).ids
        if ids:
            builder.add_document(ids + [EOD], [len(ids) + 1])
    builder.finalize(f"{prefix}.idx")
