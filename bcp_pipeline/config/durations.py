"""Durations in ngc's `[nD][nH][nM][nS]` form (`10h`, `5D`, `1h30m`), as pipelines.yaml and `--total-runtime` use."""

from __future__ import annotations

import re

_UNIT_SECONDS = {"D": 86400, "H": 3600, "M": 60, "S": 1}
_DURATION = re.compile(r"^(?:(\d+)D)?(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?$", re.IGNORECASE)


def parse_duration(text: str | int) -> int:
    """Return seconds for `10h`, `5D`, `1h30m`, `90s` (case-insensitive, units in D, H, M, S order).

    Raises ValueError with the accepted forms; a bare integer is rejected because ngc rejects it too.
    """
    value = str(text).strip()
    match = _DURATION.match(value)
    if not value or not match or not any(match.groups()):
        raise ValueError(f"{text!r} is not a duration: use [nD][nH][nM][nS], e.g. 10h, 5D, 1h30m")
    seconds = sum(int(n) * _UNIT_SECONDS[unit] for n, unit in zip(match.groups(), "DHMS") if n)
    if seconds <= 0:
        raise ValueError(f"{text!r} is zero: a duration must be positive")
    return seconds


def format_duration(seconds: int) -> str:
    """The canonical ngc spelling of `seconds`: 36000 -> `10H`, 432000 -> `5D`, 5400 -> `1H30M`."""
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {seconds} s")
    parts, rest = [], int(seconds)
    for unit, size in _UNIT_SECONDS.items():
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def format_clock(seconds: int) -> str:
    """`D:HH:MM:SS`, the form NeMo's `trainer.max_time` takes."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}:{hours:02d}:{minutes:02d}:{secs:02d}"


def format_elapsed(seconds: float) -> str:
    """Short human form for tables: `42s`, `3m05s`, `2h07m`, `1d03h`."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
