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
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue  # a program that is not Python (or not readable) counts by its bytes alone
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            todo += [found for name in names if (found := stages_dir / f"{name.split('.')[0]}.py").is_file()]
    return seen
