"""What `check`'s probe jobs print, read back (pure): each line they mean to be read starts `BCPP-KIND`, and may
carry `key=value` fields."""

from __future__ import annotations

import re

LINE = re.compile(r"^(BCPP-[A-Z-]+) ?(.*)$", re.M)


def lines_of(text: str | None, kind: str) -> list[str]:
    """The rest of every `BCPP-KIND ...` line of `text` (one space after the kind dropped), in order."""
    return [rest for k, rest in LINE.findall(text or "") if k == kind]


def fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split() if "=" in part)
