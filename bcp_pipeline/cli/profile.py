"""`bcp-pipeline profile`: a short profiling run of the pipeline's pretrain stage, its report, and the step time it
measured, kept for `plan`."""

from __future__ import annotations

import argparse
import sys

from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.cli.common import config_file, drive, profile_store, run_store
from bcp_pipeline.cli.plan import PLAN_RUN_ID, print_submissions
from bcp_pipeline.cli.runs import estimate_against_actual
from bcp_pipeline.config.instances import instances_table
from bcp_pipeline.config.model import PipelineConfig, StageConfig
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.config.profiling import PROFILE_SUFFIX, parse_window, profile_overrides, profiled_stage
from bcp_pipeline.config.resources import rank_layout
from bcp_pipeline.engine.selection import ChosenRun, RunRequest, choose_run
from bcp_pipeline.engine.state import RunStore, StageStatus
from bcp_pipeline.engine.submitter import planned_requests
from bcp_pipeline.errors import ConfigError
from bcp_pipeline.report.gather import latest_throughput, write_report
from bcp_pipeline.report.measured import Measurement, save_measurement
from bcp_pipeline.report.throughput import summary_text


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
        print(
            f"# profile: stage {stage.name} of {pipeline.name} on {backend_name}, steps {window.as_text()} "
            f"(max_steps {window.max_steps}), ranks {','.join(map(str, window.ranks))}; nothing is submitted."
        )
        print("# its --set overrides (kept in the profile run's state):\n" + "\n".join(f"#   {o}" for o in overrides))
        print_submissions([backend.render(request) for request in requests])
        return 0
    if not args.data_ready:
        check_data_made(run_store(args), base.pipeline(args.pipeline), stage)
    request = RunRequest(
        pipeline=args.pipeline,
        config_file=config_file(args),
        backend=args.backend,
        overrides=overrides,
        only=[stage.name],
        restart=True,
    )
    chosen = choose_run(request, store)
    print(
        f"profile run {chosen.state.run_id}: stage {stage.name}, steps {window.as_text()}, kept in "
        f"{store.runs_dir} (`status`, `report`, `logs` and `resume` take its id)"
    )
    status = drive(chosen)
    if status == 0:
        report_profile(chosen, store, stage.name)
    return status


def check_data_made(store: RunStore, pipeline: PipelineConfig, stage: StageConfig) -> None:
    """Refuse, before a job is submitted, a profile whose data no run has made: the training reads what the stages it
    needs wrote, and a profile job without it fails minutes later on a folder that is not there."""
    needed = stage.needs
    runs, _ = store.scan()
    for state in runs:
        if state.pipeline == pipeline.name and all(
            name in state.stages and state.stages[name].status is StageStatus.SUCCEEDED for name in needed
        ):
            return
    raise ConfigError(
        f"profile {pipeline.name} trains stage {stage.name} on what {', '.join(needed)} wrote, and no "
        f"run of {pipeline.name} in {store.runs_dir} has finished {' and '.join(needed)}: make the "
        f"data first (`bcp-pipeline run {pipeline.name}`; its pretrain may be cancelled once "
        f"{needed[-1]} is verified), or pass --data-ready where it exists already"
    )


def report_profile(chosen: ChosenRun, store: RunStore, stage: str) -> None:
    """The profile run's measured step time kept for `plan`, then its report (its estimate made with it)."""
    state, instances = chosen.state, instances_table(chosen.config.options["bcp"].instances)
    backend = make_backend(state.backend, chosen.config, chosen.pipeline, store.run_dir(state.run_id))
    series = latest_throughput(state, chosen.pipeline, backend, instances)
    summary = series[0]["attempts"][-1]["summary"] if series else None
    kept = None
    if summary is not None:
        profiled = chosen.pipeline.stages[stage]
        measurement = Measurement(
            run_id=state.run_id,
            stage=stage,
            backend=state.backend,
            instance=profiled.resources(state.backend).instance_name(),
            nodes=rank_layout(profiled, state.backend).nodes,
            step_s=summary["step_s"],
            mfu=summary["mfu"],
        )
        kept = save_measurement(store.root, chosen.pipeline.name, measurement)
    estimate, actual = estimate_against_actual(chosen.config, chosen.pipeline, state, store)
    path = write_report(
        store, state, pipeline=chosen.pipeline, backend=backend, estimate=estimate, actual=actual, instances=instances
    )
    print(f"profile report (step time, tokens/s, MFU, timer breakdown): {path}")
    if summary is None:
        print("no step times in the profile's log: nothing measured for `plan`", file=sys.stderr)
        return
    print(f"measured: {summary_text(summary)} (median after the first step), kept for `plan` in {kept}")
