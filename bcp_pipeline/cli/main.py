"""The `bcp-pipeline` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bcp_pipeline import __version__
from bcp_pipeline.backends.bcp import profile_key_of
from bcp_pipeline.backends.bcp_render import job_run_argv, upload_argv
from bcp_pipeline.backends.profile import load_profile
from bcp_pipeline.backends.common import shell_join
from bcp_pipeline.backends.contract import Backend
from bcp_pipeline.backends.registry import BACKENDS, describe_backend_limits, make_backend
from bcp_pipeline.check.render import render_check
from bcp_pipeline.check.result import Verdict
from bcp_pipeline.check.run import CheckRequest, run_check
from bcp_pipeline.config.pipelines import DEFAULT_CONFIG_FILE, Config, PipelineConfig, substitute
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.config.resources import rank_layout
from bcp_pipeline.config.profiling import DEFAULT_STEPS, PROFILE_SUFFIX, parse_window, profile_overrides, profiled_stage
from bcp_pipeline.detach.jobs import driver_spec
from bcp_pipeline.detach.laptop import DetachedRun, DriverView, render_driver
from bcp_pipeline.detach.protocol import SNAPSHOT_PREFIX, workspace_run_path
from bcp_pipeline.engine.drive import cancel_run, drive_run, refresh_jobs, verify_stage
from bcp_pipeline.engine.selection import ChosenRun, RunRequest, choose_resume, choose_run, open_run, run_config
from bcp_pipeline.engine.state import RunState, RunStore, store_for
from bcp_pipeline.engine.submitter import planned_requests
from bcp_pipeline.engine.workspace_lock import hold_workspace
from bcp_pipeline.errors import ConfigError, PipelineError, StateError
from bcp_pipeline.report.estimates import actual_rates, estimate_pipeline, instances_table, manifest_tokens
from bcp_pipeline.report.gather import latest_throughput, write_report
from bcp_pipeline.report.measured import Measurement, load_measurement, save_measurement
from bcp_pipeline.report.throughput import summary_text
from bcp_pipeline.report.text import Reporter, format_table, render_estimates, render_status
from bcp_pipeline.cli.completion import enable_completion

PLAN_RUN_ID = "{pipeline}-RUN"
RUN_HELP = "run id (default: the latest run; `bcp-pipeline list` shows them)"
NAMED_RUN_HELP = "run id (named, not guessed: `bcp-pipeline list` shows them)"
JSON_HELP = "print one JSON document instead of tables (for scripts)"


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
    plan.add_argument("--json", action="store_true", help=JSON_HELP)
    plan.add_argument("--detach", action="store_true", help="also show the driver job `run --detach` submits")

    status = sub.add_parser("status", parents=[after_verb], help="stages, jobs, progress and verification of a run")
    status.add_argument("run", nargs="?", help=RUN_HELP)
    status.add_argument("--json", action="store_true", help=JSON_HELP)

    resume = sub.add_parser("resume", parents=[after_verb], help="re-attach to a run's jobs and continue it")
    resume.add_argument("run", nargs="?", help=RUN_HELP)
    resume.add_argument("--detach", action="store_true",
                        help="BCP: continue under a new driver job (without it, a detached run is taken back here)")

    logs = sub.add_parser("logs", parents=[after_verb], help="a stage's job log")
    logs.add_argument("run", help=NAMED_RUN_HELP)
    logs.add_argument("stage", help="a stage, or `driver` for a detached run's driver job")
    logs.add_argument("--rank", type=at_least(0), help="one rank/replica only (0, 1, ...)")
    logs.add_argument("--verify", action="store_true", help="the verification job's log")
    logs.add_argument("--tail", type=at_least(1), metavar="N", help="last N lines (N >= 1)")
    logs.add_argument("--state-lines", action="store_true",
                      help="driver: also the BCPP-STATE lines (the run state the driver publishes), hidden otherwise")

    cancel = sub.add_parser("cancel", parents=[after_verb], help="stop a run's active jobs")
    cancel.add_argument("run", help=NAMED_RUN_HELP)

    lst = sub.add_parser("list", parents=[after_verb], help="pipelines in the config file and runs so far")
    lst.add_argument("--json", action="store_true", help=JSON_HELP)

    report = sub.add_parser("report", parents=[after_verb],
                            help="one self-contained HTML page: job timeline, loss curve, throughput, estimates")
    report.add_argument("run", nargs="?", help=RUN_HELP)
    report.add_argument("--out", metavar="FILE", help="where to write it (default: RUNS/RUN/report.html)")

    profile = sub.add_parser("profile", parents=[after_verb],
                             help="a short training job of the pipeline's pretrain stage, profiled: a trace per "
                                  "rank, timers per step, MFU (its own run name; no checkpoint)")
    with_pipeline_options(profile)
    profile.add_argument("--steps", default=DEFAULT_STEPS, metavar="A:B",
                         help=f"profile steps A through B; training stops after B+1 (default {DEFAULT_STEPS})")
    profile.add_argument("--ranks", default="0", metavar="0,1,...", help="ranks that profile (default: 0)")
    profile.add_argument("--dry-run", action="store_true", help="print the profile job as `plan` does; submit nothing")

    verify = sub.add_parser("verify", parents=[after_verb],
                            help="run a stage's verification again and record the result")
    verify.add_argument("run", help=NAMED_RUN_HELP)
    verify.add_argument("stage", help="the stage whose outputs to count again")

    check = sub.add_parser("check", parents=[after_verb],
                           help="first contact: check every assumption the orchestrator makes about this service "
                                "(and this pipeline), save the answers as a profile")
    check.add_argument("pipeline", nargs="?", help="a pipeline whose jobs to check too; without one, only the "
                                                   "service named by --backend is checked")
    check.add_argument("--backend", choices=BACKENDS,
                       help="which service (default: the pipeline's `backend`; needed when no PIPELINE is named)")
    check.add_argument("--json", action="store_true", help=JSON_HELP)
    check.add_argument("--no-jobs", dest="jobs", action="store_false",
                       help="submit no probe job: only look-ups (free)")
    check.add_argument("--detach", action="store_true", help="BCP: also judge the ACE for `run --detach`'s driver")
    check.add_argument("--set", dest="overrides", action="append", default=[], metavar="STAGE.KEY=VALUE",
                       help="check the pipeline as `run --set` would run it")
    return parser


def at_least(least: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `least` (`--tail -1` is a usage error, not a silent whole log)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {least}, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {least}, got {value}")
        return value

    return parse


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
        code = COMMANDS[args.command](args)
        sys.stdout.flush()  # here, where a reader that left is caught, not at exit
        return code
    except BrokenPipeError:
        # The reader left (`status | head`): what it did not read is not an error. Python would report the pipe
        # again when it flushes stdout at exit, so stdout goes to /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a command a closed pipe stopped
    except PipelineError as exc:
        print(f"bcp-pipeline: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("\nbcp-pipeline: interrupted. Jobs already submitted keep running; "
              "`bcp-pipeline resume` re-attaches to them, `bcp-pipeline cancel RUN` stops them.", file=sys.stderr)
        return 130


# -- helpers ---------------------------------------------------------------------------------------------
def config_file(args: argparse.Namespace) -> Path:
    return Path(args.config or DEFAULT_CONFIG_FILE)


def given_config(args: argparse.Namespace) -> Path | None:
    """--config when given: a stored run is otherwise driven with the file it was started with."""
    return Path(args.config) if args.config else None


def run_store(args: argparse.Namespace) -> RunStore:
    return store_for(config_file(args), args.state_dir, notice=warn)


def warn(message: str) -> None:
    print(f"bcp-pipeline: warning: {message}", file=sys.stderr)


def stored_run(args: argparse.Namespace) -> ChosenRun:
    """The run named on the command line (default: the latest), with the config it is driven with."""
    return open_run(store_of_run(args), args.run, given_config(args))


def drive(chosen: ChosenRun) -> int:
    ok = drive_run(chosen, Reporter())
    if not ok:
        state = chosen.state
        print(f"\nrun {state.run_id} did not finish: fix the cause above, then `bcp-pipeline run "
              f"{chosen.pipeline.name}` (or `bcp-pipeline resume {state.run_id}`) continues from the failed stage.",
              file=sys.stderr)
    return 0 if ok else 1


# -- commands -------------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    if args.from_stage and args.only:
        raise ConfigError(f"--from {args.from_stage} and --only {' --only '.join(args.only)} select stages two "
                          "ways; use one: --from STAGE runs STAGE and everything after it, --only STAGE (repeatable) "
                          "runs just the stages named")
    request = RunRequest(pipeline=args.pipeline, config_file=config_file(args), backend=args.backend,
                         overrides=args.overrides, from_stage=args.from_stage, only=args.only, restart=args.restart,
                         detach=args.detach)
    chosen = choose_run(request, run_store(args))
    suggest_check(chosen)
    if chosen.continued:
        print(f"continuing run {chosen.state.run_id} (its last state: {_first_unfinished(chosen.state)}); "
              "pass --restart to start over")
    return detach(chosen) if args.detach else drive(chosen)


def suggest_check(chosen: ChosenRun) -> None:
    """On BCP, a first run against an org/ACE that `check` never looked at: say what a few minutes would settle."""
    if chosen.state.backend != "bcp":
        return
    key = profile_key_of(chosen.config.options["bcp"], os.environ)
    if key and load_profile(chosen.store.root, key) is None:
        print(f"note: no `check` profile for {key} yet: `bcp-pipeline check {chosen.pipeline.name}` settles, on the "
              "smallest instance in a few minutes, what this run assumes about your ACE (bcprun, ranks, limits); "
              "running with the safe defaults", file=sys.stderr)


def detach(chosen: ChosenRun) -> int:
    """Hand the run to a driver job on BCP and return: the laptop may close."""
    state = chosen.state
    run = detached_run(chosen)
    # The driver job becomes the workspace's writer: its record stays in the lock file after this process ends.
    with hold_workspace(run.backend, chosen.pipeline.workspace.name, state, chosen.store, detached=True):
        job_id, resumed = run.start(os.environ)
    url = run.backend.job_url(job_id)
    print(f"run {state.run_id} ({chosen.pipeline.name}) is detached: driver job {job_id} "
          f"{'resumed' if resumed else 'submitted'}" + (f" ({url})" if url else ""))
    print(f"  follow it:  bcp-pipeline status {state.run_id}    (a stage's log: bcp-pipeline logs {state.run_id} STAGE)")
    print(f"  stop it:    bcp-pipeline cancel {state.run_id}    (bring it back here: bcp-pipeline resume {state.run_id})")
    return 0


def detached_run(chosen: ChosenRun) -> DetachedRun:
    backend = make_backend("bcp", chosen.config, chosen.pipeline, chosen.store.run_dir(chosen.state.run_id))
    return DetachedRun(config=chosen.config, pipeline=chosen.pipeline, store=chosen.store, state=chosen.state,
                       backend=backend)


def _first_unfinished(state: RunState) -> str:
    for name, stage in state.stages.items():
        if not stage.status.done:
            return f"{name} {stage.status.value}"
    return "all stages done"


def cmd_resume(args: argparse.Namespace) -> int:
    chosen = choose_resume(store_of_run(args), args.run, config_file=given_config(args),
                           detach=args.detach, take_back=take_back)
    return detach(chosen) if args.detach else drive(chosen)


def take_back(chosen: ChosenRun) -> None:
    """A detached run, stopped on BCP to continue here (its driver's last state becomes the local one)."""
    stopped = detached_run(chosen).take_back()
    print(f"run {chosen.state.run_id} taken back from its driver job(s) {', '.join(stopped) or '(none running)'}: "
          "it continues here")


def cmd_plan(args: argparse.Namespace) -> int:
    config = load_and_check(config_file(args), overrides=args.overrides, pipeline=args.pipeline)
    pipeline = config.pipeline(args.pipeline)
    backend_name = args.backend or pipeline.backend
    run_id = PLAN_RUN_ID.format(pipeline=pipeline.name)
    backend = make_backend(backend_name, config, pipeline, run_store(args).run_dir(run_id))
    actions = backend.prepare(pipeline, execute=False)
    requests = planned_requests(pipeline, run_id)
    submissions = [backend.render(request) for request in requests]
    estimate = estimate_pipeline(pipeline, instances_table(config.options["bcp"].instances),
                                 load_measurement(run_store(args).root, pipeline.name),
                                 counted_data_tokens(backend, pipeline))
    if args.detach and backend_name != "bcp":
        raise ConfigError(f"--detach runs the orchestrator as a BCP job: it needs --backend bcp, not {backend_name!r}")
    driver = planned_driver(config, pipeline, run_id) if args.detach else None
    # The service's limits (BCP: the ACE's) when the credentials are there; on stderr, so the plan itself reads
    # the same wherever it is made. A job they refuse makes the plan fail, as `run` would.
    limits = describe_backend_limits(backend_name, config, pipeline, requests, detach=args.detach)
    # What the saved `check` profile of this service rules out: `run` refuses exactly these (on stderr, as above).
    ruled_out = backend.refusals(submissions, detach=args.detach)
    refused = bool(limits and limits.violations) or bool(ruled_out)
    if limits is not None:
        print("\n".join(limits.lines()), file=sys.stderr)
    if ruled_out:
        print("plan: `run` would refuse, from the saved check profile:\n  " + "\n  ".join(ruled_out),
              file=sys.stderr)
    if args.json:
        print(json.dumps({"pipeline": pipeline.name, "backend": backend_name, "run_id": run_id,
                          "prepare": [{"description": a.description, "printable": a.printable} for a in actions],
                          "jobs": [s.as_json() for s in submissions], "estimates": estimate.as_json(),
                          **({"driver": driver} if driver else {}),
                          **({"limits": limits.as_json()} if limits is not None else {}),
                          **({"ruled_out": ruled_out} if ruled_out else {})}, indent=2))
        return 1 if refused else 0
    print(f"# plan: pipeline {pipeline.name} on {backend_name}; {len(submissions)} job(s); nothing is submitted.")
    print(f"# {run_id} stands for the run id a real run gets.")
    profile = getattr(backend, "profile", None)
    if profile:
        print(f"# rendered with what `bcp-pipeline check` found for {profile.get('key')} "
              f"(.bcp-pipeline/checks/{profile.get('key')}.json)")
    if driver:
        print(f"\n# --detach: upload the orchestrator, stages/ and the config for the driver\n{driver['upload']}")
        print(f"\n# --detach: the driver job, which submits everything below from inside BCP\n{driver['printable']}")
    for action in actions:
        print(f"\n# before the first stage: {action.description}\n{action.printable}")
    print_submissions(submissions)
    print()
    print("\n".join(render_estimates(estimate)))
    if driver:
        print(driver_cost_line(config, pipeline, estimate))
    return 1 if refused else 0


def print_submissions(submissions: list) -> None:
    """Each rendered job as `plan` prints it: what it is, then exactly what would be submitted."""
    for submission in submissions:
        request = submission.request
        what = "verification of " if request.kind == "verify" else "stage "
        needs = f" (after {', '.join(request.stage.needs)})" if request.kind == "stage" and request.stage.needs else ""
        description = substitute(request.stage.description, request.pipeline.vars)
        about = f": {description}" if request.kind == "stage" and description else ""
        meet = f"\n{rendezvous_line(submission.rendezvous)}" if submission.rendezvous else ""
        print(f"\n# {what}{request.stage.name}{needs}{about}{meet}\n{submission.printable}")
        for path, text in submission.files.items():
            print(f"# ... running {path} (in the workspace; written there before the job is submitted):\n"
                  + "\n".join(f"#   {line}" if line else "#" for line in text.splitlines()))


def cmd_profile(args: argparse.Namespace) -> int:
    """A short profiling run of the pipeline's pretrain stage (config/profiling.py), kept in its own store."""
    base = load_and_check(config_file(args), overrides=args.overrides, pipeline=args.pipeline)
    try:
        window = parse_window(args.steps, args.ranks)
        stage = profiled_stage(base.pipeline(args.pipeline))
        overrides = [*args.overrides, *profile_overrides(base.pipeline(args.pipeline), window)]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    store = profile_store(args)
    if args.dry_run:
        config = load_and_check(config_file(args), overrides=overrides, pipeline=args.pipeline)
        pipeline = config.pipeline(args.pipeline)
        backend_name = args.backend or pipeline.backend
        run_id = PLAN_RUN_ID.format(pipeline=f"{pipeline.name}{PROFILE_SUFFIX}")
        backend = make_backend(backend_name, config, pipeline, store.run_dir(run_id))
        backend.prepare(pipeline, execute=False)
        requests = [r for r in planned_requests(pipeline, run_id) if r.stage.name == stage.name]
        print(f"# profile: stage {stage.name} of {pipeline.name} on {backend_name}, steps {window.as_text()} "
              f"(max_steps {window.max_steps}), ranks {','.join(map(str, window.ranks))}; nothing is submitted.")
        print(f"# its --set overrides (kept in the profile run's state):\n" +
              "\n".join(f"#   {o}" for o in overrides))
        print_submissions([backend.render(request) for request in requests])
        return 0
    request = RunRequest(pipeline=args.pipeline, config_file=config_file(args), backend=args.backend,
                         overrides=overrides, only=[stage.name], restart=True)
    chosen = choose_run(request, store)
    print(f"profile run {chosen.state.run_id}: stage {stage.name}, steps {window.as_text()}, kept in "
          f"{store.runs_dir} (`status`, `report`, `logs` and `resume` take its id)")
    status = drive(chosen)
    if status == 0:
        report_profile(chosen, store, stage.name)
    return status


def report_profile(chosen: ChosenRun, store: RunStore, stage: str) -> None:
    """The profile run's report, and its measured step time kept for `plan`."""
    state, instances = chosen.state, instances_table(chosen.config.options["bcp"].instances)
    backend = make_backend(state.backend, chosen.config, chosen.pipeline, store.run_dir(state.run_id))
    path = write_report(store, state, pipeline=chosen.pipeline, backend=backend, estimate=None, actual={},
                        instances=instances)
    print(f"profile report (step time, tokens/s, MFU, timer breakdown): {path}")
    series = latest_throughput(state, chosen.pipeline, backend, instances)
    summary = series[0]["attempts"][-1]["summary"] if series else None
    if summary is None:
        print("no step times in the profile's log: nothing measured for `plan`", file=sys.stderr)
        return
    profiled = chosen.pipeline.stages[stage]
    measurement = Measurement(run_id=state.run_id, stage=stage, backend=state.backend,
                              instance=profiled.bcp.instance if state.backend == "bcp" else None,
                              nodes=rank_layout(profiled, state.backend).nodes, step_s=summary["step_s"],
                              mfu=summary["mfu"])
    kept = save_measurement(store.root, chosen.pipeline.name, measurement)
    print(f"measured: {summary_text(summary)} (median after the first step), kept for `plan` in {kept}")


def profile_store(args: argparse.Namespace) -> RunStore:
    """Profile runs live apart from the pipeline's runs (`STATE/profiles/RUN`): `run PIPELINE` never continues one."""
    return RunStore(run_store(args).root, folder="profiles")


def store_of_run(args: argparse.Namespace) -> RunStore:
    """The store holding the run named on the command line: the pipeline's runs, or else `profile`'s."""
    store, profiles = run_store(args), profile_store(args)
    if args.run and not store.state_path(args.run).is_file() and profiles.state_path(args.run).is_file():
        return profiles
    return store


def counted_data_tokens(backend: Backend, pipeline: PipelineConfig) -> dict[str, int]:
    """Per NeMo stage, the tokens its data holds, counted from the preprocess manifests where the backend's
    workspace is a folder here and they exist (plan's epochs then come from them, not from the declared size)."""
    if backend.local_workspace is None:
        return {}
    values = {"workspace": str(backend.local_workspace)}
    values |= {name: substitute(value, values) for name, value in pipeline.vars.items()}
    counted = {}
    for name, stage in pipeline.stages.items():
        if stage.nemo and (tokens := manifest_tokens(Path(substitute(stage.nemo.data_dir, values)))):
            counted[name] = tokens
    return counted


def rendezvous_line(meet: dict) -> str:
    """`# rendezvous: MASTER_ADDR=..., MASTER_PORT=..., WORLD_SIZE=N (NODES node(s) x PER_NODE)`."""
    return (f"# rendezvous: MASTER_ADDR={meet['MASTER_ADDR']}, MASTER_PORT={meet['MASTER_PORT']}, "
            f"WORLD_SIZE={meet['WORLD_SIZE']} ({meet['nodes']} node(s) x {meet['per_node']})")


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


@dataclass
class LiveRun:
    """A stored run with live job states where its backend answers (in memory only: the orchestrator driving the
    run owns its state file); what could not be had is None, and `problem` says why."""

    state: RunState
    config: Config | None = None
    pipeline: PipelineConfig | None = None
    backend: Backend | None = None
    view: DriverView | None = None  # a detached run's drivers
    problem: str | None = None


def live_run(args: argparse.Namespace) -> tuple[RunStore, LiveRun]:
    store = store_of_run(args)
    live = LiveRun(state=store.resolve(args.run))
    state = live.state
    try:
        live.config, live.pipeline = run_config(state, given_config(args))
        live.backend = make_backend(state.backend, live.config, live.pipeline, store.run_dir(state.run_id))
        if state.driver_owned:  # the stages as its driver last saved them
            chosen = ChosenRun(config=live.config, pipeline=live.pipeline, store=store, state=state, selected=set())
            live.view = detached_run(chosen).refresh()
        refresh_jobs(live.backend, state, live.pipeline)
    except PipelineError as exc:
        live.problem = str(exc)
    return store, live


def cmd_status(args: argparse.Namespace) -> int:
    _, live = live_run(args)
    state, backend, view = live.state, live.backend, live.view
    if live.problem:
        print(f"(could not refresh job states: {live.problem})", file=sys.stderr)
    estimate, actual = estimate_against_actual(live.config, live.pipeline, state)
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
        throughput = latest_throughput(state, live.pipeline, backend,
                                       instances_table(live.config.options["bcp"].instances)) \
            if backend is not None and live.pipeline is not None else None
        print(render_status(state, backend.job_url if backend else None, estimate, actual, throughput))
        if view is not None:
            print("\n".join(render_driver(view, state.run_id, state.status == "succeeded", backend.job_url)))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Gathered like `status` (live job states where the backend answers); report/gather.py does the rest."""
    store, live = live_run(args)
    notes = [f"job states as last recorded (could not refresh them: {live.problem})"] if live.problem else []
    estimate, actual = estimate_against_actual(live.config, live.pipeline, live.state)
    instances = instances_table(live.config.options["bcp"].instances) if live.config is not None else None
    path = write_report(store, live.state, pipeline=live.pipeline, backend=live.backend, estimate=estimate,
                        actual=actual, out=Path(args.out) if args.out else None, notes=notes, instances=instances)
    print(f"report of run {live.state.run_id} ({live.state.status}): {path}")
    return 0


def estimate_against_actual(config: Config | None, pipeline: PipelineConfig | None, state: RunState):
    """The pipeline's estimate and each stage's effective rates so far (None, {} without a loaded config)."""
    if config is None or pipeline is None:
        return None, {}
    estimate = estimate_pipeline(pipeline, instances_table(config.options["bcp"].instances))
    now = time.time()
    return estimate, {name: actual_rates(pipeline.stages[name], stage, now) for name, stage in state.stages.items()
                      if name in pipeline.stages}


def stage_job(state: RunState, stage: str, verify: bool):
    if stage not in state.stages:
        raise StateError(f"run {state.run_id} has no stage {stage!r}; stages: {', '.join(state.stages)}")
    jobs = [j for j in state.stages[stage].jobs if (j.kind == "verify") == verify]
    if not jobs:
        raise StateError(f"stage {stage!r} of run {state.run_id} has no {'verification ' if verify else ''}job yet")
    return jobs[-1]


def cmd_logs(args: argparse.Namespace) -> int:
    chosen = stored_run(args)
    state = chosen.state
    backend = make_backend(state.backend, chosen.config, chosen.pipeline, chosen.store.run_dir(state.run_id))
    if state.detached:
        view = detached_run(chosen).refresh()
        if args.stage == "driver" and args.stage not in state.stages:
            if view.latest is None:
                raise StateError(f"run {state.run_id} has no driver job")
            text = backend.logs(view.latest.job_id, tail=args.tail if args.state_lines else None)
            print(text if args.state_lines else without_state_lines(text, args.tail))
            return 0
    job = stage_job(state, args.stage, args.verify)
    print(backend.logs(job.job_id, rank=args.rank, tail=args.tail))
    return 0


def without_state_lines(log: str, tail: int | None) -> str:
    """A driver's log for people: its BCPP-STATE lines (the whole run state after each save, KBs each, for the
    laptop to read back) replaced by one count, then the last `tail` lines."""
    lines = log.splitlines()
    kept = [line for line in lines if not line.startswith(SNAPSHOT_PREFIX)]
    hidden = len(lines) - len(kept)
    kept = kept[-tail:] if tail else kept
    return "\n".join(kept + ([f"({hidden} {SNAPSHOT_PREFIX.strip()} line(s) hidden: --state-lines shows them)"]
                             if hidden else []))


def cmd_cancel(args: argparse.Namespace) -> int:
    chosen = stored_run(args)
    state = chosen.state
    if state.driver_owned:
        stopped = detached_run(chosen).cancel()
        print(f"cancelled run {state.run_id}: its driver and {len(stopped)} job(s) in all stopped "
              f"({', '.join(stopped) or 'none active'})")
        return 0
    cancelled, recorded = cancel_run(chosen)
    if not recorded:
        print(f"cancelled {len(cancelled)} job(s): {', '.join(cancelled) or '-'}; the orchestrator driving the run "
              "records it")
        return 0
    print(f"cancelled run {state.run_id}: {len(cancelled)} job(s) stopped ({', '.join(cancelled) or 'none active'})")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    config = load_and_check(config_file(args))
    runs, corrupt = run_store(args).scan()
    if args.json:
        print(json.dumps({
            "pipelines": [{"name": p.name, "backend": p.backend, "description": p.description, "stages": p.order()}
                          for p in config.pipelines.values()],
            "runs": [{"run_id": r.run_id, "pipeline": r.pipeline, "backend": r.backend, "status": r.status,
                      "created_at": r.created_at} for r in runs],
            "corrupt_runs": [{"run_id": c.run_id, "pipeline": c.pipeline, "status": "corrupt",
                              "state_set_aside_as": str(c.path), "reason": c.reason} for c in corrupt]}, indent=2))
        return 0
    rows = [["PIPELINE", "BACKEND", "STAGES", "DESCRIPTION"]]
    rows += [[p.name, p.backend, " -> ".join(p.order()), p.description] for p in config.pipelines.values()]
    print(format_table(rows))
    print()
    if runs or corrupt:
        rows = [["RUN", "PIPELINE", "BACKEND", "STATUS"]] + [[r.run_id, r.pipeline, r.backend, r.status] for r in runs]
        rows += [[c.run_id, c.pipeline or "?", "?", f"corrupt (state set aside as {c.path})"] for c in corrupt]
        print(format_table(rows))
    else:
        print("no runs yet")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    return 0 if verify_stage(stored_run(args), args.stage, Reporter()) else 1


def cmd_check(args: argparse.Namespace) -> int:
    """Thin: the checks live in bcp_pipeline/check/; exit 1 when a row is `different`."""
    request = CheckRequest(config_file=config_file(args), state_root=run_store(args).root, pipeline=args.pipeline,
                           backend=args.backend, jobs=args.jobs, detach=args.detach, overrides=args.overrides)
    try:
        result, path = run_check(request, os.environ, announce=lambda line: print(f"# {line}", flush=True)
                                 if not args.json else None)
    except KeyboardInterrupt:
        print("\nbcp-pipeline: check interrupted; its probe jobs were cancelled, no profile was saved",
              file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps({**result.as_json(), "profile": str(path)}, indent=2))
    else:
        print(render_check(result, str(path)))
    return 1 if result.count(Verdict.DIFFERENT) else 0


COMMANDS = {"run": cmd_run, "check": cmd_check, "plan": cmd_plan, "status": cmd_status, "resume": cmd_resume, "logs": cmd_logs,
            "cancel": cmd_cancel, "list": cmd_list, "verify": cmd_verify,
            "report": cmd_report, "profile": cmd_profile}


if __name__ == "__main__":
    sys.exit(main())
