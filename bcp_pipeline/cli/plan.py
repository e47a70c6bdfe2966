"""`bcp-pipeline plan`: every job exactly as `run` would submit it, the estimates, and what the service's limits
or a saved `check` profile would refuse; nothing is submitted."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from bcp_pipeline.backends.contract import Backend, JobRequest, Submission
from bcp_pipeline.backends.registry import describe_backend_limits, detachable_backends, make_backend
from bcp_pipeline.cli.common import config_file, run_store, warn
from bcp_pipeline.cli.detach import driver_cost_line
from bcp_pipeline.config.export import bridge_exporting, unexported_notes
from bcp_pipeline.config.instances import instances_table, this_machine
from bcp_pipeline.config.model import PipelineConfig
from bcp_pipeline.config.placeholders import substitute
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.detach.jobs import planned_driver
from bcp_pipeline.engine.submitter import planned_requests
from bcp_pipeline.errors import ConfigError
from bcp_pipeline.report.estimates import estimate_pipeline, manifest_tokens
from bcp_pipeline.report.measured import load_measurement
from bcp_pipeline.report.text import render_estimates

PLAN_RUN_ID = "{pipeline}-RUN"


def cmd_plan(args: argparse.Namespace) -> int:
    config = load_and_check(config_file(args), overrides=args.overrides, pipeline=args.pipeline)
    pipeline = config.pipeline(args.pipeline)
    for notice in config.notices:
        warn(notice)
    backend_name = args.backend or pipeline.backend
    run_id = PLAN_RUN_ID.format(pipeline=pipeline.name)
    backend = make_backend(backend_name, config, pipeline, run_store(args).run_dir(run_id))
    actions = backend.prepare(pipeline, execute=False)
    requests = planned_requests(pipeline, run_id)
    rendered = render_each(backend, requests)
    submissions = [item for item in rendered if not isinstance(item, Unplanned)]
    unplanned = [item for item in rendered if isinstance(item, Unplanned)]
    if unplanned and not submissions:  # nothing to show: the first refusal alone, as `run` says it
        raise unplanned[0].error
    estimate = estimate_pipeline(
        pipeline,
        instances_table(config.options["bcp"].instances),
        load_measurement(run_store(args).root, pipeline.name),
        counted_data_tokens(backend, pipeline),
        backend=backend_name,
        here=this_machine(),
    )
    if args.detach and backend_name not in detachable_backends():
        raise ConfigError(f"--detach runs the orchestrator as a BCP job: it needs --backend bcp, not {backend_name!r}")
    driver = planned_driver(config, pipeline, run_id, os.environ) if args.detach else None
    # The service's limits (BCP: the ACE's) when the credentials are there; on stderr, so the plan itself reads
    # the same wherever it is made. A job they refuse makes the plan fail, as `run` would.
    limits = describe_backend_limits(backend_name, config, pipeline, requests, detach=args.detach)
    # What the saved `check` profile of this service rules out: `run` refuses exactly these (on stderr, as above).
    ruled_out = backend.refusals(submissions, detach=args.detach)
    refused = bool(limits and limits.violations) or bool(ruled_out)
    if limits is not None:
        print("\n".join(limits.lines()), file=sys.stderr)
    if ruled_out:
        print("plan: `run` would refuse, from the saved check profile:\n  " + "\n  ".join(ruled_out), file=sys.stderr)
    code = plan_exit_code(refused, unplanned)
    not_exported = unexported_notes(pipeline, bridge_exporting(config.pipelines.values()))
    if args.json:
        print(
            json.dumps(
                {
                    "pipeline": pipeline.name,
                    "backend": backend_name,
                    "run_id": run_id,
                    "prepare": [{"description": a.description, "printable": a.printable} for a in actions],
                    "jobs": [s.as_json() for s in submissions],
                    "estimates": estimate.as_json(),
                    **({"driver": driver} if driver else {}),
                    **({"limits": limits.as_json()} if limits is not None else {}),
                    **({"ruled_out": ruled_out} if ruled_out else {}),
                    **({"unplanned": [u.as_json() for u in unplanned]} if unplanned else {}),
                    **({"not_exported": not_exported} if not_exported else {}),
                },
                indent=2,
            )
        )
        report_unplanned(unplanned, backend_name)
        return code
    not_planned = f", {len(unplanned)} that cannot be planned" if unplanned else ""
    print(
        f"# plan: pipeline {pipeline.name} on {backend_name}; {len(submissions)} job(s){not_planned}; "
        "nothing is submitted."
    )
    print(f"# {run_id} stands for the run id a real run gets.")
    profile = getattr(backend, "profile", None)
    if profile:
        print(
            f"# rendered with what `bcp-pipeline check` found for {profile.get('key')} "
            f"(.bcp-pipeline/checks/{profile.get('key')}.json)"
        )
    if driver:
        print(f"\n# --detach: upload the orchestrator, stages/ and the config for the driver\n{driver['upload']}")
        print(f"\n# --detach: the driver job, which submits everything below from inside BCP\n{driver['printable']}")
    for action in actions:
        print(f"\n# before the first stage: {action.description}\n{action.printable}")
    print_submissions(rendered)
    for note in not_exported:
        print(f"\n# {note}")
    print()
    print("\n".join(render_estimates(estimate)))
    if driver:
        print(driver_cost_line(config, pipeline, estimate))
    report_unplanned(unplanned, backend_name)
    return code


@dataclass(frozen=True)
class Unplanned:
    """A job the backend refused to render: the rest of the plan is still worth seeing (the data stages of a
    pipeline whose training stage lacks an image), so the refusal is shown in its place and the plan fails."""

    request: JobRequest
    error: ConfigError

    def as_json(self) -> dict:
        return {"stage": self.request.stage.name, "kind": self.request.kind, "error": str(self.error)}


def render_each(backend: Backend, requests: list[JobRequest]) -> list[Submission | Unplanned]:
    """Every request rendered as `run` submits it; one the backend refuses is kept as the refusal."""
    rendered: list[Submission | Unplanned] = []
    for request in requests:
        try:
            rendered.append(backend.render(request))
        except ConfigError as exc:
            rendered.append(Unplanned(request, exc))
    return rendered


def plan_exit_code(refused: bool, unplanned: list[Unplanned]) -> int:
    """2 when a job could not be rendered at all (a config error, as `run` would exit), 1 when the service's
    limits or a check profile refuse one, else 0."""
    return ConfigError.exit_code if unplanned else 1 if refused else 0


def report_unplanned(unplanned: list[Unplanned], backend_name: str) -> None:
    """At the end, on stderr, each refusal as `run` would print it, then how many: so a script (and a reader
    scrolling past the jobs) sees that the plan is not whole, and why."""
    if unplanned:
        for item in unplanned:
            print(f"bcp-pipeline: error: {item.error}", file=sys.stderr)
        stages = ", ".join(dict.fromkeys(u.request.stage.name for u in unplanned))
        print(
            f"bcp-pipeline: error: {len(unplanned)} job(s) of stage(s) {stages} cannot be planned on "
            f"{backend_name} (each is shown in the plan where it would be); `run` would refuse them",
            file=sys.stderr,
        )


def print_submissions(rendered: list[Submission | Unplanned]) -> None:
    """Each rendered job as `plan` prints it: what it is, then exactly what would be submitted; a job that cannot
    be rendered, why (commented, so the rest stays copy-pasteable)."""
    for submission in rendered:
        request = submission.request
        if isinstance(submission, Unplanned):
            what = "verification of " if request.kind == "verify" else "stage "
            print(
                f"\n# {what}{request.stage.name}: CANNOT BE PLANNED\n"
                + "\n".join(f"# {line}" for line in str(submission.error).splitlines())
            )
            continue
        what = "verification of " if request.kind == "verify" else "stage "
        needs = f" (after {', '.join(request.stage.needs)})" if request.kind == "stage" and request.stage.needs else ""
        description = substitute(request.stage.description, request.pipeline.vars)
        about = f": {description}" if request.kind == "stage" and description else ""
        meet = f"\n{rendezvous_line(submission.rendezvous)}" if submission.rendezvous else ""
        submit = submission.payload.get("submit_argv") if isinstance(submission.payload, dict) else None
        given = f"\n# submitted with: {shlex.join(submit)} < the script below" if submit else ""
        print(
            f"\n# {what}{request.stage.name}{needs}{about}{meet}{given}{unverified_note(request)}\n"
            f"{submission.printable}"
        )
        for path, text in submission.files.items():
            print(
                f"# ... running {path} (in the workspace; written there before the job is submitted):\n"
                + "\n".join(f"#   {line}" if line else "#" for line in text.splitlines())
            )


def unverified_note(request: JobRequest) -> str:
    """A stage job's note that nothing checks its outputs: no `verify:` and no continuation (a training's steps)."""
    stage = request.stage
    if request.kind != "stage" or stage.verify or stage.continuation:
        return ""
    return (
        f"\n# {stage.name} has no `verify:` checks: it counts as done when its job succeeds, whatever it wrote "
        "(add a check that counts its outputs)"
    )


def counted_data_tokens(backend: Backend, pipeline: PipelineConfig) -> dict[str, int]:
    """Per training stage, the tokens its data holds, counted from the preprocess manifests where the backend's
    workspace is a folder here and they exist (plan's epochs then come from them, not from the declared size)."""
    if backend.local_workspace is None:
        return {}
    values = {"workspace": str(backend.local_workspace)}
    values |= {name: substitute(value, values) for name, value in pipeline.vars.items()}
    counted = {}
    for name, stage in pipeline.stages.items():
        section = getattr(stage, stage.engine) if stage.engine else None
        if section and (tokens := manifest_tokens(Path(substitute(section.data_dir, values)))):
            counted[name] = tokens
    return counted


def rendezvous_line(meet: dict) -> str:
    """`# rendezvous: MASTER_ADDR=..., MASTER_PORT=..., WORLD_SIZE=N (NODES node(s) x PER_NODE)`."""
    return (
        f"# rendezvous: MASTER_ADDR={meet['MASTER_ADDR']}, MASTER_PORT={meet['MASTER_PORT']}, "
        f"WORLD_SIZE={meet['WORLD_SIZE']} ({meet['nodes']} node(s) x {meet['per_node']})"
    )
