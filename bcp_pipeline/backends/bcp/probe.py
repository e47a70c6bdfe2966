"""The probe jobs of `check` on BCP (without `--no-jobs`): what only a running job can show.

One small job on the ACE's smallest instance, 2 replicas where that instance allows multi-node. Its commandline
prints which replica runs it, the shell, the job's NGC_* variables (never one named like a credential), what
`bcprun` is (its `--help`, then one call with the flags the pipeline renders, each rank printing RANK/WORLD_SIZE/
LOCAL_RANK/MASTER_ADDR), Python and pip, and writes a marker into the workspace. Then a second, one-replica job
reads the marker (so it is visible outside the job that wrote it), says whether `bcprun` exists in a one-replica
job, and, once running, is preempted (`job preempt`: refused, or PREEMPTED and then `job resume`d: does it run
again?) and killed: its way to KILLED_BY_USER is timed. Around them: the labels find both (`job list --label`),
the status history, and each replica's log (`job log ID:N`, and `--tail`).

Both jobs are killed when the check ends however it ends (Ctrl-C and SIGTERM included): found again by their
label, so also one whose `job run` was cut off before it answered.
"""

from __future__ import annotations

import shlex
import time

from bcp_pipeline.backends.bcp.clock import submitted_clock
from bcp_pipeline.backends.bcp.nemo_probe import nemo_commandline, nemo_row, plan_nemo_probes
from bcp_pipeline.backends.bcp.probe_findings import (
    WAIT_SECONDS,
    Preemption,
    ProbePlan,
    bcprun_facts,
    bcprun_row,
    env_row,
    history_row,
    kill_row,
    killed_running,
    labels_row,
    last_rank_row,
    logs_row,
    nsys_names_row,
    preemption_row,
    python_row,
    replicas_row,
    runs_on,
    started_again,
    workspace_row,
)
from bcp_pipeline.backends.bcp.render import JobSpec, label
from bcp_pipeline.backends.bcp.states import status_of
from bcp_pipeline.backends.bcp.transport import Transport
from bcp_pipeline.backends.checks import CheckInput, Row, always_cleaned_up, poll_until, unchecked
from bcp_pipeline.backends.contract import JobState, JobStatus
from bcp_pipeline.config.instances import instances_table
from bcp_pipeline.errors import BackendCallError

PROBE_RUNTIME = "10M"  # each probe job's --total-runtime: the most it can cost
KILL_WAIT_SECONDS = 600.0
PREEMPT_WAIT_SECONDS = 300.0  # a preempted probe job not PREEMPTED (or ended) after this: no answer
RESUME_WAIT_SECONDS = 600.0  # a resumed one not RUNNING again after this (it queues first): no answer
RESTART_LOG_WAIT_SECONDS = 60.0  # once RUNNING again, how long its log may take to show the commandline's start
STATUS_WAIT_SECONDS = 60.0  # for one answer of `job info` (a busy API is asked again)
# public scripts): anything else is reported as different


def smallest_instance(ace: dict, known: dict) -> str | None:
    """The ACE's instance with the fewest GPUs (the known table's, else the count in its name: dgxa100.80g.1.norm)."""

    def gpus(name: str) -> int:
        if name in known:
            return known[name].gpus
        parts = name.split(".")
        return int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 1 << 10

    names = [str(i.get("name")) for i in ace.get("instances") or [] if isinstance(i, dict)]
    return min(names, key=lambda n: (gpus(n), n)) if names else None


def rendered_bcprun_flags(ctx: CheckInput, replicas: int) -> list[str]:
    """The flags the pipeline's rendered jobs give bcprun (its first multi-node job): the same processes per node
    and spelling, on the probe's replicas."""
    for submission in ctx.submissions():
        words = (
            shlex.split(submission.payload["spec"]["commandline"])
            if "bcprun" in submission.payload["spec"]["commandline"]
            else []
        )
        if words[:1] == ["bcprun"] and "--cmd" in words:
            flags = words[1 : words.index("--cmd")]
            for i, word in enumerate(flags[:-1]):
                if word in ("--nnodes", "-n"):
                    flags[i + 1] = str(replicas)
            return flags
    return ["--nnodes", str(replicas), "--npernode", "1"]


def plan_probe(ctx: CheckInput, ace: dict) -> ProbePlan | None:
    instance = smallest_instance(ace, instances_table(ctx.config.options["bcp"].instances))
    if instance is None:
        return None
    entry = next(i for i in ace["instances"] if str(i.get("name")) == instance)
    replicas = 1 if entry.get("allowMultinode") is False else 2
    pipeline = ctx.pipeline
    image = (pipeline.verification.bcp.image if pipeline else None) or next(
        (s.payload["spec"]["image"] for s in ctx.submissions()), None
    )
    if image is None:
        return None
    mount = pipeline.workspace.mount.rstrip("/") if pipeline else None
    return ProbePlan(
        instance=instance,
        replicas=replicas,
        image=image,
        mount=mount,
        workspace=f"{pipeline.workspace.name}:{mount}:RW" if pipeline else None,
        bcprun_flags=rendered_bcprun_flags(ctx, replicas),
    )


def probe_commandline(plan: ProbePlan) -> str:
    rank_cmd = (
        'echo "BCPP-RANK rank=${RANK-unset} world=${WORLD_SIZE-unset} local=${LOCAL_RANK-unset} '
        "master=${MASTER_ADDR-unset} replica=${NGC_ARRAY_INDEX-unset} "
        'slurm=${SLURM_JOB_ID-unset}/${SLURM_NODEID-unset}/${SLURM_PROCID-unset}"'
    )
    lines = [
        'echo "BCPP-PROBE replica=${NGC_ARRAY_INDEX-unset} size=${NGC_ARRAY_SIZE-unset} job=${NGC_JOB_ID-unset} '
        'type=${NGC_ARRAY_TYPE-unset} shell=$(readlink /proc/$$/exe 2>/dev/null || echo "$0")"',
        "env | grep -E '^(NGC_[A-Z0-9_]*|RANK|WORLD_SIZE|LOCAL_RANK|MASTER_ADDR|MASTER_PORT)=' "
        "| grep -v -i -E '^[^=]*(key|token|secret|passw)' | sed 's/^/BCPP-ENV /'",
        "if command -v bcprun >/dev/null 2>&1; then",
        '  echo "BCPP-BCPRUN present $(command -v bcprun)"',
        "  bcprun --help 2>&1 | head -n 40 | sed 's/^/BCPP-BCPRUN-HELP /'",
        f'  bcprun {shlex.join(plan.bcprun_flags)} --cmd {shlex.quote(rank_cmd)} 2>&1; echo "BCPP-BCPRUN-EXIT $?"',
        'else echo "BCPP-BCPRUN absent"; fi',
        'echo "BCPP-PYTHON $(python3 -c \'import sys; print("%d.%d.%d" % sys.version_info[:3])\' 2>&1 | head -n 1)"',
        'echo "BCPP-PIP $(python3 -m pip --version 2>&1 | head -n 1)"',
    ]
    if plan.mount:
        target = shlex.quote(f"{plan.mount}/{plan.marker}")
        lines.append(
            f'if [ "${{NGC_ARRAY_INDEX-0}}" = 0 ]; then echo {plan.token} > {target} && echo "BCPP-MARKER written"; fi'
        )
    return "\n".join(lines)


def kill_commandline(plan: ProbePlan) -> str:
    reads = (
        (
            f'echo "BCPP-SEEN $(cat {shlex.quote(f"{plan.mount}/{plan.marker}")} 2>&1)"; '
            f"rm -f {shlex.quote(f'{plan.mount}/{plan.marker}')}; "
        )
        if plan.mount
        else ""
    )
    return 'echo "BCPP-SINGLE bcprun=$(command -v bcprun || echo absent)"; ' + reads + 'echo "BCPP-WAITING"; sleep 900'


def spec_for(
    ctx: CheckInput, plan: ProbePlan, name: str, commandline: str, replicas: int, image: str | None = None
) -> JobSpec:
    options = ctx.config.options["bcp"]
    return JobSpec(
        name=name,
        image=image or plan.image,
        instance=plan.instance,
        result="/results",
        commandline=commandline,
        workspaces=(plan.workspace,) if plan.workspace else (),
        replicas=replicas,
        array_type="PYTORCH" if replicas > 1 else None,
        total_runtime=PROBE_RUNTIME,
        labels=(label("check", plan.token),),
        org=options.org,
        team=options.team,
        ace=options.ace,
    )


def run_probes(ctx: CheckInput, transport: Transport, ace: dict, notes: list[str]) -> tuple[list[Row], dict]:
    """The probe rows and facts; `notes` gets what they cost (announced before the first submission)."""
    plan = plan_probe(ctx, ace)
    if plan is None:
        return [
            unchecked(
                "probe job",
                "a probe job can run",
                "the ACE lists no instance, or no image is configured",
                "name a pipeline with a bcp image",
            )
        ], {}
    nemo_probes = plan_nemo_probes(ctx)
    nemo_note = "".join(
        f", 1 job of 1 x {plan.instance} in {p.image} (its NeMo launcher composes stage {p.stage}'s "
        f"config; nothing trains)"
        for p in nemo_probes
    )
    most = plan.instance_minutes() + 10 * len(nemo_probes)
    notes.append(
        f"probe jobs: 1 job of {plan.replicas} x {plan.instance}, then 1 job of 1 x {plan.instance} "
        f"preempted, resumed (where BCP lets it) and killed once it runs{nemo_note}: at most {most} "
        f"instance-minutes (their --total-runtime {PROBE_RUNTIME}); a few in practice. All are killed when "
        f"check ends."
    )
    ctx.announce(notes[-1])
    ids: list[str] = []

    def kill_leftovers() -> None:
        try:
            found = {str(j.get("id")): j for j in transport.list_jobs([label("check", plan.token)])}
        except BackendCallError:
            found = {}
        for job_id in set(ids) | set(found):
            job = found.get(job_id)
            if job is not None and status_of(job).state.finished:
                continue
            try:
                transport.kill(job_id)
            except BackendCallError:
                pass  # ended meanwhile, or the service is away: nothing more a check can do

    with always_cleaned_up(kill_leftovers):
        before = time.time()
        probe_id = transport.submit(spec_for(ctx, plan, "bcp-pipeline.check", probe_commandline(plan), plan.replicas))
        ids.append(probe_id)
        clock = submitted_clock(transport, probe_id, before, time.time())
        nemo_ids = []
        for nemo in nemo_probes:  # submitted now: a NeMo image's pull runs while the other probes do
            nemo_ids.append(
                transport.submit(
                    spec_for(ctx, plan, "bcp-pipeline.check-nemo", nemo_commandline(nemo), 1, image=nemo.image)
                )
            )
            ids.append(nemo_ids[-1])
        ended = wait_until(transport, probe_id, lambda s: s.state.finished, WAIT_SECONDS)
        logs = {r: _log(transport, probe_id, r, None) for r in range(plan.replicas)}
        tail = _log(transport, probe_id, 0, 3)
        history = _history(transport, probe_id)
        kill_id = transport.submit(spec_for(ctx, plan, "bcp-pipeline.check-kill", kill_commandline(plan), 1))
        ids.append(kill_id)
        lag = listed_after(transport, label("check", plan.token), kill_id)
        running = wait_until(
            transport,
            kill_id,
            lambda s: "BCPP-WAITING" in (_log(transport, kill_id, 0, None) or "") or s.state.finished,
            WAIT_SECONDS,
        )
        kill_log = _log(transport, kill_id, 0, None) or ""
        preemption = probe_preemption(transport, kill_id) if running and not running.state.finished else None
        before_kill = wait_until(transport, kill_id, lambda s: True, STATUS_WAIT_SECONDS) if preemption else None
        killed_from = before_kill.native if before_kill else None
        kill_seconds, kill_states = (
            timed_kill(transport, kill_id)
            if preemption and not (before_kill and before_kill.state.finished)
            else (None, [])
        )
        timed = killed_running(killed_from)  # only the kill of a running job tells `cancel` how long one takes
        nemo_results = []
        for nemo, nemo_id in zip(nemo_probes, nemo_ids):
            nemo_ended = wait_until(transport, nemo_id, lambda s: s.state.finished, WAIT_SECONDS)
            nemo_results.append(nemo_row(nemo, _log(transport, nemo_id, 0, None), nemo_ended))
        listed = {str(j.get("id")) for j in transport.list_jobs([label("check", plan.token)])}
        stranger = {str(j.get("id")) for j in transport.list_jobs([label("check", plan.token + "x")])}
    rows = [
        replicas_row(plan, logs, ended),
        env_row(plan, logs, probe_id),
        bcprun_row(plan, logs, kill_log),
        last_rank_row(plan, logs),
        nsys_names_row(logs),
        python_row(logs),
        workspace_row(plan, logs, kill_log),
        labels_row(set(ids), listed, stranger, lag),
        history_row(history),
        logs_row(plan, logs, tail),
        kill_row(kill_seconds, kill_states, killed_from),
        preemption_row(preemption),
        *(row for row, _ in nemo_results),
    ]
    facts = {
        "probe": {
            "instance": plan.instance,
            "replicas": plan.replicas,
            "commandline_runs": runs_on(plan, logs),
            "bcprun": bcprun_facts(plan, logs, kill_log),
            "kill_seconds": kill_seconds if timed else None,
            "pending_termination": "PENDING_TERMINATION" in kill_states if timed else None,
            "runonce_preemption": preemption.answer if preemption else None,
            "list_lag_seconds": None if lag is None else round(lag, 1),
        },
        **({"nemo": [fact for _, fact in nemo_results]} if nemo_results else {}),
    }
    rows.append(clock.row)
    facts["probe"]["clock_skew_seconds"] = None if clock.skew_seconds is None else round(clock.skew_seconds, 1)
    return rows, facts


def _log(transport: Transport, job_id: str, replica: int, tail: int | None) -> str | None:
    try:
        return transport.log(job_id, replica, tail)
    except BackendCallError:
        return None


def _history(transport: Transport, job_id: str) -> list[str] | None:
    try:
        return transport.job_history(job_id)
    except BackendCallError:
        return None


def wait_until(transport: Transport, job_id: str, done, timeout: float):
    """Poll `job info` until `done(status)`; that status, or None at the timeout (a call that fails is asked
    again)."""

    def ask() -> JobStatus | None:
        try:
            status = status_of(transport.job(job_id))
        except BackendCallError:
            return None
        return status if done(status) else None

    return poll_until(ask, timeout, first_delay=0.3, max_delay=15.0)


LIST_WAIT_SECONDS = 120.0


def listed_after(transport: Transport, wanted_label: str, job_id: str) -> float | None:
    """Seconds from submission until `job list --label` shows the job (the list index may lag); None: never, within
    LIST_WAIT_SECONDS."""
    started = time.monotonic()

    def ask() -> float | None:
        try:
            listed = job_id in {str(j.get("id")) for j in transport.list_jobs([wanted_label])}
        except BackendCallError:
            return None
        return time.monotonic() - started if listed else None

    return poll_until(ask, LIST_WAIT_SECONDS, max_delay=5.0)


def timed_kill(transport: Transport, job_id: str) -> tuple[float | None, list[str]]:
    """Kill a running job; seconds until it shows as ended, and the statuses it went through after the kill."""
    before = len(_history(transport, job_id) or [])
    started = time.monotonic()
    transport.kill(job_id)
    ended = wait_until(transport, job_id, lambda s: s.state.finished, KILL_WAIT_SECONDS)
    seconds = time.monotonic() - started if ended else None
    return seconds, (_history(transport, job_id) or [])[before:]


def probe_preemption(transport: Transport, job_id: str) -> Preemption:
    """Preempt the running job; once PREEMPTED, resume it and wait until it runs again. Bounded by the waits above."""
    before = len(_history(transport, job_id) or [])
    steps: list[str] = []

    def outcome(answer: str | None) -> Preemption:
        return Preemption(
            answer=answer, steps=tuple(steps), statuses=tuple((_history(transport, job_id) or [])[before:])
        )

    try:
        transport.preempt(job_id)
    except BackendCallError as exc:  # refused only while the job still runs: not one that had ended meanwhile
        return outcome(
            "refused" if refused_in(steps, "`job preempt`", exc, transport, job_id, JobState.RUNNING) else None
        )
    preempted = wait_until(
        transport, job_id, lambda s: s.state is JobState.PREEMPTED or s.state.finished, PREEMPT_WAIT_SECONDS
    )
    if preempted is None or preempted.state is not JobState.PREEMPTED:
        steps.append(
            "`job preempt` accepted, but the job "
            + (f"ended {preempted.native}" if preempted else f"was not PREEMPTED after {PREEMPT_WAIT_SECONDS:.0f} s")
        )
        return outcome(None)
    steps.append(f"`job preempt` accepted: {preempted.native}")
    log_before = _log(transport, job_id, 0, None) or ""
    try:
        transport.resume(job_id)
    except BackendCallError as exc:  # not resumable only while it waits PREEMPTED: not one that went on by itself
        return outcome(
            "not_resumable" if refused_in(steps, "`job resume`", exc, transport, job_id, JobState.PREEMPTED) else None
        )
    again = wait_until(transport, job_id, lambda s: s.native == "RUNNING" or s.state.finished, RESUME_WAIT_SECONDS)
    if again is None or again.native != "RUNNING":
        steps.append(
            "`job resume` accepted, but the job "
            + (f"ended {again.native}" if again else f"was not RUNNING again after {RESUME_WAIT_SECONDS:.0f} s")
        )
        return outcome(None)
    restarted = wait_until(
        transport,
        job_id,
        lambda s: s.state.finished or started_again(log_before, _log(transport, job_id, 0, None)),
        RESTART_LOG_WAIT_SECONDS,
    )
    steps.append(
        "`job resume` accepted: RUNNING again"
        + (
            "; its log shows the commandline started again"
            if restarted and not restarted.state.finished
            else f"; its log did not show the commandline starting again within {RESTART_LOG_WAIT_SECONDS:.0f} s"
        )
    )
    return outcome("resumable")


REFUSAL_EXCEPT = frozenset({401, 404, 408, 429})  # a wrong key, no such job, a busy API: not the service saying no


def refusal(exc: BackendCallError) -> bool:
    """The service answered the call with a refusal (a 4xx that is not about the key, the job id or load); a call
    that got no answer, or no status this tool can read, is no answer."""
    return exc.http_status is not None and 400 <= exc.http_status < 500 and exc.http_status not in REFUSAL_EXCEPT


def refused_in(
    steps: list[str], call: str, exc: BackendCallError, transport: Transport, job_id: str, expected: JobState
) -> bool:
    """Whether the failed `call` was the service refusing it while the job was still in the `expected` state (as
    read right after); what happened is added to `steps`."""
    now = wait_until(transport, job_id, lambda s: True, STATUS_WAIT_SECONDS)
    refused = refusal(exc) and now is not None and now.state is expected
    after = "" if refused else "; no status read after it" if now is None else f"; the job is {now.native} now"
    steps.append(f"{call} {'refused' if refusal(exc) else 'failed'}: {first_line(exc)}{after}")
    return refused


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:400]
