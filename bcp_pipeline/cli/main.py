"""The `bcp-pipeline` command line: the parser, and each verb dispatched to its module."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from bcp_pipeline import __version__
from bcp_pipeline.backends.checks import Verdict
from bcp_pipeline.backends.registry import backend_names
from bcp_pipeline.check.render import render_check
from bcp_pipeline.check.run import CheckRequest, run_check
from bcp_pipeline.cli.common import JSON_HELP, NAMED_RUN_HELP, RUN_HELP, config_file, interrupted_message, run_store
from bcp_pipeline.cli.completion import enable_completion
from bcp_pipeline.cli.plan import cmd_plan
from bcp_pipeline.cli.profile import cmd_profile
from bcp_pipeline.cli.runs import (
    cmd_cancel,
    cmd_list,
    cmd_logs,
    cmd_remove,
    cmd_report,
    cmd_resume,
    cmd_run,
    cmd_status,
    cmd_verify,
)
from bcp_pipeline.config.profiling import DEFAULT_STEPS
from bcp_pipeline.errors import PipelineError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bcp-pipeline",
        description=(
            "Run the SlimPajama -> NeMo GPT pretraining DAG of pipelines.yaml on NGC Base Command Platform, "
            "Slurm, Grid Engine, Kubernetes, or locally."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_global_options(parser, default=None)
    # The global options are also taken after the verb (`plan demo --config other.yaml`), as ngc takes its own.
    after_verb = argparse.ArgumentParser(add_help=False)
    add_global_options(after_verb, default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_pipeline_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("pipeline", help="pipeline name from the config file")
        p.add_argument("--backend", choices=backend_names(), help="where jobs run (default: the pipeline's `backend`)")
        p.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="STAGE.KEY=VALUE",
            help="override a stage field (VALUE is YAML), e.g. download.bcp.replicas=4 or vars.files=10",
        )

    run = sub.add_parser("run", parents=[after_verb], help="run a pipeline (continues its last unfinished run)")
    with_pipeline_options(run)
    run.add_argument("--restart", action="store_true", help="start a new run instead of continuing the last one")
    run.add_argument("--from", dest="from_stage", metavar="STAGE", help="run STAGE and everything after it")
    run.add_argument("--only", action="append", metavar="STAGE", help="run only STAGE (repeatable)")
    run.add_argument(
        "--detach",
        action="store_true",
        help="BCP: run the orchestrator itself as a BCP job and return at once (see `status`)",
    )

    plan = sub.add_parser(
        "plan", parents=[after_verb], help="print every job exactly as it would be submitted; submits nothing"
    )
    with_pipeline_options(plan)
    plan.add_argument("--json", action="store_true", help=JSON_HELP)
    plan.add_argument("--detach", action="store_true", help="also show the driver job `run --detach` submits")

    status = sub.add_parser("status", parents=[after_verb], help="stages, jobs, progress and verification of a run")
    status.add_argument("run", nargs="?", help=RUN_HELP)
    status.add_argument("--json", action="store_true", help=JSON_HELP)

    resume = sub.add_parser("resume", parents=[after_verb], help="re-attach to a run's jobs and continue it")
    resume.add_argument("run", nargs="?", help=RUN_HELP)
    resume.add_argument(
        "--detach",
        action="store_true",
        help="BCP: continue under a new driver job (without it, a detached run is taken back here)",
    )

    logs = sub.add_parser("logs", parents=[after_verb], help="a stage's job log")
    logs.add_argument("run", help=NAMED_RUN_HELP)
    logs.add_argument("stage", help="a stage, or `driver` for a detached run's driver job")
    logs.add_argument("--rank", type=at_least(0), help="one rank/replica only (0, 1, ...)")
    logs.add_argument("--verify", action="store_true", help="the verification job's log")
    logs.add_argument("--tail", type=at_least(1), metavar="N", help="last N lines (N >= 1)")
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing lines as they are written, until the job ends (where the backend can "
        "follow its logs; one that cannot says so)",
    )
    logs.add_argument(
        "--state-lines",
        action="store_true",
        help="driver: also the BCPP-STATE lines (the run state the driver publishes), hidden otherwise",
    )

    cancel = sub.add_parser("cancel", parents=[after_verb], help="stop a run's active jobs")
    cancel.add_argument("run", help=NAMED_RUN_HELP)
    remove = sub.add_parser(
        "remove",
        parents=[after_verb],
        help="delete a finished run's state and the outputs named after it (its checkpoints)",
    )
    remove.add_argument("run", help=NAMED_RUN_HELP)
    remove.add_argument("--dry-run", action="store_true", help="list what would go, with sizes; delete nothing")

    lst = sub.add_parser("list", parents=[after_verb], help="pipelines in the config file and runs so far")
    lst.add_argument("--json", action="store_true", help=JSON_HELP)

    report = sub.add_parser(
        "report",
        parents=[after_verb],
        help="one self-contained HTML page: job timeline, loss curve, throughput, estimates",
    )
    report.add_argument("run", nargs="?", help=RUN_HELP)
    report.add_argument("--out", metavar="FILE", help="where to write it (default: RUNS/RUN/report.html)")

    profile = sub.add_parser(
        "profile",
        parents=[after_verb],
        help="a short training job of the pipeline's pretrain stage, profiled: a trace per "
        "rank, timers per step, MFU (its own run name; no checkpoint)",
    )
    with_pipeline_options(profile)
    profile.add_argument(
        "--steps",
        default=DEFAULT_STEPS,
        metavar="A:B",
        help=f"profile steps A through B; training stops after B+1 (default {DEFAULT_STEPS})",
    )
    profile.add_argument("--ranks", default="0", metavar="0,1,...", help="ranks that profile (default: 0)")
    profile.add_argument("--dry-run", action="store_true", help="print the profile job as `plan` does; submit nothing")
    profile.add_argument(
        "--data-ready",
        action="store_true",
        help="the training's data exists though no run in this state folder made it: profile anyway",
    )

    verify = sub.add_parser(
        "verify", parents=[after_verb], help="run a stage's verification again and record the result"
    )
    verify.add_argument("run", help=NAMED_RUN_HELP)
    verify.add_argument("stage", help="the stage whose outputs to count again")

    check = sub.add_parser(
        "check",
        parents=[after_verb],
        help="first contact: check every assumption the orchestrator makes about this service "
        "(and this pipeline), save the answers as a profile",
    )
    check.add_argument(
        "pipeline",
        nargs="?",
        help="a pipeline whose jobs to check too; without one, only the service named by --backend is checked",
    )
    check.add_argument(
        "--backend",
        choices=backend_names(),
        help="which service (default: the pipeline's `backend`; needed when no PIPELINE is named)",
    )
    check.add_argument("--json", action="store_true", help=JSON_HELP)
    check.add_argument("--no-jobs", dest="jobs", action="store_false", help="submit no probe job: only look-ups (free)")
    check.add_argument("--detach", action="store_true", help="BCP: also judge the ACE for `run --detach`'s driver")
    check.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="STAGE.KEY=VALUE",
        help="check the pipeline as `run --set` would run it",
    )
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
    parser.add_argument(
        "--config",
        default=default,
        help="pipelines file (default: ./pipelines.yaml; for an existing run, the file it was started with)",
    )
    parser.add_argument(
        "--state-dir", default=default, help="where runs are kept (default: .bcp-pipeline next to the config file)"
    )


# Path options taken as absolute paths at once: the run's jobs work in other folders (a local job's supervisor runs
# in the workspace), so a path relative to where the command was typed would name nothing there. --config is read
# here and recorded resolved (engine/selection.py), and messages name it as it was typed.
PATH_OPTIONS = ("state_dir", "out")


def absolute_paths(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with every given path option made absolute (`~` expanded), relative to the current folder."""
    for name in PATH_OPTIONS:
        if getattr(args, name, None):
            setattr(args, name, str(Path(getattr(args, name)).expanduser().absolute()))
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    enable_completion(parser)  # answers a shell's <TAB> and exits; returns at once otherwise
    args = absolute_paths(parser.parse_args(argv))
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
        print(interrupted_message(), file=sys.stderr)
        return 130


def cmd_check(args: argparse.Namespace) -> int:
    """Thin: the checks live in bcp_pipeline/check/; exit 1 when a row is `different`."""
    request = CheckRequest(
        config_file=config_file(args),
        state_root=run_store(args).root,
        pipeline=args.pipeline,
        backend=args.backend,
        jobs=args.jobs,
        detach=args.detach,
        overrides=args.overrides,
    )
    try:
        result, path = run_check(
            request, os.environ, announce=lambda line: print(f"# {line}", flush=True) if not args.json else None
        )
    except KeyboardInterrupt:
        print("\nbcp-pipeline: check interrupted; its probe jobs were cancelled, no profile was saved", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps({**result.as_json(), "profile": str(path)}, indent=2))
    else:
        print(render_check(result, str(path)))
    return 1 if result.count(Verdict.DIFFERENT) else 0


COMMANDS = {
    "run": cmd_run,
    "check": cmd_check,
    "plan": cmd_plan,
    "status": cmd_status,
    "resume": cmd_resume,
    "logs": cmd_logs,
    "cancel": cmd_cancel,
    "remove": cmd_remove,
    "list": cmd_list,
    "verify": cmd_verify,
    "report": cmd_report,
    "profile": cmd_profile,
}


if __name__ == "__main__":
    sys.exit(main())
