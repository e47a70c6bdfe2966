"""What the verbs share: the config file and run store the command line names, and driving a chosen run."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

from bcp_pipeline.config.load import DEFAULT_CONFIG_FILE
from bcp_pipeline.engine.drive import drive_run
from bcp_pipeline.engine.selection import ChosenRun, open_run
from bcp_pipeline.engine.state import RunStore, store_for
from bcp_pipeline.report.text import Reporter

RUN_HELP = "run id (default: the latest run; `bcp-pipeline list` shows them)"
NAMED_RUN_HELP = "run id (named, not guessed: `bcp-pipeline list` shows them)"
JSON_HELP = "print one JSON document instead of tables (for scripts)"


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


def store_of_run(args: argparse.Namespace) -> RunStore:
    """The store holding the run named on the command line: the pipeline's runs, or else `profile`'s."""
    store, profiles = run_store(args), profile_store(args)
    if args.run and not store.state_path(args.run).is_file() and profiles.state_path(args.run).is_file():
        return profiles
    return store


def profile_store(args: argparse.Namespace) -> RunStore:
    """Profile runs live apart from the pipeline's runs (`STATE/profiles/RUN`): `run PIPELINE` never continues one."""
    return RunStore(run_store(args).root, folder="profiles")


def drive(chosen: ChosenRun) -> int:
    try:
        ok = drive_run(chosen, Reporter())
    except KeyboardInterrupt:
        print(interrupted_message(chosen.state.run_id), file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of stdout left: `run | tee log` and Ctrl-C stops tee first, so the next line the run prints
        # fails before the interrupt arrives. What the interrupt would have said goes to stderr all the same (the
        # Ctrl-C, still pending, may land here too: the line is said once either way).
        with contextlib.suppress(KeyboardInterrupt):
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(interrupted_message(chosen.state.run_id), file=sys.stderr)
        raise
    if not ok:
        state = chosen.state
        print(
            f"\nrun {state.run_id} did not finish: fix the cause above, then `bcp-pipeline run "
            f"{chosen.pipeline.name}` (or `bcp-pipeline resume {state.run_id}`) continues from the failed stage.",
            file=sys.stderr,
        )
    return 0 if ok else 1


def interrupted_message(run_id: str | None = None) -> str:
    """What Ctrl-C leaves, said with the run it interrupted where one was being driven."""
    which = f" run {run_id}" if run_id else ""
    return (
        f"\nbcp-pipeline: interrupted{which}. Jobs already submitted keep running; "
        f"`bcp-pipeline resume{f' {run_id}' if run_id else ''}` re-attaches to them, "
        f"`bcp-pipeline cancel {run_id or 'RUN'}` stops them."
    )
