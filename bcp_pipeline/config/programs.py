"""A stage program's content digest: the program and every module of stages/ it imports, directly or through
another (`_common`, `_durable`, ...). Read when the config loads; the output digest is made from it
(engine/output_digest.py), so a change to any code that writes a stage's outputs reaches that digest."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path


def program_sha256(stages_dir: Path, program: str) -> str:
    """sha256 over the names and contents of `program` and the stages/ modules it reaches, in name order."""
    digest = hashlib.sha256()
    for path in sorted(local_modules(stages_dir, stages_dir / program), key=lambda p: p.name):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


# The plain names each module source imports, by the source's digest: a config names the same programs in many
# pipelines, and a test process loads configs hundreds of times, so each source is parsed once (keyed by its bytes,
# a cache can never answer for an edited file).
_IMPORTED: dict[bytes, tuple[str, ...]] = {}


def imported_names(source: bytes) -> tuple[str, ...]:
    """The top-level names `source` imports absolutely (`import a.b` and `from a import b` give "a"); none where
    it is not Python (not UTF-8, or a syntax error)."""
    key = hashlib.sha256(source).digest()
    if key not in _IMPORTED:
        try:
            tree = ast.parse(source.decode("utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            _IMPORTED[key] = ()  # a program that is not Python counts by its bytes alone
        else:
            names = []
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names += [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names.append(node.module)
            _IMPORTED[key] = tuple(dict.fromkeys(name.split(".")[0] for name in names))
    return _IMPORTED[key]


def local_modules(stages_dir: Path, program: Path) -> set[Path]:
    """`program` and the modules of `stages_dir` it imports by plain name (as the stage programs import each
    other: stages/ is on their path), followed through those modules too; third-party imports are left out."""
    seen: set[Path] = set()
    todo = [program]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        try:
            source = path.read_bytes()
        except OSError:
            continue  # not readable: counted by what program_sha256 can read of it
        todo += [found for name in imported_names(source) if (found := stages_dir / f"{name}.py").is_file()]
    return seen
