#!/usr/bin/env python3
"""download stage: fetch SlimPajama shards into one flat folder, sharded by rank, resumable, never with a hole.

`BASE/{split}/chunk{c}/example_train_{i}.jsonl.zst` -> `OUT/example_train_chunk{c}_{i}.jsonl.zst` for the real
per-chunk file counts (the guide's 6,000-per-chunk loop asks for files that do not exist). Each file streams to a
hidden temporary while a zstd decompressor reads it along; it is renamed into place only when the body matches its
Content-Length and every zstd frame is complete. 429, 5xx, dropped connections, timeouts and short bodies are
retried with exponential backoff and jitter, waiting what `Retry-After` / `RateLimit` headers ask (capped); a 404
or 401/403 fails the file at once. `HF_TOKEN` is sent as a bearer token and never printed.

Every rank writes the same `OUT/.manifest/download.json` (the full list of expected names, and the output digest it
was written under) before downloading, so later stages can list their inputs without racing the downloads, and a
streamed downstream (preprocess.py) can take each group of files as it lands. Exit 0 only when every file of the
shard is in place.

`--hf-dataset REPO [--revision REV] [--include GLOB] [--exclude GLOB]` fetches any dataset repo instead: the file
list comes from the Hub's tree API at the commit REV resolves to (hf_listing.py), and the manifest records that
commit, each file's size and, for LFS files, its sha256. A file is renamed into place only when its size and its
sha256 (git blob id for non-LFS files) match the listing; a mismatch is retried like a cut body. A resume, or a
rank started later, downloads the manifest's commit, and refuses to go on when REV has moved meanwhile.
`--revision-of DIR` downloads the commit another download of the same repo pinned in DIR instead (a held-out
file at the training files' commit, even when the branch has moved between the two).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from urllib.parse import urlsplit

import _common
import hf_listing
from _fetch_attempt import FetchError
from _fetcher import Fetcher, RetryPolicy, make_session
from _slimpajama_files import DEFAULT_BASE_URL, SPLIT_CHUNKS, Item, expected_items, parse_chunks
from hf_listing import HubItem

STAGE = "download"
MANIFEST = Path(".manifest") / "download.json"


def write_manifest(out_dir: Path, items: list[Item], rank: int) -> None:
    """Write the list of every expected name; each rank writes identical bytes, so the last rename wins harmlessly."""
    payload = {"stage": STAGE, "count": len(items), "files": [item.name for item in items]}
    if os.environ.get(_common.OUTPUT_DIGEST_ENV):  # a streamed downstream trusts only this config's manifest
        payload["output_digest"] = os.environ[_common.OUTPUT_DIGEST_ENV]
    data = (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode()
    path = out_dir / MANIFEST
    with contextlib.suppress(FileNotFoundError):
        if path.read_bytes() == data:
            return
    # Every rank writes the same bytes; _common's temporary names carry host and pid, so ranks never collide.
    with _common.atomic_output(path) as handle:
        handle.write(data)


def redactor(secret: str | None) -> Callable[[str], str]:
    """A function that blanks `secret` out of text, for everything this stage prints."""
    if not secret:
        return lambda text: text
    return lambda text: text.replace(secret, "<HF_TOKEN>")


def download_all(
    fetcher: Fetcher, items: list[Item] | list[HubItem], workers: int, progress: _common.Progress
) -> tuple[dict[str, str], int]:
    """Fetch `items` on a thread pool; returns ({name: reason} for each that could not be fetched, bytes fetched)."""
    failures: dict[str, str] = {}
    fetched = 0
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="download") as pool:
        futures = {pool.submit(fetcher.fetch, item): item for item in items}
        for future in as_completed(futures):
            item = futures[future]
            try:
                fetched += future.result()
            except FetchError as exc:
                failures[item.name] = exc.reason
            except Exception as exc:  # a full disk, a bug: still name the file rather than stop the other workers
                failures[item.name] = f"{type(exc).__name__}: {exc}"
            else:
                progress.advance()
    return failures, fetched


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="download.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base-url",
        default=DEFAULT_BASE_URL,
        help="https://, http:// or file:// root holding SPLIT/chunkC/ (default: %(default)s)",
    )
    parser.add_argument("--out", type=Path, required=True, help="flat output folder")
    parser.add_argument("--split", default="train", choices=sorted(SPLIT_CHUNKS))
    parser.add_argument("--chunks", default=None, help="chunks to fetch, e.g. 1-10 or 1,3,5 (default: all)")
    parser.add_argument(
        "--files-per-chunk",
        type=_common.positive_int,
        default=None,
        help="cap on each chunk's file count (default: the real SlimPajama counts)",
    )
    parser.add_argument("--max-files", type=_common.positive_int, default=None, help="cap on the total number of files")
    parser.add_argument("--workers", type=_common.positive_int, default=8, help="concurrent downloads in this process")
    parser.add_argument(
        "--attempts", type=_common.positive_int, default=8, help="attempts per file (default: %(default)s)"
    )
    parser.add_argument(
        "--backoff",
        type=positive_float,
        default=1.0,
        help="first retry wait in seconds, doubled each attempt, plus jitter (default: %(default)s)",
    )
    parser.add_argument(
        "--max-wait",
        type=positive_float,
        default=300.0,
        help="cap on any single wait, Retry-After included (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=60.0,
        help="seconds without data before an attempt is abandoned (default: %(default)s)",
    )
    hub = parser.add_argument_group("any Hugging Face dataset repo (instead of SlimPajama's built-in list)")
    hub.add_argument(
        "--hf-dataset",
        metavar="REPO",
        help="dataset repo id, e.g. HuggingFaceFW/fineweb-edu; the "
        f"Hub is ${hf_listing.ENDPOINT_ENV} when set, else {hf_listing.DEFAULT_ENDPOINT}",
    )
    hub.add_argument(
        "--revision",
        default="main",
        help="branch, tag or commit (default: %(default)s); the manifest pins the commit it resolves to",
    )
    hub.add_argument(
        "--revision-of",
        type=Path,
        metavar="DIR",
        help="download the commit that DIR's download of the same repo pinned (its .manifest/download.json), "
        "instead of --revision: e.g. a held-out file at the training files' commit",
    )
    hub.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="GLOB",
        help="fetch only paths matching GLOB (fnmatch, `*` crosses /); repeatable",
    )
    hub.add_argument(
        "--exclude", action="append", default=[], metavar="GLOB", help="skip paths matching GLOB; repeatable"
    )
    hub.add_argument(
        "--listing-wait",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="ranks other than 0 wait this long for rank 0's manifest before listing the revision "
        "themselves (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.hf_dataset is not None:
        if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", args.hf_dataset):
            parser.error(f"--hf-dataset {args.hf_dataset!r}: expected a repo id like OWNER/NAME")
        given = [
            flag
            for flag, value in (
                ("--chunks", args.chunks),
                ("--files-per-chunk", args.files_per_chunk),
                ("--max-files", args.max_files),
            )
            if value is not None
        ]
        if args.base_url != DEFAULT_BASE_URL or args.split != "train":
            given += ["--base-url/--split"]
        if given:
            parser.error(
                f"--hf-dataset takes its file list from the Hub; {', '.join(given)} do not apply "
                "(select files with --include/--exclude)"
            )
        if args.revision_of is not None and args.revision != "main":
            parser.error("--revision-of takes the commit from DIR's manifest: give it or --revision, not both")
        return args
    if args.include or args.exclude or args.revision != "main" or args.revision_of is not None:
        parser.error("--revision, --revision-of, --include and --exclude need --hf-dataset")
    scheme = urlsplit(args.base_url).scheme
    if scheme not in ("https", "http", "file"):
        parser.error(f"--base-url {args.base_url!r}: the scheme must be https, http or file")
    try:
        args.chunk_list = parse_chunks(args.chunks or f"1-{SPLIT_CHUNKS[args.split]}", SPLIT_CHUNKS[args.split])
    except ValueError as exc:
        parser.error(f"--chunks {args.chunks!r}: {exc}")
    if args.split != "train" and args.files_per_chunk is None:
        parser.error(f"--files-per-chunk is required for --split {args.split} (its file counts are not built in)")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the stage for this process's rank; returns the exit code."""
    args = parse_args(argv)
    token = os.environ.get("HF_TOKEN") or None
    redact = redactor(token)

    lock = threading.Lock()

    def log(message: str) -> None:
        with lock:  # worker threads log retries: one whole line at a time
            sys.stderr.write(redact(f"{STAGE}: {message}") + "\n")
            sys.stderr.flush()

    try:
        rank, world = _common.rank_and_world_size()
    except _common.StageError as exc:
        log(str(exc))
        return 2
    if _common.claim_or_refuse(args.out, STAGE, args.out.glob("*.jsonl.zst"), rank):
        return 1
    policy = RetryPolicy(args.attempts, args.backoff, args.max_wait, args.timeout)
    with make_session(args.workers, token) as session:
        fetcher = Fetcher(args.base_url, args.out, policy, session, log)
        if args.hf_dataset is None:
            items = expected_items(args.split, args.chunk_list, args.files_per_chunk, args.max_files)
            write_manifest(args.out, items, rank)
        else:
            try:
                if args.revision_of is not None:
                    args.revision = pinned_commit_of(args.revision_of, args.hf_dataset)
                items = pin_listing(fetcher, args, rank, log)
            except hf_listing.PinnedRevisionError as exc:
                log(str(exc))
                return 2
            except (hf_listing.ListingError, FetchError) as exc:
                log(
                    f"cannot list {args.hf_dataset} at revision {args.revision!r}: {exc} (are the repo id, "
                    "--revision and --include right? a private or gated dataset needs HF_TOKEN)"
                )
                return 1
        failures, fetched, summary = fetch_shard(fetcher, items, rank, world, args.workers)
    if failures:
        return _common.fail_with_items(STAGE, {name: redact(reason) for name, reason in failures.items()})
    _common.write_completion(args.out, STAGE, rank, world, {**summary, "bytes_downloaded": fetched})
    return 0


def pinned_commit_of(folder: Path, hf_dataset: str) -> str:
    """The commit the download in `folder` pinned, for a download of the same repo that must match it."""
    path = folder / MANIFEST
    try:
        pinned = hf_listing.read_manifest(path)
    except hf_listing.ListingError as exc:
        raise hf_listing.PinnedRevisionError(f"--revision-of {folder}: {exc}") from exc
    if pinned is None:
        raise hf_listing.PinnedRevisionError(
            f"--revision-of {folder}: no download manifest there yet ({path}); the download that writes it must "
            "run first (list it in this stage's needs:)"
        )
    source = pinned[0]
    if source.hf_dataset != hf_dataset:
        raise hf_listing.PinnedRevisionError(
            f"--revision-of {folder}: that folder holds {source.hf_dataset}, not {hf_dataset}; a commit of one "
            "repo means nothing in another"
        )
    return source.commit


def pin_listing(fetcher: Fetcher, args: argparse.Namespace, rank: int, log: Callable[[str], None]) -> list[HubItem]:
    """The manifest's items (listing the revision first when there is no manifest yet); points `fetcher` at the
    pinned commit, on the Hub this run was given (HF_ENDPOINT may name a mirror on a resume)."""
    endpoint = hf_listing.endpoint_from_env()
    wanted = hf_listing.Source(args.hf_dataset, args.revision, "", tuple(args.include), tuple(args.exclude), endpoint)
    source, items = hf_listing.pin(
        fetcher.get_json, wanted, args.out / MANIFEST, STAGE, log, wait_seconds=args.listing_wait if rank else 0.0
    )
    fetcher.base_url = dataclasses.replace(source, endpoint=endpoint).resolve_base()
    return items


def fetch_shard(
    fetcher: Fetcher, items: list[Item] | list[HubItem], rank: int, world: int, workers: int
) -> tuple[dict[str, str], int, dict]:
    """Fetch this rank's share of `items` that is not in place yet: (failures, bytes fetched, counts)."""
    out, log = fetcher.out_dir, fetcher.log
    mine = _common.shard(items, rank, world)
    _common.remove_stale_temporaries_of(out / item.name for item in mine)
    # In name order, the order a streamed downstream groups them (preprocess.py): its first groups land first.
    todo = sorted((item for item in mine if not (out / item.name).exists()), key=lambda item: item.name)
    log(f"rank {rank}/{world}: {len(mine)} of {len(items)} files, {len(mine) - len(todo)} already present")
    progress = _common.Progress(len(mine), rank)
    progress.advance(len(mine) - len(todo))
    failures, fetched = download_all(fetcher, todo, workers, progress)
    return failures, fetched, {"files": len(mine), "downloaded": len(todo), "already_present": len(mine) - len(todo)}


if __name__ == "__main__":
    sys.exit(main())
