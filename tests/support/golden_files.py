"""Golden-file comparison: `UPDATE_GOLDEN=1 pytest ...` rewrites the files after an intended change."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
REPO = Path(__file__).resolve().parents[2]


def normalize(text: str, *roots: Path) -> str:
    """Machine-independent text: the checkout path, the stages/ content hash and the output digests (which hash
    the stage programs too: tests/engine and tests/stages check them) are replaced."""
    text = text.replace(sys.executable, "<PYTHON>")
    for root in (*roots, REPO):
        text = text.replace(str(root), "<ROOT>")
    text = re.sub(r"(BCP_PIPELINE_OUTPUT_DIGEST[:=])[0-9a-f]{16}", r"\1<DIGEST>", text)
    text = re.sub(r"(name: BCP_PIPELINE_OUTPUT_DIGEST\n\s+value: )[0-9a-f]{16}", r"\1<DIGEST>", text)  # a manifest
    return re.sub(r"(\.bcp-pipeline/code/)[0-9a-f]{16}", r"\1<HASH>", text)


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"golden file {path} is missing: run with UPDATE_GOLDEN=1 once and review it"
    expected = path.read_text()
    assert text == expected, f"output differs from {path}; if intended, rerun with UPDATE_GOLDEN=1 and review the diff"
