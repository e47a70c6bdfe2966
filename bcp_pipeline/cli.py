"""The `bcp-pipeline` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import __version__
from .backends import BACKENDS, check_backend_ready, make_backend
from .completion import enable_completion
from .backends.bcp_render import job_run_argv, upload_argv
from .backends.common import shell_join
from .config import Config, PipelineConfig, substitute
from .detached import DetachedRun, driver_spec, is_driver_owned, render_driver, workspace_run_path
from .errors import ConfigError, PipelineError, StateError
from .estimates import actual_rates, estimate_pipeline, instances_table
from .jobs import JobState
from .orchestrator import Orchestrator
from .preflight import load_and_check
from .report import write_report
from .reporting import Reporter, format_table, render_estimates, render_status
from .runs import Selection, continue_run, new_run, pick_run
from .state import RunLock, RunState, RunStore, StageStatus
from .submitter import planned_requests

PLAN_RUN_ID = "{pipeline}-RUN"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bcp-pipeline", description=(
        "Run the SlimPajama -> NeMo GPT pretraining DAG of pipelines.yaml on NGC Base Command Platform, "
        "Slurm, or locally."))
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_global_options(parser, default=None)
    # The global options are also taken after the verb (`plan demo --config other.yaml`), as ngc takes its own.
    after_verb = argparse.ArgumentParser(add_help=False)
    add_global_options(after_verb, default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_pipeline_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("pipeline", help="pipeline name from the config file")
        p.add_argument("--backend", choices=BACKENDS, help="where jobs run (default: the pipeline's `backend`)")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="STAGE.KEY=VALUE",
                       help="override a stage field (VALUE is YAML), e.g. download.bcp.replicas=4 or vars.files=10")

    run = sub.add_parser("run", parents=[after_verb], help="run a pipeline (continues its last unfinished run)")
    with_pipeline_options(run)
    run.add_argument("--restart", action="store_true", help="start a new run instead of continuing the last one")
    run.add_argument("--from", dest="from_stage", metavar="STAGE", help="run STAGE and everything after it")
    run.add_argument("--only", action="append", metavar="STAGE", help="run only STAGE (repeatable)")
    run.add_argument("--detach", action="store_true",
                     help="BCP: run the orchestrator itself as a BCP job and return at once (see `status`)")

    plan = sub.add_parser("plan", parents=[after_verb],
                          help="print every job exactly as it would be submitted; submits nothing")
    with_pipeline_options(plan)
    plan.add_argument("--json", action="store_true")
    plan.add_argument("--detach", action="store_true", help="also show the driver job `run --detach` submits")

    status = sub.add_parser("status", parents=[after_verb], help="stages, jobs, progress and verification of a run")
    status.add_argument("run", nargs="?", help="run id (default: the latest run)")
    status.add_argument("--json", action="store_true")

    resume = sub.add_parser("resume", parents=[after_verb], help="re-attach to a run's jobs and continue it")
    resume.add_argument("run", nargs="?", help="run id (default: the latest run)")
    resume.add_argument("--detach", action="store_true",
                        help="BCP: continue under a new driver job (without it, a detached run is taken back here)")

    logs = sub.add_parser("logs", parents=[after_verb], help="a stage's job log")
    logs.add_argument("run")
    logs.add_argument("stage", help="a stage, or `driver` for a detached run's driver job")
    logs.add_argument("--rank", type=int, help="one rank/replica only")
    logs.add_argument("--verify", action="store_true", help="the verification job's log")
    logs.add_argument("--tail", type=int, help="last N lines")

    cancel = sub.add_parser("cancel", parents=[after_verb], help="stop a run's active jobs")
    cancel.add_argument("run")

    lst = sub.add_parser("list", parents=[after_verb], help="pipelines in the config file and runs so far")
    lst.add_argument("--json", action="store_true")

    report = sub.add_parser("report", parents=[after_verb],
                            help="one self-contained HTML page: job timeline, loss curve, throughput, estimates")
    report.add_argument("run", nargs="?", help="run id (default: the latest run)")
    report.add_argument("--out", metavar="FILE", help="where to write it (default: RUNS/RUN/report.html)")

    verify = sub.add_parser("verify", parents=[after_verb],
                            help="run a stage's verification again and record the result")
    verify.add_argument("run")
    verify.add_argument("stage")
    return parser


def add_global_options(parser: argparse.ArgumentParser, default: object) -> None:
    """--config and --state-dir; after the verb their default is SUPPRESS, so they override only when given."""
    parser.add_argument("--config", default=default, help="pipelines file (default: ./pipelines.yaml; for an "
                                                          "existing run, the file it was started with)")
    parser.add_argument("--state-dir", default=default,
                        help="where runs are kept (default: .bcp-pipeline next to the config file)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    enable_completion(parser)  # answers a shell's <TAB> and exits; returns at once otherwise
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except PipelineError as exc:
        print(f"bcp-pipeline: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("\nbcp-pipeline: interrupted. Jobs already submitted keep running; "
              "`bcp-pipeline resume` re-attaches to them, `bcp-pipeline cancel RUN` stops them.", file=sys.stderr)
        return 130


# -- helpers ---------------------------------------------------------------------------------------------
DEFAULT_CONFIG = Path("pipelines.yaml")


def store_for(args: argparse.Namespace, config_file: Path | None = None) -> RunStore:
    if args.state_dir:
        return RunStore(Path(args.state_dir))
    return RunStore((config_file or Path(args.config or DEFAULT_CONFIG)).resolve().parent / ".bcp-pipeline")


def load(args: argparse.Namespace, pipeline: str | None = None, overrides: list[str] | None = None) -> Config:
    return load_and_check(Path(args.config or DEFAULT_CONFIG), overrides=overrides, pipeline=pipeline)


def run_config(args: argparse.Namespace, state: RunState) -> tuple[Config, PipelineConfig]:
    """The config a stored run was driven with: --config if given, else its own file; and its --set overrides."""
    path = Path(args.config) if args.config else Path(state.config_file)
    config = load_and_check(path, overrides=state.overrides, pipeline=state.pipeline)
    return config, config.pipeline(state.pipeline)


def drive(config: Config, pipeline: PipelineConfig, store: RunStore, state: RunState, selected: set[str]) -> int:
    run_dir = store.run_dir(state.run_id)
    with RunLock(run_dir):
        backend = make_backend(state.backend, config, pipeline, run_dir)
        store.save(state)
        print(f"run {state.run_id} ({pipeline.name} on {state.backend}); state in {store.state_path(state.run_id)}")
        orchestrator = Orchestrator(pipeline=pipeline, backend=backend, store=store, state=state,
                                    reporter=Reporter(), selected=selected)
        ok = orchestrator.drive()
    if not ok:
        print(f"\nrun {state.run_id} did not finish: fix the cause above, then `bcp-pipeline run {pipeline.name}` "
              f"(or `bcp-pipeline resume {state.run_id}`) continues from the failed stage.", file=sys.stderr)
    return 0 if ok else 1


# -- commands -------------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    config = load(args, args.pipeline, args.overrides)
    pipeline = config.pipeline(args.pipeline)
    backend = args.backend or pipeline.backend
    check_backend_ready(backend, config, pipeline)  # before anything is recorded: a run that cannot start leaves nothing behind
    if args.detach and backend != "bcp":
        raise ConfigError(f"--detach runs the orchestrator as a BCP job: it needs --backend bcp, not {backend!r}")
    store = store_for(args, config.file)
    selection = Selection(from_stage=args.from_stage, only=args.only)
    previous = pick_run(store, pipeline, backend, restart=args.restart)
    if previous is None:
        state = new_run(pipeline, backend, str(config.file.resolve()), args.overrides, selection)
        selected = selection.stages(pipeline)
    else:
        if is_driver_owned(previous):
            raise StateError(f"the last run of {pipeline.name} ({previous.run_id}) is detached: follow it with "
                             f"`bcp-pipeline status {previous.run_id}`, continue it with `bcp-pipeline resume "
                             f"{previous.run_id} --detach` (or without --detach, here), or pass --restart")
        if args.overrides and args.overrides != previous.overrides:
            previous.overrides = args.overrides
        elif previous.overrides:
            config = load(args, args.pipeline, previous.overrides)
            pipeline = config.pipeline(args.pipeline)
        state = previous
        selected = continue_run(state, pipeline, selection)
        print(f"continuing run {state.run_id} (its last state: {_first_unfinished(state)}); "
              "pass --restart to start over")
    if args.detach:
        return detach(config, pipeline, store, state)
    return drive(config, pipeline, store, state, selected)


def detach(config: Config, pipeline: PipelineConfig, store: RunStore, state: RunState) -> int:
    """Hand the run to a driver job on BCP and return: the laptop may close."""
    run = detached_run(config, pipeline, store, state)
    job_id, resumed = run.start(os.environ)
    url = run.backend.job_url(job_id)
    print(f"run {state.run_id} ({pipeline.name}) is detached: driver job {job_id} {'resumed' if resumed else 'submitted'}"
          + (f" ({url})" if url else ""))
    print(f"  follow it:  bcp-pipeline status {state.run_id}    (a stage's log: bcp-pipeline logs {state.run_id} STAGE)")
    print(f"  stop it:    bcp-pipeline cancel {state.run_id}    (bring it back here: bcp-pipeline resume {state.run_id})")
    return 0


def detached_run(config: Config, pipeline: PipelineConfig, store: RunStore, state: RunState) -> DetachedRun:
    backend = make_backend("bcp", config, pipeline, store.run_dir(state.run_id))
    return DetachedRun(config=config, pipeline=pipeline, store=store, state=state, backend=backend)


def _first_unfinished(state: RunState) -> str:
    for name, stage in state.stages.items():
        if not stage.status.done:
            return f"{name} {stage.status.value}"
    return "all stages done"


def cmd_resume(args: argparse.Namespace) -> int:
    store = store_for(args)
    state = store.resolve(args.run)
    config, pipeline = run_config(args, state)
    check_backend_ready(state.backend, config, pipeline)
    if args.detach:
        if state.backend != "bcp":
            raise ConfigError(f"--detach needs a run on the bcp backend; run {state.run_id} is on {state.backend!r}")
        if not is_driver_owned(state):
            continue_run(state, pipeline, Selection())
        return detach(config, pipeline, store, state)
    if is_driver_owned(state):
        stopped = detached_run(config, pipeline, store, state).take_back()
        print(f"run {state.run_id} taken back from its driver job(s) {', '.join(stopped) or '(none running)'}: "
              "it continues here")
    selected = continue_run(state, pipeline, Selection())
    selected = {name for name in selected if state.stages[name].status is not StageStatus.SKIPPED}
    return drive(config, pipeline, store, state, selected)


def cmd_plan(args: argparse.Namespace) -> int:
    config = load(args, args.pipeline, args.overrides)
    pipeline = config.pipeline(args.pipeline)
    backend_name = args.backend or pipeline.backend
    run_id = PLAN_RUN_ID.format(pipeline=pipeline.name)
    backend = make_backend(backend_name, config, pipeline, store_for(args, config.file).run_dir(run_id))
    actions = backend.prepare(pipeline, execute=False)
    submissions = [backend.render(request) for request in planned_requests(pipeline, run_id)]
    estimate = estimate_pipeline(pipeline, instances_table(config.options["bcp"].instances))
    if args.detach and backend_name != "bcp":
        raise ConfigError(f"--detach runs the orchestrator as a BCP job: it needs --backend bcp, not {backend_name!r}")
    driver = planned_driver(config, pipeline, run_id) if args.detach else None
    if args.json:
        print(json.dumps({"pipeline": pipeline.name, "backend": backend_name, "run_id": run_id,
                          "prepare": [{"description": a.description, "printable": a.printable} for a in actions],
                          "jobs": [s.as_json() for s in submissions], "estimates": estimate.as_json(),
                          **({"driver": driver} if driver else {})}, indent=2))
        return 0
    print(f"# plan: pipeline {pipeline.name} on {backend_name}; {len(submissions)} job(s); nothing is submitted.")
    print(f"# {run_id} stands for the run id a real run gets.")
    if driver:
        print(f"\n# --detach: upload the orchestrator, stages/ and the config for the driver\n{driver['upload']}")
        print(f"\n# --detach: the driver job, which submits everything below from inside BCP\n{driver['printable']}")
    for action in actions:
        print(f"\n# before the first stage: {action.description}\n{action.printable}")
    for submission in submissions:
        request = submission.request
        what = "verification of " if request.kind == "verify" else "stage "
        needs = f" (after {', '.join(request.stage.needs)})" if request.kind == "stage" and request.stage.needs else ""
        description = substitute(request.stage.description, request.pipeline.vars)
        about = f": {description}" if request.kind == "stage" and description else ""
        print(f"\n# {what}{request.stage.name}{needs}{about}\n{submission.printable}")
    print()
    print("\n".join(render_estimates(estimate)))
    if driver:
        print(driver_cost_line(config, pipeline, estimate))
    return 0


def driver_cost_line(config: Config, pipeline: PipelineConfig, estimate) -> str:
    """What the detached driver adds: one small instance for the whole run (queueing not counted)."""
    instance = config.options["bcp"].driver.instance or pipeline.verification.bcp.instance
    gpus = instances_table(config.options["bcp"].instances).get(instance)
    hours = estimate.seconds / 3600
    gpu_hours = hours * gpus.gpus if gpus else None
    share = f", {100 * gpu_hours / estimate.gpu_hours:.1f} % of the run's GPU-hours" if gpu_hours and \
        estimate.gpu_hours else ""
    return (f"driver (--detach): 1 x {instance} for the whole run: {hours:,.0f} node-hours"
            + (f", {gpu_hours:,.0f} GPU-hours{share}" if gpu_hours is not None else ""))


def planned_driver(config: Config, pipeline: PipelineConfig, run_id: str) -> dict:
    """The upload and the driver job `run --detach` would make (pure but for reading NGC's settings)."""
    spec = driver_spec(config, pipeline, run_id, os.environ)
    upload = upload_argv(config.options["bcp"], pipeline.workspace.name, Path("BUNDLE"), workspace_run_path(run_id))
    argv = job_run_argv(spec)
    return {"upload": shell_join(upload), "printable": shell_join(argv), "argv": argv}


def cmd_status(args: argparse.Namespace) -> int:
    store = store_for(args)
    state = store.resolve(args.run)
    backend = config = pipeline = view = None
    try:
        config, pipeline = run_config(args, state)
        backend = make_backend(state.backend, config, pipeline, store.run_dir(state.run_id))
        if is_driver_owned(state):
            view = detached_run(config, pipeline, store, state).refresh()
        refresh(backend, state)
    except PipelineError as exc:
        print(f"(could not refresh job states: {exc})", file=sys.stderr)
    estimate, actual = estimate_against_actual(config, pipeline, state)
    if args.json:
        payload = state.to_json()
        if backend is not None:
            payload["job_urls"] = {j.job_id: backend.job_url(j.job_id) for s in state.stages.values() for j in s.jobs
                                   if backend.job_url(j.job_id)}
        if estimate is not None:
            seconds = {s.stage: s.seconds for s in estimate.stages}
            payload["estimates"] = {name: {"estimate_s": seconds.get(name), **rates} for name, rates in actual.items()}
        if view is not None:
            payload["driver"] = view.as_json()
        print(json.dumps(payload, indent=2, sort_keys=True))
    else:
        print(render_status(state, backend.job_url if backend else None, estimate, actual))
        if view is not None:
            print("\n".join(render_driver(view, state.run_id, state.status == "succeeded", backend.job_url)))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Gathered like `status` (live job states where the backend answers); report.py does the rest."""
    store = store_for(args)
    state = store.resolve(args.run)
    backend = config = pipeline = None
    notes = []
    try:
        config, pipeline = run_config(args, state)
        backend = make_backend(state.backend, config, pipeline, store.run_dir(state.run_id))
        if is_driver_owned(state):
            detached_run(config, pipeline, store, state).refresh()  # the stages as its driver last saved them
        refresh(backend, state)
    except PipelineError as exc:
        notes.append(f"job states as last recorded (could not refresh them: {exc})")
    estimate, actual = estimate_against_actual(config, pipeline, state)
    path = write_report(store, state, pipeline=pipeline, backend=backend, estimate=estimate, actual=actual,
                        out=Path(args.out) if args.out else None, notes=notes)
    print(f"report of run {state.run_id} ({state.status}): {path}")
    return 0


def estimate_against_actual(config: Config | None, pipeline: PipelineConfig | None, state: RunState):
    """The pipeline's estimate and each stage's effective rates so far (None, {} without a loaded config)."""
    if config is None or pipeline is None:
        return None, {}
    estimate = estimate_pipeline(pipeline, instances_table(config.options["bcp"].instances))
    now = time.time()
    return estimate, {name: actual_rates(pipeline.stages[name], stage, now) for name, stage in state.stages.items()
                      if name in pipeline.stages}


def refresh(backend, state: RunState) -> None:
    """Show live job states and progress (in memory only: the driving orchestrator owns the state file)."""
    active = {job.job_id: (name, job) for name, s in state.stages.items() if (job := s.active_job())}
    if not active:
        return
    statuses = backend.poll(list(active))
    for job_id, (name, job) in active.items():
        status = statuses.get(job_id)
        if status is not None:
            job.state, job.native = status.state.value, status.native
        progress = backend.progress(job_id)
        if progress is not None:
            state.stages[name].progress = {"done": progress.done, "total": progress.total, "unit": progress.unit}


def stage_job(state: RunState, stage: str, verify: bool):
    if stage not in state.stages:
        raise StateError(f"run {state.run_id} has no stage {stage!r}; stages: {', '.join(state.stages)}")
    jobs = [j for j in state.stages[stage].jobs if (j.kind == "verify") == verify]
    if not jobs:
        raise StateError(f"stage {stage!r} of run {state.run_id} has no {'verification ' if verify else ''}job yet")
    return jobs[-1]


def cmd_logs(args: argparse.Namespace) -> int:
    store = store_for(args)
    state = store.resolve(args.run)
    config, pipeline = run_config(args, state)
    backend = make_backend(state.backend, config, pipeline, store.run_dir(state.run_id))
    if state.detached:
        view = detached_run(config, pipeline, store, state).refresh()
        if args.stage == "driver" and args.stage not in state.stages:
            if view.latest is None:
                raise StateError(f"run {state.run_id} has no driver job")
            print(backend.logs(view.latest.job_id, tail=args.tail))
            return 0
    job = stage_job(state, args.stage, args.verify)
    print(backend.logs(job.job_id, rank=args.rank, tail=args.tail))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    store = store_for(args)
    state = store.resolve(args.run)
    config, pipeline = run_config(args, state)
    if is_driver_owned(state):
        stopped = detached_run(config, pipeline, store, state).cancel()
        print(f"cancelled run {state.run_id}: its driver and {len(stopped)} job(s) in all stopped "
              f"({', '.join(stopped) or 'none active'})")
        return 0
    backend = make_backend(state.backend, config, pipeline, store.run_dir(state.run_id))
    active = [job.job_id for stage in state.stages.values() if (job := stage.active_job())]
    if active:
        backend.cancel(active)
    lock = RunLock(store.run_dir(state.run_id))
    try:
        lock.acquire()
    except StateError:
        print(f"cancelled {len(active)} job(s): {', '.join(active) or '-'}; the orchestrator driving the run records it")
        return 0
    try:
        for stage in state.stages.values():
            if stage.status.active or stage.status is StageStatus.PENDING:
                stage.status = StageStatus.CANCELLED
                for job in stage.jobs:
                    if job.ended_at is None:
                        job.state = JobState.CANCELLED.value
        store.save(state)
    finally:
        lock.release()
    print(f"cancelled run {state.run_id}: {len(active)} job(s) stopped ({', '.join(active) or 'none active'})")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    config = load(args)
    store = store_for(args, config.file)
    runs = store.runs()
    if args.json:
        print(json.dumps({
            "pipelines": [{"name": p.name, "backend": p.backend, "description": p.description, "stages": p.order()}
                          for p in config.pipelines.values()],
            "runs": [{"run_id": r.run_id, "pipeline": r.pipeline, "backend": r.backend, "status": r.status,
                      "created_at": r.created_at} for r in runs]}, indent=2))
        return 0
    rows = [["PIPELINE", "BACKEND", "STAGES", "DESCRIPTION"]]
    rows += [[p.name, p.backend, " -> ".join(p.order()), p.description] for p in config.pipelines.values()]
    print(format_table(rows))
    print()
    if runs:
        rows = [["RUN", "PIPELINE", "BACKEND", "STATUS"]] + [[r.run_id, r.pipeline, r.backend, r.status] for r in runs]
        print(format_table(rows))
    else:
        print("no runs yet")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    store = store_for(args)
    state = store.resolve(args.run)
    config, pipeline = run_config(args, state)
    if args.stage not in pipeline.stages or not pipeline.stages[args.stage].verify:
        raise StateError(f"stage {args.stage!r} of {pipeline.name} has no verification; stages with one: "
                         + ", ".join(n for n, s in pipeline.stages.items() if s.verify))
    run_dir = store.run_dir(state.run_id)
    with RunLock(run_dir):
        backend = make_backend(state.backend, config, pipeline, run_dir)
        state.stages[args.stage].status = StageStatus.VERIFYING  # with no verification job yet: one is submitted
        orchestrator = Orchestrator(pipeline=pipeline, backend=backend, store=store, state=state, reporter=Reporter(),
                                    selected={args.stage})
        orchestrator.drive()
    stage = state.stages[args.stage]
    return 0 if stage.status is StageStatus.SUCCEEDED else 1


COMMANDS = {"run": cmd_run, "plan": cmd_plan, "status": cmd_status, "resume": cmd_resume, "logs": cmd_logs,
            "cancel": cmd_cancel, "list": cmd_list, "verify": cmd_verify,
            "report": cmd_report}


if __name__ == "__main__":
    sys.exit(main())
