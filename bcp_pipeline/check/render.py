"""`check`'s table for people (pure: a CheckResult in, text out)."""

from __future__ import annotations

import textwrap
from datetime import datetime, timezone

from bcp_pipeline.backends.checks import Verdict
from bcp_pipeline.check.run import CheckResult

COLUMNS = (("ASSUMES", 30), ("SHOWED", 38), ("RESULT", 15), ("WHAT IT MEANS / WHAT TO DO", 52))


def render_check(result: CheckResult, profile_path: str | None = None) -> str:
    """The header, one wrapped table row per assumption, and the counts."""
    where = ", ".join(f"{k} {v}" for k, v in result.target.items())
    when = datetime.fromtimestamp(result.checked_at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# check: {result.backend} ({where})"
        + (f", pipeline {result.pipeline}" if result.pipeline else "")
        + f", {when}"
    ]
    # result.notes (what probe jobs cost) were said before they ran, and are in --json and the profile
    lines.append("")
    lines.append(_line([name for name, _ in COLUMNS]))
    lines.append(_line(["-" * width for _, width in COLUMNS]))
    for row in result.rows:
        cells = [row.assumes, row.showed, row.verdict.value, row.meaning]
        wrapped = [textwrap.wrap(text, width) or [""] for text, (_, width) in zip(cells, COLUMNS)]
        for i in range(max(len(w) for w in wrapped)):
            lines.append(_line([w[i] if i < len(w) else "" for w in wrapped]))
    lines.append("")
    lines.append(
        f"{result.count(Verdict.OK)} ok, {result.count(Verdict.DIFFERENT)} different, "
        f"{result.count(Verdict.UNCHECKED)} could not check"
        + (f"; profile saved: {profile_path}" if profile_path else "")
    )
    return "\n".join(lines)


def _line(cells: list[str]) -> str:
    return "  ".join(cell.ljust(width) for cell, (_, width) in zip(cells, COLUMNS)).rstrip()
