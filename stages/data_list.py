"""The pretraining data list (Megatron/NeMo "blend") built from the preprocess manifests.

Preprocessing writes, for every output, `<prefix>.bin`, `<prefix>.idx` and LAST `<prefix>.manifest.json`
(format in docs/CONVENTIONS.md). Training takes a flat list `[w1, prefix1, w2, prefix2, ...]`
(`model.data.data_prefix` in NeMo, `blend` in megatron-core), prefixes without `.bin`/`.idx`. This module turns
a folder of manifests into that list, with weights proportional to each output's token count.

Weights and their sum: with `digits=D` (default 6) each weight is an exact multiple of 10**-D, apportioned by the
largest-remainder method so that the rendered decimals add up to exactly 1 (a `Decimal` sum of the rendered
strings is 1, not 0.999999), every weight is within 10**-D of its exact share, and no non-empty output gets 0.
As binary floats the sum is 1 within 1e-12 (0.1 + 0.2 style error); Megatron and NeMo normalise the weights
anyway. `digits=None` keeps full precision (tokens / total, rendered with `repr`, sum 1 within a few ulps).

Paths: manifests are read where they are on this machine (`folder`); the prefixes are rendered under
`render_dir` when given (e.g. the workspace mount `/mount_workspace/data/preprocessed` inside the container).

Standard library only, and no `_common`: the orchestrator imports this module as well as the stage programs.
Also a small CLI: `python3 stages/data_list.py --data-dir DIR [--render-dir DIR] [--format hydra|yaml|json]
[--out FILE]`, so a job can build the list where the data is; with `--valid-data-dir DIR` it writes per-split data
(`--split-form megatron`: one line; `nemo`: three, one Hydra override a line, which the job reads as a bash array).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MANIFEST_SUFFIX = ".manifest.json"
DEFAULT_DIGITS = 6
HYDRA_KEY = "model.data.data_prefix"
# megatron-core's per-split blends, [train, validation, test] each ([prefixes], [weights]) or null: a training
# that validates on a held-out split's own .bin/.idx (Megatron-Bridge's dataset config; `split` must then be null).
PER_SPLIT_KEY = "dataset.blend_per_split"
# How a per-split data list is written: megatron-core's blend_per_split (Bridge), or NeMo 1.22's dict data_prefix
# {train, validation, test} (the NeMo launcher), which Hydra sets only in three overrides (render_nemo_per_split).
SPLIT_FORMS = ("megatron", "nemo")
# Characters Hydra's override grammar accepts in an unquoted value; anything else gets single quotes.
_HYDRA_UNQUOTED = re.compile(r"[A-Za-z0-9_./+-]+")
# Characters a quoted Hydra value cannot carry verbatim: quotes/backslashes need Hydra's escaping rules and `$`
# starts an interpolation. No real data path has them, so refuse instead of escaping subtly wrong.
_HYDRA_REFUSED = re.compile(r"['\\$\n\r]")

Blend = list[float | str]


class DataListError(ValueError):
    """The manifests cannot make a valid data list; the message names the file and what to do."""


@dataclass(frozen=True)
class DataEntry:
    """One preprocessed output: where its manifest is, its rendered prefix, tokens and weight."""

    name: str
    prefix: str
    tokens: int
    documents: int
    weight: float
    manifest: Path
    tokenizer: dict


def read_manifest(path: Path, check_files: bool = True) -> dict:
    """Load and validate one `<prefix>.manifest.json`; with `check_files`, its .bin/.idx must exist at full size."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataListError(f"{path}: unreadable manifest ({exc}); rerun preprocess for this output") from exc
    if not isinstance(manifest, dict):
        raise DataListError(f"{path}: a manifest must be a JSON object")
    name = path.name[: -len(MANIFEST_SUFFIX)]
    if manifest.get("prefix") != name:
        raise DataListError(f"{path}: prefix {manifest.get('prefix')!r} does not match the file name ({name!r})")
    for key in ("tokens", "documents"):
        value = manifest.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise DataListError(f"{path}: {key!r} must be a non-negative integer, got {value!r}")
    if manifest["tokens"] == 0:
        raise DataListError(f"{path}: zero tokens (every line skipped or empty?); fix or remove {name}.* and rerun")
    if check_files:
        for suffix, size_key in ((".bin", "bin_bytes"), (".idx", "idx_bytes")):
            _check_data_file(path, path.with_name(name + suffix), manifest.get(size_key))
    return manifest


def _check_data_file(manifest_path: Path, data_path: Path, expected: object) -> None:
    """The manifest promises a complete file: missing or resized means the folder was tampered with."""
    try:
        size = data_path.stat().st_size
    except FileNotFoundError:
        raise DataListError(f"{manifest_path}: {data_path.name} is missing; rerun preprocess for this output") from None
    if isinstance(expected, int) and size != expected:
        raise DataListError(f"{data_path}: {size} bytes, the manifest says {expected}; rerun preprocess")


def manifest_paths(folder: Path) -> list[Path]:
    """Every manifest in `folder`, sorted by name (hidden temporaries of killed writers excluded)."""
    if not folder.is_dir():
        raise DataListError(f"{folder}: not a folder; point --data-dir at the preprocess output")
    found = sorted(p for p in folder.iterdir() if p.name.endswith(MANIFEST_SUFFIX) and not p.name.startswith("."))
    if not found:
        raise DataListError(f"{folder}: no *{MANIFEST_SUFFIX} files; run the preprocess stage first")
    return found


def apportion(tokens: list[int], digits: int | None = DEFAULT_DIGITS) -> list[float]:
    """Weights proportional to `tokens`, summing to 1 (exactly, in decimal, when `digits` is set)."""
    total = sum(tokens)
    if total <= 0 or any(t <= 0 for t in tokens):
        raise DataListError(f"token counts must all be positive, got {tokens}")
    if digits is None:
        return [t / total for t in tokens]
    scale = 10**digits
    if scale < len(tokens):
        raise DataListError(f"{digits} digits cannot give {len(tokens)} outputs a non-zero weight each")
    units = [t * scale // total for t in tokens]
    # Largest remainders first; ties broken by position so the result is deterministic.
    order = sorted(range(len(tokens)), key=lambda i: (-(tokens[i] * scale % total), i))
    for i in order[: scale - sum(units)]:
        units[i] += 1
    _lift_zero_weights(units)
    return [u / scale for u in units]


def _lift_zero_weights(units: list[int]) -> None:
    """A weight of 0 would make Megatron build an empty dataset: give it one unit, taken from the largest."""
    for i, value in enumerate(units):
        if value == 0:
            units[i] = 1
            units[max(range(len(units)), key=lambda j: (units[j], -j))] -= 1


def build_data_list(
    folder: Path | str, render_dir: str | None = None, digits: int | None = DEFAULT_DIGITS, check_files: bool = True
) -> list[DataEntry]:
    """Read every manifest in `folder` (sorted by prefix) into weighted entries; see the module docstring."""
    folder = Path(folder)
    paths = manifest_paths(folder)
    manifests = [read_manifest(p, check_files) for p in paths]
    _check_same_tokenizer(paths, manifests)
    weights = apportion([m["tokens"] for m in manifests], digits)
    base = render_dir if render_dir is not None else str(folder.resolve())
    return [
        DataEntry(
            name=m["prefix"],
            prefix=str(PurePosixPath(base) / m["prefix"]),
            tokens=m["tokens"],
            documents=m["documents"],
            weight=w,
            manifest=p,
            tokenizer=dict(m.get("tokenizer") or {}),
        )
        for p, m, w in zip(paths, manifests, weights)
    ]


def _check_same_tokenizer(paths: list[Path], manifests: list[dict]) -> None:
    """Token ids from two tokenizers cannot be trained on together."""
    first = manifests[0].get("tokenizer")
    for path, manifest in zip(paths[1:], manifests[1:]):
        if manifest.get("tokenizer") != first:
            raise DataListError(
                f"{path}: tokenizer {manifest.get('tokenizer')} differs from {paths[0].name}'s "
                f"{first}; preprocess every output with the same tokenizer"
            )


def held_out_split(
    train: list[DataEntry], folder: Path, digits: int | None, check_files: bool = True
) -> list[DataEntry]:
    """A held-out split's entries, tokenized as the training's (a loss over other token ids means nothing)."""
    entries = build_data_list(folder, None, digits, check_files)
    if entries[0].tokenizer != train[0].tokenizer:
        raise DataListError(
            f"{entries[0].manifest}: tokenizer {entries[0].tokenizer} differs from the training data's "
            f"{train[0].tokenizer} ({train[0].manifest}); preprocess the held-out split with the same tokenizer"
        )
    return entries


def blend(entries: list[DataEntry]) -> Blend:
    """The flat NeMo list `[w1, prefix1, w2, prefix2, ...]`."""
    flat: Blend = []
    for entry in entries:
        flat += [entry.weight, entry.prefix]
    return flat


def split_blend(flat: Blend) -> tuple[list[str], list[float]]:
    """megatron-core's form of the same list: (prefixes, weights)."""
    return [str(p) for p in flat[1::2]], [float(w) for w in flat[0::2]]


def hydra_value(path: str) -> str:
    """One prefix as a Hydra override list element: bare when the grammar allows it, else single-quoted."""
    if _HYDRA_REFUSED.search(path):
        raise DataListError(
            f"{path!r}: quotes, backslashes, '$' and newlines cannot be passed to Hydra safely; rename the data folder"
        )
    # A bare value without '/' could parse as a number, bool or null: only bare paths are left unquoted.
    if _HYDRA_UNQUOTED.fullmatch(path) and "/" in path:
        return path
    return f"'{path}'"


def hydra_list(flat: Blend) -> str:
    """`[0.013514,/data/a,...]`: the flat list as a Hydra override value."""
    items = [repr(float(item)) if i % 2 == 0 else hydra_value(str(item)) for i, item in enumerate(flat)]
    return f"[{','.join(items)}]"


def render_hydra(flat: Blend, key: str = HYDRA_KEY) -> str:
    """`model.data.data_prefix=[0.013514,/data/a,...]`, the launcher's form. Shell-quote it as one word."""
    return f"{key}={hydra_list(flat)}"


def render_hydra_per_split(splits: list[Blend | None], key: str = PER_SPLIT_KEY) -> str:
    """`dataset.blend_per_split=[[[/d/a,/d/b],[0.6,0.4]],[[/v/a],[1.0]],null]`: megatron-core's per-split form, one
    ([prefixes], [weights]) per split in the order train, validation, test; null where a split has none."""
    parts = []
    for flat in splits:
        if flat is None:
            parts.append("null")
            continue
        prefixes, weights = split_blend(flat)
        parts.append(f"[[{','.join(hydra_value(p) for p in prefixes)}],[{','.join(repr(w) for w in weights)}]]")
    return f"{key}=[{','.join(parts)}]"


def render_nemo_per_split(
    train: Blend, validation: Blend, key: str = HYDRA_KEY, test: Blend | None = None
) -> list[str]:
    """NeMo 1.22's per-split data list as the three Hydra overrides that set it over the launcher's flat list, one
    for each line of the data list file: `~KEY`, `+KEY={train:[...],validation:[...],test:[...]}` and the
    `splits_string` beside KEY set to null.

    Why three: Hydra 1.3.2 refuses `KEY={...}` over the config's list ("Cannot merge DictConfig with ListConfig"),
    so the list is deleted and the dict added. NeMo requires all three keys once data_prefix is a dict and then
    ignores splits_string; null says so in the composed config. Without a `test` split of its own the
    validation split is the test blend too (NeMo requires the key)."""
    splits = {"train": train, "validation": validation, "test": test if test is not None else validation}
    parts = [f"{name}:{hydra_list(flat)}" for name, flat in splits.items()]
    parent = key.rpartition(".")[0]
    splits_key = f"{parent}.splits_string" if parent else "splits_string"
    return [f"~{key}", f"+{key}={{{','.join(parts)}}}", f"{splits_key}=null"]


def render_json(flat: Blend) -> str:
    """The flat list as JSON (a valid YAML flow sequence too)."""
    return json.dumps(flat) + "\n"


def render_yaml(flat: Blend, key: str = HYDRA_KEY) -> str:
    """A YAML document nesting the list under the dotted `key` (e.g. a Hydra config file to merge)."""
    parts = key.split(".") if key else []
    lines = [f"{'  ' * depth}{part}:" for depth, part in enumerate(parts)]
    indent = "  " * len(parts)
    # Paths as JSON strings: always valid YAML double-quoted scalars, whatever characters they hold.
    lines += [f"{indent}- {repr(float(item)) if i % 2 == 0 else json.dumps(str(item))}" for i, item in enumerate(flat)]
    return "\n".join(lines) + "\n"


def write_text_atomic(path: Path, text: str) -> None:
    """Temp file + fsync + rename (the project's rule for every output), without depending on `_common`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def render(flat: Blend, fmt: str, key: str = HYDRA_KEY) -> str:
    """Render in one of `hydra`, `yaml`, `json`."""
    if fmt == "hydra":
        return render_hydra(flat, key) + "\n"
    if fmt == "yaml":
        return render_yaml(flat, key)
    if fmt == "json":
        return render_json(flat)
    raise DataListError(f"unknown format {fmt!r}: use hydra, yaml or json")


def main(argv: list[str] | None = None) -> int:
    """CLI: print (or write atomically) the data list of a preprocess output folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, type=Path, help="folder with *.manifest.json and .bin/.idx")
    parser.add_argument("--render-dir", help="folder to write in the prefixes (as the training job sees the data)")
    parser.add_argument("--format", choices=("hydra", "yaml", "json"), default="hydra")
    parser.add_argument("--key", default=HYDRA_KEY, help="dotted config key for the hydra and yaml formats")
    parser.add_argument("--digits", type=int, default=DEFAULT_DIGITS, help="decimal digits per weight; -1: full")
    parser.add_argument("--no-check-files", action="store_true", help="trust manifests without .bin/.idx here")
    parser.add_argument("--out", type=Path, help="write here instead of stdout")
    parser.add_argument(
        "--valid-data-dir",
        type=Path,
        help="a held-out split's own outputs: render per-split data (train from --data-dir, validation from "
        "here) in the --split-form instead",
    )
    parser.add_argument(
        "--split-form",
        choices=SPLIT_FORMS,
        default="megatron",
        help="megatron: one line, megatron-core's blends under --split-key (test: null without --test-data-dir); "
        "nemo: NeMo's dict data_prefix under --key, three override lines (test: the validation split without "
        "--test-data-dir)",
    )
    parser.add_argument(
        "--test-data-dir",
        type=Path,
        help="a second held-out split's own outputs (with --valid-data-dir): the test blend, which the training "
        "scores once at its end",
    )
    parser.add_argument("--split-key", default=PER_SPLIT_KEY, help="the per-split blends' key (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.valid_data_dir is not None and (args.format != "hydra" or args.render_dir):
        parser.error("--valid-data-dir renders the hydra format only, without --render-dir")
    if args.test_data_dir is not None and args.valid_data_dir is None:
        parser.error("--test-data-dir needs --valid-data-dir: a test split is held out beside a validation split")
    digits = None if args.digits < 0 else args.digits
    try:
        entries = build_data_list(args.data_dir, args.render_dir, digits, check_files=not args.no_check_files)
        if args.valid_data_dir is not None:
            validation = blend(held_out_split(entries, args.valid_data_dir, digits, not args.no_check_files))
            test = None
            if args.test_data_dir is not None:
                test = blend(held_out_split(entries, args.test_data_dir, digits, not args.no_check_files))
            if args.split_form == "nemo":
                lines = render_nemo_per_split(blend(entries), validation, args.key, test)
                text = "".join(line + "\n" for line in lines)
            else:
                text = render_hydra_per_split([blend(entries), validation, test], args.split_key) + "\n"
        else:
            text = render(blend(entries), args.format, args.key)
    except DataListError as exc:
        print(f"data_list: {exc}", file=sys.stderr)
        return 1
    if args.out:
        write_text_atomic(args.out, text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
