#!/usr/bin/env python3
"""Scale benchmark: `slimpajama-8b-sim` (SlimPajama's real cardinality, tiny documents) on the local backend,
per stage, beside the guide's own tools at the same cardinality. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_scale.py [--workdir DIR] [--skip-guide]

Per stage: the job's wall time (submit to end, start-up and the orchestrator's poll interval included), the ranks'
working span (from their completion records: first start to last finish) and milliseconds per file over that span
(the documents are a few dozen bytes, so this is the per-file cost),
the verification job's time, and the peak RSS of the stage's processes; for the orchestrator its peak RSS and CPU
seconds; then `status` and `plan` latency on the finished run (each a fresh `bcp-pipeline` process, as a user
runs it). RSS is sampled from /proc every 0.2 s (VmHWM, so a process's peak is seen if it lives one sample).

The guide's tools run on the same files with the same parallelism (2 processes): `curl` per file from the
file:// mirror, one `unzstd` per file, `cat` in groups of 800; each also with the `sync` that gives them the
durability the stages have (they fsync every output before its rename).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PIPELINE = "slimpajama-8b-sim"
PARALLEL = 2  # the sim's stages run 2 processes; the guide's tools get the same
GROUP = 800
STAGE_PROGRAMS = {
    "sample": "sample.py",
    "bpe": "gpt2_files.py",
    "download": "download.py",
    "extract": "extract.py",
    "concat": "concat.py",
    "tokenize-preprocess": "preprocess.py",
}


class Sampler(threading.Thread):
    """Peak RSS per program (by its stages/ path in the command line) and the orchestrator's RSS and CPU time."""

    def __init__(self, orchestrator: int, stages_dir: Path) -> None:
        super().__init__(daemon=True)
        self.orchestrator, self.stages_dir = orchestrator, str(stages_dir)
        self.peak_kb: dict[str, int] = {}
        self.orchestrator_kb = 0
        self.orchestrator_cpu = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        ticks = os.sysconf("SC_CLK_TCK")
        while not self.stop.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    status = Path(f"/proc/{pid}/status").read_text()
                    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                hwm = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
                if int(pid) == self.orchestrator:
                    self.orchestrator_kb = max(self.orchestrator_kb, hwm)
                    self.orchestrator_cpu = (int(stat[11]) + int(stat[12])) / ticks
                    continue
                for part in cmdline:
                    text = part.decode(errors="replace")
                    if text.startswith(self.stages_dir):
                        name = Path(text).name
                        self.peak_kb[name] = max(self.peak_kb.get(name, 0), hwm)
                        break
            self.stop.wait(0.2)


def run_sim(work: Path) -> tuple[dict, Sampler, float]:
    config = work / "pipelines.yaml"
    command = [sys.executable, "-m", "bcp_pipeline", "--config", str(config), "run", PIPELINE, "--restart"]
    started = time.monotonic()
    with open(work / "run.log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=work)
        sampler = Sampler(process.pid, work / "stages")
        sampler.start()
        code = process.wait()
    wall = time.monotonic() - started
    sampler.stop.set()
    sampler.join()
    if code != 0:
        sys.exit(f"bench_scale: the sim run failed (exit {code}); see {work / 'run.log'}")
    runs = sorted((work / ".bcp-pipeline" / "runs").iterdir())
    return json.loads((runs[-1] / "state.json").read_text()), sampler, wall


def latency(work: Path, *args: str, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "bcp_pipeline", "--config", str(work / "pipelines.yaml"), *args],
            check=True,
            capture_output=True,
        )
        best = min(best, time.monotonic() - started)
    return best


def timed(fn) -> tuple[float, float]:
    """(seconds for fn, seconds for fn then `sync`)."""
    started = time.monotonic()
    fn()
    tool = time.monotonic() - started
    subprocess.run(["sync"], check=True)
    return tool, time.monotonic() - started


def xargs(lines: list[str], per_call: int, *command: str) -> None:
    subprocess.run(
        ["xargs", "-P", str(PARALLEL), "-n", str(per_call), *command],
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
    )


def guide_tools(mirror: Path, out: Path) -> dict[str, tuple[float, float, int]]:
    """The guide's shapes on the sim's mirror: per stage (tool s, tool+sync s, files)."""
    sources = sorted(mirror.glob("train/chunk*/*.jsonl.zst"))
    zst = out / "zst"
    pairs = [f"{zst / p.parent.name / p.name} file://{p}" for p in sources]
    results = {"download": (*timed(lambda: xargs(pairs, 2, "curl", "-s", "--create-dirs", "-o")), len(sources))}
    downloaded = sorted(zst.glob("chunk*/*.jsonl.zst"))
    results["extract"] = (*timed(lambda: xargs([str(p) for p in downloaded], 1, "unzstd", "-q")), len(downloaded))
    jsonl = sorted(zst.glob("chunk*/*.jsonl"))
    train = out / "train"
    train.mkdir(parents=True)

    def concat() -> None:
        groups = [jsonl[i : i + GROUP] for i in range(0, len(jsonl), GROUP)]
        running: list[subprocess.Popen] = []
        for index, group in enumerate(groups):
            while len(running) >= PARALLEL:
                running.pop(0).wait()
            with open(train / f"train_chunk_{index}.jsonl", "wb") as target:
                running.append(subprocess.Popen(["cat", *map(str, group)], stdout=target))
        for process in running:
            process.wait()

    results["concat"] = (*timed(concat), len(jsonl))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="keep everything here (default: a temporary folder, removed)")
    parser.add_argument("--skip-guide", action="store_true", help="do not run the guide's tools")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    try:
        work.mkdir(parents=True, exist_ok=True)
        for stale in (".bcp-pipeline", "guide"):  # a rerun in the same folder starts from nothing
            shutil.rmtree(work / stale, ignore_errors=True)
        shutil.copy(REPO / "pipelines.yaml", work / "pipelines.yaml")
        shutil.rmtree(work / "stages", ignore_errors=True)
        shutil.copytree(REPO / "stages", work / "stages", ignore=shutil.ignore_patterns("__pycache__"))
        print(f"bench_scale: {PIPELINE} in {work} on {os.cpu_count()} cores ...", flush=True)
        state, sampler, wall = run_sim(work)
        status_s = latency(work, "status", state["run_id"])
        plan_s = latency(work, "plan", PIPELINE)
        guide = {}
        workspace = work / ".bcp-pipeline" / "workspaces" / "sim"
        spans = working_spans(workspace)
        if not args.skip_guide:
            guide = guide_tools(workspace / "mirror", work / "guide")
        report(state, spans, sampler, wall, status_s, plan_s, guide)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def working_spans(workspace: Path) -> dict[str, float]:
    """Per stage: first rank start to last rank finish, from the completion records the ranks write last."""
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    for path in workspace.rglob(".completions/*.json"):
        record = json.loads(path.read_text())
        stage = record["stage"]
        starts[stage] = min(starts.get(stage, float("inf")), record.get("started_at", record["finished_at"]))
        ends[stage] = max(ends.get(stage, 0.0), record["finished_at"])
    return {stage: ends[stage] - starts[stage] for stage in ends}


def report(
    state: dict,
    spans: dict[str, float],
    sampler: Sampler,
    wall: float,
    status_s: float,
    plan_s: float,
    guide: dict[str, tuple[float, float, int]],
) -> None:
    rows = [
        (
            "STAGE",
            "FILES",
            "JOB s",
            "SPAN s",
            "MS/FILE",
            "VERIFY s",
            "PEAK RSS MB",
            "GUIDE TOOL MS/FILE",
            "+SYNC",
            "RATIO (TOOL+SYNC / SPAN)",
        )
    ]
    for name, stage in state["stages"].items():
        jobs = {job["kind"]: job for job in stage["jobs"]}
        stage_job, verify_job = jobs.get("stage"), jobs.get("verify")
        job_s = stage_job["ended_at"] - stage_job["submitted_at"] if stage_job else 0.0
        seconds = spans.get(name, spans.get(name.split("-")[-1], job_s))
        verify_s = verify_job["ended_at"] - verify_job["submitted_at"] if verify_job else 0.0
        files = (stage.get("progress") or {}).get("total") or 0
        if name == "concat":  # its progress counts outputs; its per-file cost is per input file
            files = (state["stages"]["extract"].get("progress") or {}).get("total") or files
        per_file = 1000 * seconds / files if files else None
        rss = sampler.peak_kb.get(STAGE_PROGRAMS.get(name, ""), 0) / 1024
        tool = guide.get(name)
        tool_ms = f"{1000 * tool[0] / tool[2]:.3f}" if tool else "-"
        sync_ms = f"{1000 * tool[1] / tool[2]:.3f}" if tool else "-"
        ratio = f"{tool[1] / seconds:.2f}" if tool and seconds else "-"
        rows.append(
            (
                name,
                f"{files:,}",
                f"{job_s:.1f}",
                f"{seconds:.2f}",
                f"{per_file:.3f}" if per_file else "-",
                f"{verify_s:.1f}",
                f"{rss:.0f}",
                tool_ms,
                sync_ms,
                ratio,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print()
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    print(
        f"\nwhole run: {wall:.0f} s wall; orchestrator peak RSS {sampler.orchestrator_kb / 1024:.0f} MB, "
        f"{sampler.orchestrator_cpu:.1f} CPU s"
    )
    print(
        f"on the finished run: `status` {status_s:.2f} s, `plan {PIPELINE}` {plan_s:.2f} s "
        "(best of 3, each a new process)"
    )
    print("RATIO > 1: the guide's tool (with the sync that matches our durability) took longer than the stage")


if __name__ == "__main__":
    sys.exit(main())
