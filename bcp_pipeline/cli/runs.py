"""The verbs that start, follow and stop runs: run, resume, status, report, logs, cancel, list, verify."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bcp_pipeline.backends.contract import Backend
from bcp_pipeline.backends.profile import load_profile
from bcp_pipeline.backends.registry import backend_class, make_backend
from bcp_pipeline.cli.common import config_file, drive, given_config, run_store, store_of_run, stored_run, warn
from bcp_pipeline.cli.detach import detach, detached_run, take_back
from bcp_pipeline.config.instances import instances_table, this_machine
from bcp_pipeline.config.model import Config, PipelineConfig
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.detach.laptop import DriverView, render_driver
from bcp_pipeline.detach.protocol import SNAPSHOT_PREFIX, SUBMITTED_PREFIX
from bcp_pipeline.engine.drive import CANCEL_ANSWER_SECONDS, cancel_run, refresh_jobs, verify_stage
from bcp_pipeline.engine.removal import remove_paths, run_outputs, size_of
from bcp_pipeline.engine.selection import ChosenRun, RunRequest, choose_resume, choose_run, run_config
from bcp_pipeline.engine.state import RunState, RunStore
from bcp_pipeline.errors import ConfigError, PipelineError, StateError
from bcp_pipeline.report.estimates import actual_rates, estimate_pipeline
from bcp_pipeline.report.gather import heldout_results, latest_throughput, write_report
from bcp_pipeline.report.measured import load_measurement
from bcp_pipeline.report.text import Reporter, format_table, render_status, run_status_text


# -- commands -------------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    if args.from_stage and args.only:
        raise ConfigError(
            f"--from {args.from_stage} and --only {' --only '.join(args.only)} select stages two "
            "ways; use one: --from STAGE runs STAGE and everything after it, --only STAGE (repeatable) "
            "runs just the stages named"
        )
    request = RunRequest(
        pipeline=args.pipeline,
        config_file=config_file(args),
        backend=args.backend,
        overrides=args.overrides,
        from_stage=args.from_stage,
        only=args.only,
        restart=args.restart,
        detach=args.detach,
    )
    chosen = choose_run(request, run_store(args))
    for notice in chosen.config.notices:
        warn(notice)
    suggest_check(chosen)
    if chosen.continued:
        print(
            f"continuing run {chosen.state.run_id} (its last state: {chosen.stopped_at}); pass --restart to start over"
        )
    return detach(chosen) if args.detach else drive(chosen)


def suggest_check(chosen: ChosenRun) -> None:
    """A first run against a service that `check` never looked at (BCP: an org/ACE): say what a few minutes would
    settle."""
    backend = chosen.state.backend
    key = backend_class(backend).profile_key(chosen.config.options[backend], os.environ)
    if key and load_profile(chosen.store.root, key) is None:
        print(
            f"note: no `check` profile for {key} yet: `bcp-pipeline check {chosen.pipeline.name}` settles, on the "
            "smallest instance in a few minutes, what this run assumes about your ACE (bcprun, ranks, limits); "
            "running with the safe defaults",
            file=sys.stderr,
        )


def cmd_resume(args: argparse.Namespace) -> int:
    chosen = choose_resume(
        store_of_run(args), args.run, config_file=given_config(args), detach=args.detach, take_back=take_back
    )
    return detach(chosen) if args.detach else drive(chosen)


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
    store, live = live_run(args)
    state, backend, view = live.state, live.backend, live.view
    undriven = store.undriven(state)
    if live.problem:
        print(f"(could not refresh job states: {live.problem})", file=sys.stderr)
    estimate, actual = estimate_against_actual(live.config, live.pipeline, state, store)
    if args.json:
        payload = state.to_json()
        payload["driven"] = not undriven if state.status in ("running", "pending") else None
        if backend is not None:
            payload["job_urls"] = {
                j.job_id: backend.job_url(j.job_id)
                for s in state.stages.values()
                for j in s.jobs
                if backend.job_url(j.job_id)
            }
        if estimate is not None:
            seconds = {s.stage: s.seconds for s in estimate.stages}
            payload["estimates"] = {name: {"estimate_s": seconds.get(name), **rates} for name, rates in actual.items()}
        if view is not None:
            payload["driver"] = view.as_json()
        print(json.dumps(payload, indent=2, sort_keys=True))
    else:
        throughput = (
            latest_throughput(state, live.pipeline, backend, instances_table(live.config.options["bcp"].instances))
            if backend is not None and live.pipeline is not None
            else None
        )
        heldout = heldout_results(state, live.pipeline, backend)
        print(
            render_status(
                state,
                backend.job_url if backend else None,
                estimate,
                actual,
                throughput,
                undriven=undriven,
                heldout=heldout,
            )
        )
        if view is not None:
            print("\n".join(render_driver(view, state.run_id, state.status == "succeeded", backend.job_url)))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Gathered like `status` (live job states where the backend answers); report/gather.py does the rest."""
    store, live = live_run(args)
    notes = [f"job states as last recorded (could not refresh them: {live.problem})"] if live.problem else []
    if live.state.detached and live.config is not None:  # the commands its drivers kept, from their logs
        chosen = ChosenRun(config=live.config, pipeline=live.pipeline, store=store, state=live.state, selected=set())
        try:
            detached_run(chosen).keep_submitted()
        except PipelineError as exc:
            notes.append(f"the commands the drivers kept could not be read: {exc}")
    estimate, actual = estimate_against_actual(live.config, live.pipeline, live.state, store)
    instances = instances_table(live.config.options["bcp"].instances) if live.config is not None else None
    path = write_report(
        store,
        live.state,
        pipeline=live.pipeline,
        backend=live.backend,
        estimate=estimate,
        actual=actual,
        out=Path(args.out) if args.out else None,
        notes=notes,
        instances=instances,
    )
    print(f"report of run {live.state.run_id} ({live.state.status}): {path}")
    return 0


def estimate_against_actual(
    config: Config | None, pipeline: PipelineConfig | None, state: RunState, store: RunStore | None = None
):
    """The pipeline's estimate (with the step time `profile` measured, as `plan` has it) and each stage's effective
    rates so far (None, {} without a loaded config)."""
    if config is None or pipeline is None:
        return None, {}
    measured = load_measurement(store.root, pipeline.name) if store is not None else None
    estimate = estimate_pipeline(
        pipeline, instances_table(config.options["bcp"].instances), measured, backend=state.backend, here=this_machine()
    )
    now = time.time()
    return estimate, {
        name: actual_rates(pipeline.stages[name], stage, now)
        for name, stage in state.stages.items()
        if name in pipeline.stages
    }


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
            if args.follow:
                return print_followed(backend, view.latest.job_id, None, args.tail)
            text = backend.logs(view.latest.job_id, tail=args.tail if args.state_lines else None)
            print(text if args.state_lines else without_state_lines(text, args.tail))
            return 0
    job = stage_job(state, args.stage, args.verify)
    if args.follow:
        return print_followed(backend, job.job_id, args.rank, args.tail)
    stage = chosen.pipeline.stages.get(args.stage)
    if args.rank is None and job.kind == "stage" and stage is not None and stage.engine is not None:
        print(backend.training_log(job.job_id, tail=args.tail))  # where the step lines are (the last rank's)
        return 0
    print(backend.logs(job.job_id, rank=args.rank, tail=args.tail))
    return 0


def print_followed(backend: Backend, job_id: str, rank: int | None, tail: int | None) -> int:
    """`logs --follow`: each line as the backend reads it, until the job has ended (Ctrl-C stops sooner)."""
    for line in backend.follow_logs(job_id, rank=rank, tail=tail):
        print(line, flush=True)
    return 0


def without_state_lines(log: str, tail: int | None) -> str:
    """A driver's log for people: its BCPP-STATE lines (the whole run state after each save, KBs each, for the
    laptop to read back) replaced by one count, then the last `tail` lines."""
    lines = log.splitlines()
    kept = [line for line in lines if not line.startswith((SNAPSHOT_PREFIX, SUBMITTED_PREFIX))]
    counts = [
        (sum(line.startswith(prefix) for line in lines), prefix.strip())
        for prefix in (SNAPSHOT_PREFIX, SUBMITTED_PREFIX)
    ]
    hidden = " and ".join(f"{count} {name}" for count, name in counts if count)
    kept = kept[-tail:] if tail else kept
    return "\n".join(kept + ([f"({hidden} line(s) hidden: --state-lines shows them)"] if hidden else []))


def cmd_cancel(args: argparse.Namespace) -> int:
    chosen = stored_run(args)
    state = chosen.state
    if state.driver_owned:
        drivers, outcome = detached_run(chosen).cancel()
        stopped = f"its driver job(s) {', '.join(drivers)} stopped" if drivers else "no driver job was running"
        if outcome is None:
            print(f"run {state.run_id} had already finished ({state.status}): nothing to stop ({stopped})")
        else:
            print(f"cancelled run {state.run_id}: {stopped}; {outcome.describe()}")
        return 0
    if not state.still_going():
        print(f"run {state.run_id} had already finished ({state.status}): nothing to stop")
        return 0
    done = cancel_run(chosen)
    state, what = chosen.state, done.outcome.describe()
    if done.unanswered:
        print(
            f"run {state.run_id}: the orchestrator driving it has not answered the cancel in "
            f"{CANCEL_ANSWER_SECONDS:.0f} s; from here: {what}. It stops the run before its next submission "
            f"(or `bcp-pipeline cancel {state.run_id}` again)"
        )
    elif not state.still_going() and state.status != "cancelled":
        print(f"run {state.run_id} had already finished ({state.status}): nothing to stop ({what})")
    else:
        by = " by the orchestrator driving it" if done.by_orchestrator else ""
        print(f"cancelled run {state.run_id}{by}: {what}")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    """A finished (or cancelled) run's state and the outputs named after it; `--dry-run` lists them only."""
    chosen = stored_run(args)
    state, store = chosen.state, store_of_run(args)
    if state.still_going():
        raise StateError(
            f"run {state.run_id} is {state.status}: `bcp-pipeline cancel {state.run_id}` first, then "
            "remove it (a run's outputs are removed only once nothing writes them)"
        )
    backend = make_backend(state.backend, chosen.config, chosen.pipeline, store.run_dir(state.run_id))
    workspace = getattr(backend, "local_workspace", None)
    # None: the workspace is no folder here (BCP, a cluster's volume), so its outputs stay, and that is said
    outputs = run_outputs(workspace, state.run_id) if workspace else []
    paths = [*outputs, store.run_dir(state.run_id)]
    verb = "would remove" if args.dry_run else "removing"
    for path in paths:
        print(f"{verb} {path} ({size_of(path) / 1e6:.1f} MB)")
    if workspace is None:
        print(
            f"note: run {state.run_id}'s workspace is on {state.backend}, not a folder here: its outputs there "
            f"stay (those named after the run hold {state.run_id})"
        )
    if not args.dry_run:
        remove_paths(paths)
        print(f"removed run {state.run_id}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    config = load_and_check(config_file(args))
    store = run_store(args)
    runs, corrupt = store.scan()
    undriven = {r.run_id for r in runs if store.undriven(r)}
    if args.json:
        print(
            json.dumps(
                {
                    "pipelines": [
                        {"name": p.name, "backend": p.backend, "description": p.description, "stages": p.order()}
                        for p in config.pipelines.values()
                    ],
                    "runs": [
                        {
                            "run_id": r.run_id,
                            "pipeline": r.pipeline,
                            "backend": r.backend,
                            "status": r.status,
                            "driven": r.run_id not in undriven if r.status in ("running", "pending") else None,
                            "created_at": r.created_at,
                        }
                        for r in runs
                    ],
                    "corrupt_runs": [
                        {
                            "run_id": c.run_id,
                            "pipeline": c.pipeline,
                            "status": "corrupt",
                            "state_set_aside_as": str(c.path),
                            "reason": c.reason,
                        }
                        for c in corrupt
                    ],
                },
                indent=2,
            )
        )
        return 0
    rows = [["PIPELINE", "BACKEND", "STAGES", "DESCRIPTION"]]
    rows += [[p.name, p.backend, " -> ".join(p.order()), p.description] for p in config.pipelines.values()]
    print(format_table(rows))
    print()
    if runs or corrupt:
        rows = [["RUN", "PIPELINE", "BACKEND", "STATUS"]] + [
            [r.run_id, r.pipeline, r.backend, run_status_text(r, r.run_id in undriven)] for r in runs
        ]
        rows += [[c.run_id, c.pipeline or "?", "?", f"corrupt (state set aside as {c.path})"] for c in corrupt]
        print(format_table(rows))
    else:
        print("no runs yet")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    return 0 if verify_stage(stored_run(args), args.stage, Reporter()) else 1
