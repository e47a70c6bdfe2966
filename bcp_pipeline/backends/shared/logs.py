"""Reading jobs' logs alike on every backend: the stage programs' machine-readable lines, progress summed over
ranks, a training's steps and loss, log tails, and several log files shown as one."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bcp_pipeline.backends.contract import JobProgress
from bcp_pipeline.training_log import RANK_LINE_PREFIX, last_progress

LINE_PREFIX = "##bcp-pipeline "  # the stage programs' machine-readable lines (stages/_common.py)


def parse_lines(text: str, kind: str) -> list[dict[str, Any]]:
    """Every `##bcp-pipeline KIND {json}` payload in `text`, in order (bad JSON is ignored: logs get cut)."""
    found = []
    marker = f"{LINE_PREFIX}{kind} "
    for line in text.splitlines():
        index = line.find(marker)
        if index < 0:
            continue
        try:
            found.append(json.loads(line[index + len(marker) :]))
        except ValueError:
            continue
    return found


def progress_from_logs(texts: list[str], *, training: bool = False) -> JobProgress | None:
    """Sum the last progress line of each rank: items done of total across the job. For a training job, the
    steps and loss of the rank that logs them (rank 0 for NeMo and the smoke pretrain; the LAST rank for
    Megatron-Bridge, which prints from there only), looked for from the last text back."""
    if training:
        for text in reversed(texts):
            if (found := training_progress(text)) is not None:
                return found
    # Each rank counted once, at its last line: a log may carry several ranks (a pod's processes), and one rank
    # may appear in several logs (an index's replaced pod before its successor's; the texts come oldest first).
    latest: dict[object, dict[str, Any]] = {}
    for index, text in enumerate(texts):
        for line in parse_lines(text, "progress"):
            latest[line.get("rank", ("log", index))] = line
    if not latest:
        return None
    lines = list(latest.values())
    return JobProgress(
        done=sum(int(line.get("done", 0)) for line in lines),
        total=sum(int(line.get("total", 0)) for line in lines),
        unit=str(lines[-1].get("unit", "items")),
    )


def training_progress(text: str) -> JobProgress | None:
    """A training job's steps done (of its total, where the log says) and last loss, from its rank 0 log."""
    found = last_progress(text)
    if found is None:
        return None
    return JobProgress(
        done=found.steps_done, total=found.total or 0, unit="steps", loss=found.loss, step_seconds=found.step_seconds
    )


def rank_lines(text: str, rank: int) -> str | None:
    """The lines of rank `rank` in a log several ranks share, their `[rankN]:` prefix (RANK_LINE_PREFIX) taken off;
    None where no line of `text` carries a rank prefix (a log written without them: the caller shows it whole)."""
    found, prefixed = [], False
    for line in text.splitlines():
        match = RANK_LINE_PREFIX.match(line)
        if match:
            prefixed = True
            if int(match.group(1)) == rank:
                found.append(line[match.end() :])
    return "\n".join(found) if prefixed else None


def joined_logs(paths: list[Path], tail: int | None) -> str:
    """Log files as one text (each headed `==> NAME <==` where there are several); `tail` keeps each one's last
    lines. What `logs` shows on the backends whose logs are files here."""
    parts = []
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        text = last_lines(text, tail) if tail else text
        parts.append(text if len(paths) == 1 else f"==> {path.name} <==\n{text}")
    return "\n".join(parts)


def follow_files(
    paths: Callable[[], list[Path]], running: Callable[[], bool], *, tail: int | None = None, interval: float = 0.5
) -> Iterator[str]:
    """`logs --follow` where a job's logs are files here: their lines as they are written (a file that appears, a
    rank starting, is read from its start; with `tail`, every file from its last `tail` lines), until `running()`
    says the job ended and every file is read to its end. Lines of several files are each headed `[NAME] `."""
    offsets: dict[Path, int] = {}
    partial: dict[Path, bytes] = {}
    while True:
        ended = not running()  # asked first: what was written before the job ended is read below
        files = paths()
        for path in files:
            if path not in offsets:
                offsets[path] = tail_offset(path, tail) if tail else 0
            try:
                with open(path, "rb") as handle:
                    handle.seek(offsets[path])
                    chunk = handle.read()
            except OSError:
                continue
            offsets[path] += len(chunk)
            *lines, partial[path] = (partial.get(path, b"") + chunk).split(b"\n")
            if ended and partial[path]:  # the last line, without its newline
                lines, partial[path] = [*lines, partial[path]], b""
            head = f"[{path.name}] " if len(files) > 1 else ""
            for line in lines:
                yield head + line.decode("utf-8", errors="replace")
        if ended:
            return
        time.sleep(interval)


def job_running(backend: Any, job_id: str) -> bool:
    """Whether the job still runs as its backend's poll tells (a job it no longer knows has ended)."""
    status = backend.poll([job_id]).get(job_id)
    return status is not None and not status.state.finished


def tail_offset(path: Path, count: int) -> int:
    """Where the last `count` lines of a file start (0 for a shorter or unreadable one)."""
    try:
        data = path.read_bytes()
    except OSError:
        return 0
    data = data.rstrip(b"\n")
    start = len(data)
    for _ in range(count):
        start = data.rfind(b"\n", 0, start)
        if start < 0:
            return 0
    return start + 1


def read_tail(path: Path, max_bytes: int = 65536) -> str:
    """The end of a (possibly huge) log file."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            return handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def last_lines(text: str, count: int) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-count:])


def indent(text: str, prefix: str = "    ") -> str:
    """`text` with every line indented: a log excerpt inside a failure's explanation."""
    return "\n".join(f"{prefix}{line}" for line in text.splitlines())


TRACEBACK_HEAD = "Traceback (most recent call last):"
# torchrun's own traceback follows its failed worker's: it says only that a child failed, never why.
LAUNCHER_TRACEBACK_ENDS = ("ChildFailedError:",)


def last_traceback(text: str, max_lines: int = 40) -> str | None:
    """The last Python traceback in a log that says why it failed, through its exception line (its last
    `max_lines` lines where longer): what a crashed training says about itself, where the log's tail holds only
    its launcher's summary (torchrun's "Root Cause" table) and the launcher's own traceback."""
    # A pod's ranks share its log, each line headed `[rankN]:` (RANK_LINE_PREFIX): the frames' indentation is
    # after it.
    lines = [RANK_LINE_PREFIX.sub("", line, count=1) for line in text.splitlines()]
    blocks = []
    # A head may follow other text on its line: a progress bar redrawn without a newline (Lightning's, on stdout)
    # and the traceback on stderr share the line where both reach one log.
    for start in (i for i, line in enumerate(lines) if line.rstrip().endswith(TRACEBACK_HEAD)):
        block = [TRACEBACK_HEAD]
        for line in lines[start + 1 :]:
            block.append(line)
            if line and not line[0].isspace():  # the exception line ends the frames
                break
        blocks.append(block)
    if not blocks:
        return None
    causes = [b for b in blocks if not any(end in b[-1] for end in LAUNCHER_TRACEBACK_ENDS)]
    block = (causes or blocks)[-1]
    return "\n".join(block[-max_lines:] if len(block) > max_lines else block)


# torchrun's failure summary: "Root Cause (first observed failure):" then, among its fields, "rank : N (local_rank: M)"
TORCHRUN_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?^\s*rank\s*:\s*(\d+)", re.M | re.S)


def failed_rank_lines(text: str, max_lines: int = 15) -> tuple[int, str] | None:
    """The rank torchrun's summary names as the first to fail, and its last `max_lines` lines in a log whose ranks
    head their lines `[rankN]:`: what that rank said last (an error printed without a traceback, an exit), where
    the log's tail holds only torchrun's summary. None where the log has no such summary or no such rank's lines."""
    found = TORCHRUN_ROOT_CAUSE.search(text)
    if found is None:
        return None
    rank = int(found.group(1))
    own = rank_lines(text, rank)
    return (rank, last_lines(own, max_lines)) if own and own.strip() else None


def why_it_failed(log: str, whose: str, tail: int = 15) -> list[str]:
    """What a failed job's log says of why, for its failure detail (`whose`: e.g. "pod P's", "replica 1's"): the
    last traceback of the program itself where the log's last `tail` lines do not already hold it; else, where
    only torchrun's summary and its own traceback are there, the last lines of the rank it names first to fail;
    else a launcher's traceback alone; then the log's last `tail` lines."""
    found = []
    traceback = last_traceback(log)
    own = traceback is not None and not any(end in traceback.splitlines()[-1] for end in LAUNCHER_TRACEBACK_ENDS)
    failed_rank = None if own else failed_rank_lines(log, tail)
    if failed_rank is not None:
        found.append(
            f"the last lines of rank {failed_rank[0]}, the first to fail, in {whose} log:\n" + indent(failed_rank[1])
        )
    elif traceback and traceback not in last_lines(log, tail):
        found.append(f"the last traceback in {whose} log:\n" + indent(traceback))
    return [*found, f"last lines of {whose} log:\n" + indent(last_lines(log, tail))]
