"""The data index's manifest: which of megatron-core's index files a build made or read, so that a CPU job can build
a training's index before the training starts and a verification can check it file by file.

megatron-core caches each dataset's indices in its `path_to_cache` folder under `{hash}-{Class}-{split}-{suffix}`
(a GPTDataset: description.txt, document_index.npy, sample_index.npy, shuffle_index.npy; a BlendedDataset:
description.txt, dataset_index.npy, dataset_sample_index.npy), the hash being that of the dataset's description
(its prefix, sample count, split, seed, sequence length, tokenizer). It writes them in place, not atomically, and
takes any complete-looking set for a hit. So the job that builds them (bridge_index.py; the local smoke's
pretrain_local.py --build-data-index):
1. `begin`: removes the manifest FIRST (a kill from here on leaves none), then every index file the last complete
   build did not list (the half-written leftovers of a killed build, which megatron-core would take for a hit);
2. builds (megatron-core reads what is complete and builds the rest);
3. `finish`: removes the index files this build does not use (another config's: they would only mislead a count),
   checks that each dataset's files are there, and writes the manifest LAST, atomically.
verify.py --listed then checks the folder against it: every listed file there at its size, no other.

Standard library only: it runs in the Megatron-Bridge image as well as in the project's own environment.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from data_list import write_text_atomic

MANIFEST_NAME = "data_index.json"
# What megatron-core writes per dataset, by its class (megatron/core/datasets/{gpt,blended}_dataset.py)
FILES_PER_DATASET = {"GPTDataset": 4, "BlendedDataset": 3}


@dataclass(frozen=True)
class BuiltDataset:
    """One dataset of the build, as megatron-core names its cache files."""

    kind: str  # the class: GPTDataset or BlendedDataset
    split: str  # train, valid or test
    digest: str  # megatron-core's unique_description_hash


class IndexBuildError(RuntimeError):
    """The index build left the cache folder other than it must be; the message says what is missing."""


def datasets_of(*roots: object) -> list[BuiltDataset]:
    """The datasets of megatron-core's build (train, valid, test; None where a split is not built): each blend and
    every dataset it blends."""
    found: list[BuiltDataset] = []
    for dataset in roots:
        if dataset is None:
            continue
        blended = getattr(dataset, "datasets", None)
        split = getattr(dataset, "split", None) if blended is not None else getattr(dataset, "index_split", None)
        found.append(BuiltDataset(type(dataset).__name__, split.name, dataset.unique_description_hash))
        if blended is not None:
            found += [d for d in datasets_of(*blended) if d not in found]
    return found


def index_files(cache: Path) -> dict[str, int]:
    """Every visible regular file of the cache folder (megatron-core's, and whatever else is there): name -> bytes."""
    if not cache.is_dir():
        return {}
    return {
        entry.name: entry.stat().st_size
        for entry in os.scandir(cache)
        if entry.is_file() and not entry.name.startswith(".")
    }


def begin(manifest: Path, cache: Path) -> dict[str, int]:
    """Before a build: drop the manifest, then every file the last complete build did not list. Returns the files
    kept (name -> bytes): what megatron-core may now read instead of building."""
    listed: dict[str, int] = {}
    if manifest.is_file():
        try:
            listed = json.loads(manifest.read_text(encoding="utf-8")).get("files", {})
        except (OSError, ValueError):
            listed = {}
        manifest.unlink()
    for name, size in index_files(cache).items():
        if listed.get(name) != size:
            (cache / name).unlink()
    return index_files(cache)


def finish(
    manifest: Path,
    cache: Path,
    datasets: list[BuiltDataset],
    before: dict[str, int],
    *,
    seconds: float,
    samples: list[int],
    what: str,
) -> dict:
    """After a build: keep only this build's files, check each dataset's are complete, write the manifest last."""
    digests = {d.digest for d in datasets}
    present = index_files(cache)
    stale = [name for name in present if name.split("-", 1)[0] not in digests]
    for name in stale:
        (cache / name).unlink()
    files = {name: size for name, size in index_files(cache).items() if name.split("-", 1)[0] in digests}
    for dataset in datasets:
        prefix = f"{dataset.digest}-{dataset.kind}-{dataset.split}-"
        have = [name for name in files if name.startswith(prefix)]
        expected = FILES_PER_DATASET.get(dataset.kind)
        if expected is None:
            raise IndexBuildError(
                f"megatron-core built a {dataset.kind}, whose index files this program does not "
                f"know (it knows {', '.join(FILES_PER_DATASET)})"
            )
        if len(have) != expected:
            raise IndexBuildError(
                f"{cache}: {dataset.kind} {dataset.split} {dataset.digest} has {len(have)} index "
                f"file(s), {expected} expected: the build did not save them all"
            )
    built = sorted(name for name in files if before.get(name) != files[name])
    record = {
        "what": what,
        "cache": os.path.relpath(cache, manifest.parent),
        "files": files,
        "built": len(built),
        "read": len(files) - len(built),
        "removed_stale": len(stale),
        "datasets": [vars(d) for d in datasets],
        "samples": samples,
        "seconds": round(seconds, 3),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_json_atomic(manifest, record)
    return record


def summary_line(program: str, record: dict, prefixes: int) -> str:
    """What the job prints when it is done."""
    kinds = {}
    for dataset in record["datasets"]:
        kinds[dataset["kind"]] = kinds.get(dataset["kind"], 0) + 1
    counted = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    return (
        f"{program}: data index of {record['what']}: {len(record['files'])} file(s) for {prefixes} prefix(es) "
        f"({counted}; samples train/valid/test {'/'.join(map(str, record['samples']))}): built "
        f"{record['built']}, read {record['read']} already complete, removed {record['removed_stale']} stale, "
        f"in {record['seconds']:.1f} s"
    )


def write_json_atomic(path: Path, value: dict) -> None:
    write_text_atomic(path, json.dumps(value, indent=1, sort_keys=True))
