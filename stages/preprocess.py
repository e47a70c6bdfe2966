#!/usr/bin/env python3
"""preprocess (tokenize-preprocess) stage: JSONL -> Megatron indexed dataset, sharded by rank, resumable.

    python3 preprocess.py --in DIR --out DIR --vocab vocab.json --merges merges.txt
                          [--tokenizer-json FILE [--eod-token TOKEN]] [--bpe-engine auto] [--json-key text]
                          [--files-per-output N] [--workers P]

Each `IN/train_chunk_{i}.jsonl` (concat's outputs) becomes `OUT/train_chunk_{i}.jsonl_text_document.bin/.idx`
(the NeMo launcher's names) plus `.manifest.json`, written last: documents, tokens, bytes, sha256 of both files,
sources, skipped lines, tokenizer. With `--files-per-output N` the inputs are instead the sorted `IN/*.jsonl.zst`,
`*.jsonl.gz`, `*.parquet` and `*.jsonl` (the download manifest's list when there is one) in groups of N, exactly
concat's groups, so a pipeline can go straight from download to tokens without writing the text twice. A parquet
input is read one row group at a time, and only its `--json-key` column (doc_sources.py).

Every document becomes its token ids followed by the EOD id (50256 for GPT-2), one sequence per document, in input
order, like Megatron's preprocess_data.py with --append-eod; a document whose text has no tokens (empty text) gets
no sequence either, as in Megatron, and is counted as `empty_documents`. Lines that are not JSON objects with a
string `--json-key` are skipped and reported as `SOURCE:LINE: reason` (the first few per output; all are counted
in `skipped_lines`); an output without a single document fails (every line skipped: a wrong --json-key?).

Outputs are sharded across ranks; within a rank, `--workers` processes tokenize ~1 MiB batches of whole lines
(reading plain inputs themselves; compressed and parquet inputs are read by the main process) while it writes
the results in input order. A bounded window of batches is in flight and document lengths are spilled to a scratch
file, so memory does not grow with the input.

On a streamed edge from the download (`needs: [{stage: download, stream: true}]`), the stage starts while the
download runs: each rank takes, of its outputs, the first whose inputs have all landed (_streamed_inputs.py), so
the outputs are the same bytes as when the download had finished first.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import _common
import _one_blas_thread  # noqa: F401  (before numpy loads: its docstring says why; a test checks the order)
from _preprocess_batches import read_batches
from _scratch import scratch_path_for
from _streamed_inputs import Arrivals, stall_seconds, streamed_digests, wait_for_upstream
from _tokenize_workers import BatchResult, TokenizerPool, WorkerDied, init_worker, make_pool, ordered_results
from doc_sources import INPUT_SUFFIXES, input_suffix
from extract import DOWNLOAD_MANIFEST, download_manifest_names, visible_names
from megatron_index import HashingWriter, IndexedDatasetWriter
from tokenizers_gpt2 import BPE_ENGINES, Tokenizer, TokenizerError, TokenizerSpec, describe, token_dtype

STAGE = "preprocess"
JSONL_INPUT = re.compile(r"train_chunk_(\d+)\.jsonl")
PREFIX_TEMPLATE = "{stem}_{index}.jsonl_text_document"
DEFAULT_STEM = "train_chunk"  # the NeMo launcher's names; a held-out split's outputs take their own (--output-stem)
BATCH_BYTES = 1 << 20  # text per task: ~60 ms of tokenizing, so pickling and scheduling are noise
MAX_REPORTED_LINES = 20  # bad lines printed per output; the rest are only counted


@dataclass(frozen=True)
class OutputItem:
    """One output prefix and the input files it is made of, in order."""

    index: int
    sources: tuple[str, ...]
    stem: str = DEFAULT_STEM

    @property
    def prefix(self) -> str:
        return PREFIX_TEMPLATE.format(stem=self.stem, index=self.index)


def list_items(in_dir: Path, files_per_output: int | None, stem: str = DEFAULT_STEM) -> list[OutputItem]:
    """Every output of the stage (all ranks), in a fixed order."""
    if files_per_output is None:
        indexed = sorted(
            (int(m.group(1)), m.group(0))
            for name in visible_names(in_dir, ".jsonl")
            if (m := JSONL_INPUT.fullmatch(name))
        )
        return [OutputItem(index, (name,)) for index, name in indexed]
    names = download_manifest_names(in_dir)
    if names is None:
        names = [name for suffix in INPUT_SUFFIXES for name in visible_names(in_dir, suffix)]
    # Sorted by the name without its format suffix, as concat sorts extract's outputs (0, 1, 10 in name order).
    names = sorted({n for n in names if input_suffix(n)}, key=lambda n: n[: -len(input_suffix(n))])
    return [
        OutputItem(i, tuple(names[start : start + files_per_output]), stem)
        for i, start in enumerate(range(0, len(names), files_per_output))
    ]


@dataclass
class Context:
    """What every output of the rank shares."""

    in_dir: Path
    out_dir: Path
    tokenizer: Tokenizer
    pool: TokenizerPool | None  # None: tokenize in this process
    window: int
    json_key: str = "text"


@dataclass
class Tally:
    """Counts over one output; turns batch-relative line indices into file line numbers (results come in order)."""

    item: OutputItem
    documents: int = 0
    empty: int = 0
    skipped: int = 0
    source: int = 0
    lines_before: int = 0  # lines of `source` in the batches already counted

    def add(self, result: BatchResult) -> None:
        if result.source != self.source:
            self.source, self.lines_before = result.source, 0
        self.documents += result.documents
        self.empty += result.empty
        for offset, reason in result.bad:
            self.skipped += 1
            if self.skipped <= MAX_REPORTED_LINES:
                line = self.lines_before + offset + 1
                print(f"{STAGE}: {self.item.sources[self.source]}:{line}: {reason} (skipped)", file=sys.stderr)
        self.lines_before += result.lines


def output_paths(out_dir: Path, prefix: str) -> tuple[Path, Path, Path]:
    base = out_dir / prefix
    return base.with_name(prefix + ".bin"), base.with_name(prefix + ".idx"), base.with_name(prefix + ".manifest.json")


def is_complete(out_dir: Path, item: OutputItem) -> bool:
    """The manifest exists and the .bin/.idx beside it have the sizes it records."""
    bin_path, idx_path, manifest_path = output_paths(out_dir, item.prefix)
    try:
        manifest = json.loads(manifest_path.read_text())
        return bin_path.stat().st_size == manifest["bin_bytes"] and idx_path.stat().st_size == manifest["idx_bytes"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def build_output(item: OutputItem, ctx: Context) -> dict:
    """Tokenize `item` into .bin/.idx, then write its manifest last; returns the manifest."""
    bin_path, idx_path, manifest_path = output_paths(ctx.out_dir, item.prefix)
    manifest_path.unlink(missing_ok=True)  # a stale manifest must not vouch for the files being rewritten
    # Never an output (read back by this process): on node-local scratch where the job has some.
    spill_path = scratch_path_for(ctx.out_dir / f"{item.prefix}.lengths")
    tally = Tally(item)
    batches = read_batches([ctx.in_dir / name for name in item.sources], BATCH_BYTES, ctx.json_key)
    try:
        with open(spill_path, "w+b") as spill, _common.atomic_output(bin_path) as bin_file:
            bin_out = HashingWriter(bin_file)
            writer = IndexedDatasetWriter(bin_out, spill, token_dtype(ctx.tokenizer))
            for result in ordered_results(batches, ctx.pool, ctx.window):
                writer.add_batch(result.tokens, result.lengths)
                tally.add(result)
            if tally.documents == 0:  # nothing to train on: an upstream problem, not an output to publish
                raise _common.StageError(
                    f"{', '.join(item.sources)}: no usable documents: all {tally.skipped} "
                    f"lines were skipped (is --json-key right?) and {tally.empty} texts were "
                    "empty"
                )
            with _common.atomic_output(idx_path) as idx_file:
                idx_out = HashingWriter(idx_file)
                writer.write_index(idx_out)
    finally:
        spill_path.unlink(missing_ok=True)
    if tally.skipped > MAX_REPORTED_LINES:
        print(
            f"{STAGE}: {item.prefix}: {tally.skipped} lines skipped in all (first {MAX_REPORTED_LINES} shown)",
            file=sys.stderr,
        )
    manifest = {
        "prefix": item.prefix,
        "documents": writer.sequences,
        "tokens": writer.tokens,
        "bin_bytes": bin_out.bytes,
        "idx_bytes": idx_out.bytes,
        "sha256_bin": bin_out.sha256.hexdigest(),
        "sha256_idx": idx_out.sha256.hexdigest(),
        "sources": list(item.sources),
        "skipped_lines": tally.skipped,
        "empty_documents": tally.empty,
        "tokenizer": describe(ctx.tokenizer),
        "dtype": writer.dtype.name,
    }
    _common.atomic_write_json(manifest_path, manifest)
    return manifest


def run(args: argparse.Namespace, spec: TokenizerSpec, tokenizer: Tokenizer, rank: int, world: int) -> int:
    outputs = [p for suffix in (".bin", ".idx", ".manifest.json", ".lengths") for p in args.out_dir.glob(f"*{suffix}")]
    if _common.claim_or_refuse(args.out_dir, STAGE, outputs, rank):
        return 1
    digests = streamed_digests()  # a streamed edge: the upstream still runs (_streamed_inputs.py)
    stall = stall_seconds()
    if digests:
        wait_for_upstream(args.in_dir, args.in_dir / DOWNLOAD_MANIFEST, digests, STAGE, stall)
    items = list_items(args.in_dir, args.files_per_output, args.output_stem)
    if not items:
        wanted = "/".join(f"*{s}" for s in INPUT_SUFFIXES) if args.files_per_output else "train_chunk_{i}.jsonl"
        return _common.fail_with_items(STAGE, {str(args.in_dir): f"no {wanted} inputs"})
    mine = _common.shard(items, rank, world)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    own = [
        args.out_dir / f"{item.prefix}{suffix}"
        for item in mine
        for suffix in (".bin", ".idx", ".manifest.json", ".lengths")
    ]
    _common.remove_stale_temporaries_of(own)
    progress = _common.Progress(len(mine), rank, unit="outputs")
    ctx = Context(
        args.in_dir,
        args.out_dir,
        tokenizer,
        make_pool(args.workers, spec, args.json_key),
        window=2 * args.workers,
        json_key=args.json_key,
    )
    failures: dict[str, str] = {}
    manifests: list[dict] = []
    pending = [item for item in mine if not is_complete(args.out_dir, item)]
    skipped_complete = len(mine) - len(pending)
    progress.advance(skipped_complete)
    # On a streamed edge the inputs are still landing: take whichever output has all of its inputs first.
    arrivals = Arrivals(args.in_dir, STAGE, stall) if digests else None
    try:
        while pending:
            ready = arrivals.next_ready([(item.prefix, item.sources) for item in pending]) if arrivals else 0
            item = pending.pop(ready)
            try:
                manifests.append(timed_build(item, ctx))
            except WorkerDied as exc:
                failures[item.prefix] = f"{exc}; out of memory?"
                ctx.pool.close()
                ctx.pool = make_pool(args.workers, spec, args.json_key)
            except (_common.StageError, TokenizerError, OSError) as exc:
                failures[item.prefix] = str(exc)
            if item.prefix not in failures:  # progress counts complete outputs only
                progress.advance()
    finally:
        if ctx.pool is not None:
            ctx.pool.close()
    if failures:
        return _common.fail_with_items(STAGE, failures)
    _common.write_completion(
        args.out_dir,
        STAGE,
        rank,
        world,
        {
            "outputs": len(mine),
            "written": len(manifests),
            "already_complete": skipped_complete,
            "documents": sum(m["documents"] for m in manifests),
            "tokens": sum(m["tokens"] for m in manifests),
            "skipped_lines": sum(m["skipped_lines"] for m in manifests),
            "engine": tokenizer.engine,
        },
    )
    return 0


def timed_build(item: OutputItem, ctx: Context) -> dict:
    started = time.monotonic()
    manifest = build_output(item, ctx)
    seconds = max(time.monotonic() - started, 1e-9)
    print(
        f"{STAGE}: {item.prefix}: {manifest['documents']} documents, {manifest['tokens']} tokens in "
        f"{seconds:.1f} s ({manifest['tokens'] / seconds:,.0f} tokens/s)",
        file=sys.stderr,
    )
    return manifest


def default_workers() -> int:
    """One tokenizer process per CPU this process may use."""
    return _common.usable_cpus()


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, TokenizerSpec]:
    parser = argparse.ArgumentParser(prog="preprocess.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--in",
        dest="in_dir",
        type=Path,
        required=True,
        help="folder of train_chunk_{i}.jsonl (or, with --files-per-output, of *.jsonl.zst, "
        "*.jsonl.gz, *.parquet, *.jsonl)",
    )
    parser.add_argument("--out", dest="out_dir", type=Path, required=True, help="folder for .bin/.idx/.manifest.json")
    parser.add_argument("--vocab", type=Path, help="GPT-2 vocab.json")
    parser.add_argument("--merges", type=Path, help="GPT-2 merges.txt")
    parser.add_argument("--tokenizer-json", type=Path, help="an HF tokenizer.json instead of GPT-2 BPE")
    parser.add_argument("--eod-token", help="end-of-document token of --tokenizer-json (default: a known one)")
    parser.add_argument(
        "--bpe-engine",
        choices=BPE_ENGINES,
        default="auto",
        help="GPT-2 BPE engine: gigatoken where installed, else tiktoken (auto; the same ids)",
    )
    parser.add_argument(
        "--json-key", default="text", help="the JSON key (the column, in parquet) holding the document text"
    )
    parser.add_argument(
        "--files-per-output",
        type=_common.positive_int,
        help="read downloaded files directly (.jsonl.zst, .jsonl.gz, .parquet, .jsonl), in concat's "
        "groups of N per output",
    )
    parser.add_argument(
        "--workers",
        type=_common.positive_int,
        default=default_workers(),
        help="tokenizer processes in this rank (default: the CPUs it may use)",
    )
    parser.add_argument(
        "--output-stem",
        default=DEFAULT_STEM,
        help="with --files-per-output: outputs are STEM_{i}.jsonl_text_document.* (default: "
        "%(default)s; a held-out split's, e.g. validation_chunk)",
    )
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9_]+", args.output_stem):
        parser.error(f"--output-stem {args.output_stem!r}: use letters, digits and _ (it names files)")
    if args.output_stem != DEFAULT_STEM and args.files_per_output is None:
        parser.error("--output-stem needs --files-per-output (concat's outputs are named train_chunk_{i})")
    if not args.in_dir.is_dir() and not streamed_digests():  # a streamed upstream may not have made it yet
        parser.error(f"--in {args.in_dir}: not a folder")
    if args.tokenizer_json is None and (args.vocab is None or args.merges is None):
        parser.error("give --vocab and --merges (GPT-2 BPE), or --tokenizer-json")
    spec = TokenizerSpec(
        vocab=args.vocab,
        merges=args.merges,
        tokenizer_json=args.tokenizer_json,
        eod_token=args.eod_token,
        bpe_engine=args.bpe_engine,
    )
    return args, spec


def main(argv: list[str] | None = None) -> int:
    args, spec = parse_args(argv)
    # Loading the tokenizer makes 50,000 entries: the collections they set off scan everything imported, to no end
    # (about 0.02 CPU-seconds a start, measured).
    gc.disable()
    try:
        rank, world = _common.rank_and_world_size()
        tokenizer = spec.load()
    except (_common.StageError, TokenizerError) as exc:
        print(f"{STAGE}: {exc}", file=sys.stderr)
        return 2
    finally:
        gc.enable()
    print(f"{STAGE}: {tokenizer.kind} through {tokenizer.engine}", file=sys.stderr)
    init_worker(spec, args.json_key, tokenizer)  # inline tokenizing, and what forked workers inherit
    try:
        return run(args, spec, tokenizer, rank, world)
    except _common.StageError as exc:  # e.g. an unreadable download manifest: nothing can be assigned
        return _common.fail_with_items(STAGE, {str(args.in_dir): str(exc)})


if __name__ == "__main__":
    sys.exit(main())
