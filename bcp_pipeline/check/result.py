"""One `check`'s answer: a row per assumption the orchestrator makes, and the facts a backend may adapt to.

A row is never "ok" by default: a value the check does not recognise (an env var value, a status, a field) is
DIFFERENT, and a question the service did not answer is UNCHECKED with the reason.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Verdict(enum.Enum):
    OK = "ok"
    DIFFERENT = "different"
    UNCHECKED = "could not check"


@dataclass(frozen=True, kw_only=True)
class Row:
    """What the orchestrator assumes / what this service showed / the verdict / what it means and what to do."""

    topic: str  # short and stable, e.g. "python", "partition time", "ace instances": for --json readers and tests
    assumes: str
    showed: str
    verdict: Verdict
    meaning: str = ""

    def as_json(self) -> dict[str, str]:
        return {"topic": self.topic, "assumes": self.assumes, "showed": self.showed, "verdict": self.verdict.value,
                "meaning": self.meaning}


def ok(topic: str, assumes: str, showed: str, meaning: str = "") -> Row:
    return Row(topic=topic, assumes=assumes, showed=showed, verdict=Verdict.OK, meaning=meaning)


def different(topic: str, assumes: str, showed: str, meaning: str) -> Row:
    return Row(topic=topic, assumes=assumes, showed=showed, verdict=Verdict.DIFFERENT, meaning=meaning)


def unchecked(topic: str, assumes: str, why: str, meaning: str = "") -> Row:
    return Row(topic=topic, assumes=assumes, showed=why, verdict=Verdict.UNCHECKED, meaning=meaning)


@dataclass(kw_only=True)
class CheckResult:
    """Everything one `check` found; saved as the profile `key` in the state folder."""

    backend: str
    key: str  # the profile's name: org-ace, slurm-cluster, local-host
    target: dict[str, str]  # what was checked, e.g. {"org": ..., "ace": ...}
    pipeline: str | None
    checked_at: float
    rows: list[Row] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # what the backend may adapt to (backends/profile.py)
    notes: list[str] = field(default_factory=list)  # printed before the table (e.g. what probe jobs cost)

    def count(self, verdict: Verdict) -> int:
        return sum(1 for row in self.rows if row.verdict is verdict)

    def as_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "key": self.key, "target": self.target, "pipeline": self.pipeline,
                "checked_at": self.checked_at, "rows": [row.as_json() for row in self.rows], "facts": self.facts,
                "notes": self.notes,
                "summary": {v.value: self.count(v) for v in Verdict}}
