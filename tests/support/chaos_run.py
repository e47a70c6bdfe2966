"""A pipeline run to completion under a seeded chaos monkey, checked against a clean run of the same pipeline.

`tests/chaos` is the command-line entry point; `tests/e2e/test_chaos.py` runs a short seeded run in CI. The steps:
1. a clean run of the pipeline in its own project folder (kept under --workdir and reused while the config, the
   stage programs and the options are the same), for the reference bytes and counts;
2. the chaos run in a fresh project folder: the orchestrator runs as a subprocess, and while it runs the monkey
   (tests/support/chaos_monkey.py) SIGKILLs, at random moments, what the backend offers
   (tests/support/chaos_backends.py): stage ranks, verification jobs, job supervisors, the orchestrator itself,
   and on the emulated BCP and Slurm, jobs through the service. When the orchestrator ends short of success
   (killed, or a stage failed), `resume` continues the run (or `run` again, when it was killed before it recorded
   the run). A stage that downloads from a `file://` mirror is pointed at a loopback HTTP server over the same
   folder that answers 429 / 500, drops connections mid-body and sends short bodies at random;
3. the checks of tests/support/chaos_checks.py, and a table of what happened.
"""

from __future__ import annotations

import collections
import hashlib
import json
import random
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from support.chaos_backends import ChaosBackend, LocalChaos
from support.chaos_bcp import BcpChaos
from support.chaos_checks import Check, check_one_live_job, check_outputs, check_verification
from support.chaos_monkey import HTTP_FAULTS, ChaosHttpSource, Monkey
from support.chaos_slurm import SlurmChaos

from bcp_pipeline.config.load import load_config
from bcp_pipeline.config.placeholders import substitute
from bcp_pipeline.engine.state import RunState, RunStore

REPO = Path(__file__).resolve().parents[2]
BACKENDS: dict[str, type[ChaosBackend]] = {"local": LocalChaos, "bcp": BcpChaos, "slurm": SlurmChaos}


@dataclass(kw_only=True)
class ChaosOptions:
    pipeline: str = "demo"
    backend: str = "local"
    seed: int = 0
    kills: int = 5
    kinds: list[str] | None = None  # kill kinds; default: all the backend offers, and the orchestrator
    faults: list[str] = field(default_factory=lambda: sorted(HTTP_FAULTS))
    fault_rate: float = 0.2  # share of HTTP requests answered with a fault
    only: list[str] = field(default_factory=list)  # `run --only` stages (default: the whole pipeline)
    overrides: list[str] = field(default_factory=list)  # `run --set` values, for both runs
    gap: tuple[float, float] = (0.3, 2.0)  # seconds between kills (uniform)
    max_rounds: int = 0  # orchestrator runs before giving up; 0: 3 per kill + 10
    timeout: float = 3600.0
    ignore: list[str] = field(default_factory=lambda: ["results/*"])  # workspace paths not compared
    config: Path = REPO / "pipelines.yaml"
    workdir: Path = REPO / ".bcp-pipeline" / "chaos"
    echo: bool = True  # print each kill and round as it happens


@dataclass
class RunRecord:
    """What one driven run (clean or chaos) left: its project, final state and figures."""

    project: Path
    state: RunState | None = None
    wall: float = 0.0
    rounds: int = 0
    resumes: int = 0
    exits: collections.Counter = field(default_factory=collections.Counter)
    http_requests: int = 0
    http_retried: int = 0
    faults: collections.Counter = field(default_factory=collections.Counter)
    kills: collections.Counter = field(default_factory=collections.Counter)
    samples: int = 0
    overlaps: list[str] = field(default_factory=list)
    intervals: list = field(default_factory=list)
    left_alive: dict = field(default_factory=dict)
    workspace: Path | None = None
    timed_out: bool = False


@dataclass
class ChaosReport:
    options: ChaosOptions
    clean: RunRecord
    chaos: RunRecord
    checks: list[Check]
    clean_cached: bool

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


def make_project(folder: Path, config: Path, backend_options: dict | None = None) -> Path:
    """A project folder with a copy of `config` whose `stages_dir` points at the original stage programs, and
    whose `backends:` gets `backend_options` (the emulated BCP's short poll intervals)."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(config.read_text())  # anchors and merge keys resolved: the copy needs neither
    raw["stages_dir"] = str((config.parent / raw.get("stages_dir", "stages")).resolve())
    for name, options in (backend_options or {}).items():
        raw.setdefault("backends", {}).setdefault(name, {}).update(options)
    (folder / "pipelines.yaml").write_text(yaml.safe_dump(raw, sort_keys=False, width=120))
    return folder


def http_mirror(backend: ChaosBackend, options: ChaosOptions) -> tuple[Path, list[tuple[str, list[str], int]]] | None:
    """The local folder of the pipeline's `file://` mirror, and each download stage's args with the index of the
    URL to replace: those stages are pointed at a loopback HTTP server over that folder. None: no such stage."""
    config = load_config(backend.config, overrides=options.overrides, pipeline=options.pipeline)
    pipeline = config.pipeline(options.pipeline)
    values = {"workspace": str(backend.workspace())}
    values.update({k: substitute(v, values) for k, v in pipeline.vars.items()})
    roots, stages = set(), []
    for name, stage in pipeline.stages.items():
        if options.only and name not in options.only:
            continue
        args = list(stage.args)
        if stage.program != "download.py" or "--base-url" not in args[:-1]:
            continue
        index = args.index("--base-url") + 1
        if not args[index].startswith("file://"):
            continue
        roots.add(backend.host_path(substitute(args[index][len("file://") :], values)))
        stages.append((name, args, index))
    if not stages:
        return None
    if len(roots) > 1:
        raise SystemExit(f"chaos: download stages read from {len(roots)} different mirrors; one is supported")
    return roots.pop(), stages


def url_overrides(stages: list[tuple[str, list[str], int]], url: str) -> list[str]:
    overrides = []
    for name, args, index in stages:
        args = [*args[:index], url, *args[index + 1 :]]
        overrides.append(f"{name}.args={json.dumps(args)}")  # JSON is YAML: every value stays a quoted string
    return overrides


def state_of(project: Path) -> RunState | None:
    return RunStore(project / ".bcp-pipeline").latest()


def finished(state: RunState | None) -> bool:
    return state is not None and all(s.status.done for s in state.stages.values())


class Sampler(threading.Thread):
    """Reads the backend's records every few milliseconds and notes every moment a stage had two live jobs."""

    def __init__(self, backend: ChaosBackend, seconds: float) -> None:
        super().__init__(name="chaos-sampler", daemon=True)
        self.backend = backend
        self.seconds = seconds
        self.samples = 0
        self.overlaps: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.seconds):
            try:
                live = self.backend.live_jobs()
            except Exception as exc:  # noqa: BLE001 - a sample that cannot be read is noted, not fatal
                self.overlaps.append(f"could not read the backend's records: {exc}")
                continue
            self.samples += 1
            for stage, jobs in sorted(live.items()):
                if len(jobs) > 1:
                    self.overlaps.append(f"{stage}: jobs {', '.join(sorted(jobs))} alive at once")


def drive(
    backend: ChaosBackend, options: ChaosOptions, monkey: Monkey | None, fault_rate: float, label: str
) -> RunRecord:
    """Run the pipeline in `backend.project` to its end (resuming after every stop), under `monkey` if given."""
    backend.start()
    record = RunRecord(project=backend.project, workspace=backend.workspace())
    mirror = http_mirror(backend, options)
    server = None
    overrides = list(options.overrides)
    if mirror is not None:
        server = ChaosHttpSource(mirror[0], random.Random(f"{options.seed}-http"), fault_rate, options.faults).start()
        overrides += url_overrides(mirror[1], server.url)
    cli = [sys.executable, "-m", "bcp_pipeline", "--config", str(backend.config)]
    run_argv = [*cli, "run", options.pipeline, "--backend", backend.name]
    run_argv += [a for stage in options.only for a in ("--only", stage)]
    run_argv += [a for value in overrides for a in ("--set", value)]
    argv = run_argv
    max_rounds = options.max_rounds or 3 * options.kills + 10
    sampler = Sampler(backend, backend.sample_seconds)
    sampler.start()
    started = time.monotonic()
    deadline = started + options.timeout
    try:
        with open(backend.project / "orchestrator.log", "ab") as log:
            while True:
                record.rounds += 1
                log.write(f"\n### round {record.rounds}: {' '.join(argv[3:])}\n".encode())
                log.flush()
                process = subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=backend.project,
                    env=backend.env(),
                )
                backend.orchestrator = process
                while process.poll() is None:
                    if monkey is not None and (kill := monkey.tick(backend.targets)) is not None:
                        note = f"[{label} {kill.at:6.1f}s] round {record.rounds}: {kill.kind}: {kill.name}"
                        log.write(f"### {note}\n".encode())
                        if options.echo:
                            print(note, flush=True)
                    if time.monotonic() > deadline:
                        process.kill()
                        record.timed_out = True
                    time.sleep(0.02)
                record.exits[process.returncode] += 1
                state = state_of(backend.project)
                if process.returncode == 0 and finished(state):
                    break
                if record.timed_out or record.rounds >= max_rounds:
                    break
                if state is None:  # killed before it recorded its run (a slow start under load): nothing to resume
                    argv = run_argv
                    continue
                record.resumes += 1
                argv = [*cli, "resume"]
        record.wall = time.monotonic() - started
    finally:
        if backend.orchestrator is not None and backend.orchestrator.poll() is None:
            backend.orchestrator.kill()  # stopped early (a signal, an error): leave no orchestrator behind
            backend.orchestrator.wait()
        sampler.stop.set()
        sampler.join()
        if server is not None:
            server.stop()
    record.state = state_of(backend.project)
    record.samples, record.overlaps = sampler.samples, sampler.overlaps
    record.intervals = backend.job_intervals()
    record.left_alive = {stage: sorted(jobs) for stage, jobs in backend.live_jobs().items()}
    if server is not None:
        record.http_requests = sum(server.requests.values())
        record.http_retried = server.retried_requests
        record.faults.update({f"HTTP {kind}": n for kind, n in server.injected.items()})
    if monkey is not None:
        record.kills = monkey.counts()
    return record


def clean_key(options: ChaosOptions) -> str:
    """Same key, same clean run: the config, the stage programs and the options that change outputs."""
    digest = hashlib.sha256(options.config.read_bytes())
    for path in sorted((REPO / "stages").glob("*.py")):
        digest.update(path.read_bytes())
    digest.update(json.dumps([options.pipeline, options.backend, options.only, options.overrides]).encode())
    return digest.hexdigest()[:12]


def open_backend(folder: Path, options: ChaosOptions, *, fresh: bool) -> ChaosBackend:
    """The chaos backend of a project folder; `fresh` makes the folder anew (a copy of the config)."""
    kind = BACKENDS[options.backend]
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
        make_project(folder, options.config, kind.config_options)
    return kind(folder, options.pipeline)


def clean_run(options: ChaosOptions) -> tuple[RunRecord, bool]:
    """The reference run, reused from --workdir when one with the same key succeeded."""
    folder = options.workdir / f"clean-{options.pipeline}-{options.backend}-{clean_key(options)}"
    state = state_of(folder)
    figures = folder / "clean-run.json"
    if finished(state) and figures.is_file():
        backend = open_backend(folder, options, fresh=False)
        wall = json.loads(figures.read_text())["wall_seconds"]
        return RunRecord(project=folder, state=state, workspace=backend.workspace(), wall=wall), True
    backend = open_backend(folder, options, fresh=True)
    try:
        record = drive(backend, options, None, 0.0, "clean")
    finally:
        backend.close()
    if finished(record.state):
        figures.write_text(json.dumps({"wall_seconds": record.wall}))
    return record, False


def chaos_run(options: ChaosOptions) -> ChaosReport:
    options.workdir.mkdir(parents=True, exist_ok=True)
    clean, cached = clean_run(options)
    if not finished(clean.state):
        raise SystemExit(
            f"chaos: the clean run of {options.pipeline} did not succeed; see {clean.project / 'orchestrator.log'}"
        )
    stamp = time.strftime("%H%M%S")
    backend = open_backend(
        options.workdir / f"chaos-{options.pipeline}-{options.backend}-seed{options.seed}-{stamp}", options, fresh=True
    )
    try:
        kinds = options.kinds or [*backend.kinds, "orchestrator"]
        unknown = sorted(set(kinds) - {*backend.kinds, "orchestrator"})
        if unknown:
            raise SystemExit(
                f"chaos: the {backend.name} backend has no target of kind {', '.join(unknown)}; "
                f"kinds: {', '.join([*backend.kinds, 'orchestrator'])}"
            )
        monkey = Monkey(rng=random.Random(options.seed), kinds=sorted(kinds), total=options.kills, gap=options.gap)
        chaos = drive(backend, options, monkey, options.fault_rate, "chaos")
        chaos.faults.update(backend.faults())
    finally:
        backend.close()
    return ChaosReport(options, clean, chaos, checks(options, clean, chaos), cached)


def checks(options: ChaosOptions, clean: RunRecord, chaos: RunRecord) -> list[Check]:
    kills = sum(chaos.kills.values())
    done = Check(
        "run finished",
        finished(chaos.state) and not chaos.timed_out,
        f"{chaos.rounds} rounds" + (", timed out" if chaos.timed_out else ""),
        []
        if finished(chaos.state)
        else [f"{n}: {s.status.value}" for n, s in chaos.state.stages.items() if not s.status.done]
        if chaos.state
        else ["no run state"],
    )
    asked = Check(
        "kills as asked",
        kills >= options.kills,
        f"{kills} of {options.kills}",
        [] if kills >= options.kills else ["the run ended before every kill was made"],
    )
    assert clean.workspace is not None and chaos.workspace is not None
    bin_idx, finals = check_outputs(clean.workspace, chaos.workspace, options.ignore)
    counts = (
        check_verification(clean.state, chaos.state)
        if chaos.state
        else Check("verification counts exact", False, "no run state")
    )
    overlaps = list(chaos.overlaps) + [
        f"{stage}: {', '.join(jobs)} still alive after the run" for stage, jobs in chaos.left_alive.items()
    ]
    live = check_one_live_job(chaos.samples, overlaps, chaos.intervals)
    return [done, asked, bin_idx, counts, live, finals]


def retries(state: RunState | None) -> tuple[int, int]:
    """(stage jobs submitted again, verification jobs run again) in a run's state."""
    if state is None:
        return 0, 0
    stage_jobs = sum(max(0, s.attempts - 1) for s in state.stages.values())
    verify_jobs = sum(max(0, len([j for j in s.jobs if j.kind == "verify"]) - 1) for s in state.stages.values())
    return stage_jobs, verify_jobs


def table(report: ChaosReport) -> str:
    options, clean, chaos = report.options, report.clean, report.chaos
    stage_retries, verify_retries = retries(chaos.state)
    kills = ", ".join(f"{kind} {n}" for kind, n in sorted(chaos.kills.items())) or "none"
    faults = ", ".join(f"{kind} {n}" for kind, n in sorted(chaos.faults.items())) or "none"
    stages = ", ".join(options.only) if options.only else "all"
    rows = [
        ("pipeline / backend / seed", f"{options.pipeline} / {options.backend} / {options.seed} (stages: {stages})"),
        (
            "rounds (orchestrator runs)",
            f"{chaos.rounds} (exit codes: "
            + ", ".join(f"{code} x{n}" for code, n in sorted(chaos.exits.items()))
            + ")",
        ),
        ("kills by target", f"{sum(chaos.kills.values())}: {kills}"),
        ("faults injected", f"{sum(chaos.faults.values())}: {faults}"),
        (
            "retries",
            f"{stage_retries} stage job(s) resubmitted, {verify_retries} verification job(s) rerun, "
            f"{chaos.http_retried} HTTP request(s) repeated of {chaos.http_requests}",
        ),
        ("resumes", str(chaos.resumes)),
        (
            "wall time",
            f"{chaos.wall:.1f} s (clean run: {clean.wall:.1f} s" + (", reused" if report.clean_cached else "") + ")",
        ),
    ]
    rows += [(f"check: {c.name}", ("ok" if c.ok else "FAILED") + f" ({c.detail})") for c in report.checks]
    rows.append(("result", "PASS" if report.ok else "FAIL"))
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    for check in report.checks:
        lines += [f"  {check.name}: {problem}" for problem in check.problems[:20]]
    return "\n".join(lines)
