"""The checks a chaos run must pass, each a pure function of what the runs left behind.

* outputs: every file under a final name in the chaos run's workspace is byte-identical to the clean run's, and
  the two runs have the same final names (a file torn by a kill and left under its final name fails here);
* verification: every selected stage succeeded with found == expected in every check, the clean run's counts;
* one live job per stage: the samples of the backend's records taken during the run, plus the intervals the
  records hold afterwards;
* temporaries: hidden `.NAME.tmp-HOST-PID` files (stages/_common.py `temp_path_for`) are counted, never compared:
  a killed rank leaves one, and a rerun of its shard removes it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from bcp_pipeline.engine.state import RunState, StageStatus


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    problems: list[str] = field(default_factory=list)


def final_files(root: Path, ignore: list[str]) -> dict[str, Path]:
    """Files under `root` by relative path, leaving out hidden names (temporaries, completion records, manifests
    of hidden folders) and paths matching an `ignore` pattern."""
    found = {}
    for path in root.rglob("*"):
        relative = path.relative_to(root).as_posix()
        if any(part.startswith(".") for part in relative.split("/")) or not path.is_file():
            continue
        if any(fnmatch(relative, pattern) for pattern in ignore):
            continue
        found[relative] = path
    return found


def temporaries(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob(".*.tmp-*") if p.is_file())


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def check_outputs(clean: Path, chaos: Path, ignore: list[str]) -> tuple[Check, Check]:
    """(the .bin/.idx pairs identical, every final name identical and no stray final name)."""
    want, got = final_files(clean, ignore), final_files(chaos, ignore)
    differ = [name for name in sorted(want.keys() & got.keys()) if _digest(want[name]) != _digest(got[name])]
    missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    indexed = sorted(name for name in want if name.endswith((".bin", ".idx")))
    bad_indexed = [n for n in indexed if n in differ or n in missing]
    extra_indexed = [n for n in extra if n.endswith((".bin", ".idx"))]
    bin_idx = Check(
        ".bin/.idx byte-identical to the clean run",
        not bad_indexed and not extra_indexed,
        f"{len(indexed) - len(bad_indexed)} of {len(indexed)} files"
        + ("" if indexed else " (the stages run write none)"),
        [f"differs or missing: {n}" for n in bad_indexed] + [f"not in the clean run: {n}" for n in extra_indexed],
    )
    problems = (
        [f"differs: {n}" for n in differ]
        + [f"missing: {n}" for n in missing]
        + [f"not in the clean run: {n}" for n in extra]
    )
    finals = Check(
        "every final name complete (identical to the clean run)",
        not problems,
        f"{len(got)} files compared; {len(temporaries(chaos))} hidden temporaries left",
        problems,
    )
    return bin_idx, finals


def verification_counts(state: RunState) -> dict[str, list[tuple[str, int, int]]]:
    """stage -> [(glob's last part, expected, found)] from the run's recorded verification results."""
    counts = {}
    for name, stage in state.stages.items():
        if stage.status is StageStatus.SKIPPED:
            continue
        checks = (stage.verification or {}).get("checks", [])
        counts[name] = [(c["glob"].rsplit("/", 1)[-1], int(c["expected"]), int(c["found"])) for c in checks]
    return counts


def check_verification(clean: RunState, chaos: RunState) -> Check:
    problems = []
    for name, stage in chaos.stages.items():
        if stage.status is StageStatus.SKIPPED:
            continue
        if stage.status is not StageStatus.SUCCEEDED:
            problems.append(f"{name}: {stage.status.value}: {stage.error}")
    want, got = verification_counts(clean), verification_counts(chaos)
    for name, checks in got.items():
        problems += [
            f"{name}: {glob}: expected {expected}, found {found}"
            for glob, expected, found in checks
            if found != expected
        ]
        if checks != want.get(name):
            problems.append(f"{name}: counts {checks} differ from the clean run's {want.get(name)}")
    total = sum(len(c) for c in got.values())
    return Check("verification counts exact", not problems, f"{total} checks over {len(got)} stages", problems)


def check_one_live_job(samples: int, overlaps: list[str], intervals: list[tuple[str, str, float, float]]) -> Check:
    """No stage had two live jobs: from the samples taken during the run and the finished jobs' intervals."""
    problems = list(dict.fromkeys(overlaps))  # each overlap once, in the order seen
    by_stage: dict[str, list[tuple[float, float, str]]] = {}
    for stage, job_id, start, end in intervals:
        by_stage.setdefault(stage, []).append((start, end, job_id))
    for stage, spans in by_stage.items():
        spans.sort()
        for (_start_a, end_a, job_a), (start_b, _end_b, job_b) in zip(spans, spans[1:]):
            if start_b < end_a:
                problems.append(f"{stage}: {job_b} started {end_a - start_b:.3f} s before {job_a} ended")
    return Check(
        "at most one live job per stage",
        not problems,
        f"{samples} samples of the backend's records, {len(intervals)} finished jobs' intervals",
        problems,
    )
