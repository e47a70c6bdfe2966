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

import re
import secrets
import shlex
import time
from dataclasses import dataclass, field

from bcp_pipeline.backends.bcp import lookups
from bcp_pipeline.backends.bcp.states import STATE_MAP, status_of
from bcp_pipeline.backends.bcp.render import JobSpec, label
from bcp_pipeline.backends.bcp.transport import Transport
from bcp_pipeline.backends.contract import JobState
from bcp_pipeline.errors import BackendCallError
from bcp_pipeline.config.instances import instances_table
from bcp_pipeline.backends.bcp.nemo_probe import nemo_commandline, nemo_row, plan_nemo_probes
from bcp_pipeline.backends.bcp.clock import submitted_clock
from bcp_pipeline.backends.checks import always_cleaned_up
from bcp_pipeline.backends.checks import CheckInput
from bcp_pipeline.backends.checks import fields, lines_of
from bcp_pipeline.backends.checks import Row, different, ok, unchecked

PROBE_RUNTIME = "10M"  # each probe job's --total-runtime: the most it can cost
WAIT_SECONDS = 1800.0  # a probe not finished after this (queueing included) is killed and reported
KILL_WAIT_SECONDS = 600.0
PREEMPT_WAIT_SECONDS = 300.0  # a preempted probe job not PREEMPTED (or ended) after this: no answer
RESUME_WAIT_SECONDS = 600.0  # a resumed one not RUNNING again after this (it queues first): no answer
RESTART_LOG_WAIT_SECONDS = 60.0  # once RUNNING again, how long its log may take to show the commandline's start
STATUS_WAIT_SECONDS = 60.0  # for one answer of `job info` (a busy API is asked again)
ARRAY_TYPES = {"PYTORCH", "PyTorchJob"}  # NGC_ARRAY_TYPE values known for --array-type PYTORCH (emulator; NVIDIA's
# public scripts): anything else is reported as different


@dataclass(kw_only=True)
class ProbePlan:
    instance: str
    replicas: int
    image: str
    workspace: str | None  # NAME:MOUNT:RW
    mount: str | None
    bcprun_flags: list[str]
    token: str = field(default_factory=lambda: secrets.token_hex(4))

    @property
    def per_node(self) -> int:
        """bcprun's processes per node in the probe (the rendered --npernode)."""
        for i, word in enumerate(self.bcprun_flags[:-1]):
            if word in ("--npernode", "-p") and self.bcprun_flags[i + 1].isdigit():
                return int(self.bcprun_flags[i + 1])
        return 1

    @property
    def world(self) -> int:
        return self.replicas * self.per_node

    @property
    def marker(self) -> str:
        return f".bcpp-check-{self.token}"

    def instance_minutes(self) -> int:
        return self.replicas * 10 + 10  # both jobs at their --total-runtime, the most they can cost


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
        words = shlex.split(submission.payload["spec"]["commandline"]) if "bcprun" in \
            submission.payload["spec"]["commandline"] else []
        if words[:1] == ["bcprun"] and "--cmd" in words:
            flags = words[1:words.index("--cmd")]
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
        (s.payload["spec"]["image"] for s in ctx.submissions()), None)
    if image is None:
        return None
    mount = pipeline.workspace.mount.rstrip("/") if pipeline else None
    return ProbePlan(instance=instance, replicas=replicas, image=image, mount=mount,
                     workspace=f"{pipeline.workspace.name}:{mount}:RW" if pipeline else None,
                     bcprun_flags=rendered_bcprun_flags(ctx, replicas))


def probe_commandline(plan: ProbePlan) -> str:
    rank_cmd = ('echo "BCPP-RANK rank=${RANK-unset} world=${WORLD_SIZE-unset} local=${LOCAL_RANK-unset} '
                'master=${MASTER_ADDR-unset} replica=${NGC_ARRAY_INDEX-unset} '
                'slurm=${SLURM_JOB_ID-unset}/${SLURM_NODEID-unset}/${SLURM_PROCID-unset}"')
    lines = [
        'echo "BCPP-PROBE replica=${NGC_ARRAY_INDEX-unset} size=${NGC_ARRAY_SIZE-unset} job=${NGC_JOB_ID-unset} '
        'type=${NGC_ARRAY_TYPE-unset} shell=$(readlink /proc/$$/exe 2>/dev/null || echo "$0")"',
        "env | grep -E '^(NGC_[A-Z0-9_]*|RANK|WORLD_SIZE|LOCAL_RANK|MASTER_ADDR|MASTER_PORT)=' "
        "| grep -v -i -E '^[^=]*(key|token|secret|passw)' | sed 's/^/BCPP-ENV /'",
        "if command -v bcprun >/dev/null 2>&1; then",
        '  echo "BCPP-BCPRUN present $(command -v bcprun)"',
        "  bcprun --help 2>&1 | head -n 40 | sed 's/^/BCPP-BCPRUN-HELP /'",
        f"  bcprun {shlex.join(plan.bcprun_flags)} --cmd {shlex.quote(rank_cmd)} 2>&1; "
        'echo "BCPP-BCPRUN-EXIT $?"',
        'else echo "BCPP-BCPRUN absent"; fi',
        "echo \"BCPP-PYTHON $(python3 -c 'import sys; print(\"%d.%d.%d\" % sys.version_info[:3])' 2>&1 | head -n 1)\"",
        'echo "BCPP-PIP $(python3 -m pip --version 2>&1 | head -n 1)"',
    ]
    if plan.mount:
        target = shlex.quote(f"{plan.mount}/{plan.marker}")
        lines.append(f'if [ "${{NGC_ARRAY_INDEX-0}}" = 0 ]; then echo {plan.token} > {target} && '
                     'echo "BCPP-MARKER written"; fi')
    return "\n".join(lines)


def kill_commandline(plan: ProbePlan) -> str:
    reads = (f"echo \"BCPP-SEEN $(cat {shlex.quote(f'{plan.mount}/{plan.marker}')} 2>&1)\"; "
             f"rm -f {shlex.quote(f'{plan.mount}/{plan.marker}')}; ") if plan.mount else ""
    return ('echo "BCPP-SINGLE bcprun=$(command -v bcprun || echo absent)"; ' + reads +
            'echo "BCPP-WAITING"; sleep 900')


def spec_for(ctx: CheckInput, plan: ProbePlan, name: str, commandline: str, replicas: int,
             image: str | None = None) -> JobSpec:
    options = ctx.config.options["bcp"]
    return JobSpec(name=name, image=image or plan.image, instance=plan.instance, result="/results", commandline=commandline,
                   workspaces=(plan.workspace,) if plan.workspace else (), replicas=replicas,
                   array_type="PYTORCH" if replicas > 1 else None, total_runtime=PROBE_RUNTIME,
                   labels=(label("check", plan.token),), org=options.org, team=options.team, ace=options.ace)


def run_probes(ctx: CheckInput, transport: Transport, ace: dict, notes: list[str]) -> tuple[list[Row], dict]:
    """The probe rows and facts; `notes` gets what they cost (announced before the first submission)."""
    plan = plan_probe(ctx, ace)
    if plan is None:
        return [unchecked("probe job", "a probe job can run", "the ACE lists no instance, or no image is configured",
                          "name a pipeline with a bcp image")], {}
    nemo_probes = plan_nemo_probes(ctx)
    nemo_note = "".join(f", 1 job of 1 x {plan.instance} in {p.image} (its NeMo launcher composes stage {p.stage}'s "
                        f"config; nothing trains)" for p in nemo_probes)
    most = plan.instance_minutes() + 10 * len(nemo_probes)
    notes.append(f"probe jobs: 1 job of {plan.replicas} x {plan.instance}, then 1 job of 1 x {plan.instance} "
                 f"preempted, resumed (where BCP lets it) and killed once it runs{nemo_note}: at most {most} "
                 f"instance-minutes (their --total-runtime {PROBE_RUNTIME}); a few in practice. All are killed when "
                 f"check ends.")
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
        probe_id = transport.submit(spec_for(ctx, plan, "bcp-pipeline.check", probe_commandline(plan),
                                             plan.replicas))
        ids.append(probe_id)
        clock = submitted_clock(transport, probe_id, before, time.time())
        nemo_ids = []
        for nemo in nemo_probes:  # submitted now: a NeMo image's pull runs while the other probes do
            nemo_ids.append(transport.submit(spec_for(ctx, plan, "bcp-pipeline.check-nemo", nemo_commandline(nemo),
                                                      1, image=nemo.image)))
            ids.append(nemo_ids[-1])
        ended = wait_until(transport, probe_id, lambda s: s.state.finished, WAIT_SECONDS)
        logs = {r: _log(transport, probe_id, r, None) for r in range(plan.replicas)}
        tail = _log(transport, probe_id, 0, 3)
        history = _history(transport, probe_id)
        kill_id = transport.submit(spec_for(ctx, plan, "bcp-pipeline.check-kill", kill_commandline(plan), 1))
        ids.append(kill_id)
        lag = listed_after(transport, label("check", plan.token), kill_id)
        running = wait_until(transport, kill_id, lambda s: "BCPP-WAITING" in (_log(transport, kill_id, 0, None)
                                                                                  or "") or s.state.finished,
                             WAIT_SECONDS)
        kill_log = _log(transport, kill_id, 0, None) or ""
        preemption = probe_preemption(transport, kill_id) if running and not running.state.finished else None
        before_kill = wait_until(transport, kill_id, lambda s: True, STATUS_WAIT_SECONDS) if preemption else None
        killed_from = before_kill.native if before_kill else None
        kill_seconds, kill_states = timed_kill(transport, kill_id) \
            if preemption and not (before_kill and before_kill.state.finished) else (None, [])
        timed = killed_running(killed_from)  # only the kill of a running job tells `cancel` how long one takes
        nemo_results = []
        for nemo, nemo_id in zip(nemo_probes, nemo_ids):
            nemo_ended = wait_until(transport, nemo_id, lambda s: s.state.finished, WAIT_SECONDS)
            nemo_results.append(nemo_row(nemo, _log(transport, nemo_id, 0, None), nemo_ended))
        listed = {str(j.get("id")) for j in transport.list_jobs([label("check", plan.token)])}
        stranger = {str(j.get("id")) for j in transport.list_jobs([label("check", plan.token + "x")])}
    rows = [replicas_row(plan, logs, ended), env_row(plan, logs, probe_id), bcprun_row(plan, logs, kill_log),
            nsys_names_row(logs),
            python_row(logs), workspace_row(plan, logs, kill_log), labels_row(set(ids), listed, stranger, lag),
            history_row(history), logs_row(plan, logs, tail), kill_row(kill_seconds, kill_states, killed_from),
            preemption_row(preemption), *(row for row, _ in nemo_results)]
    facts = {"probe": {"instance": plan.instance, "replicas": plan.replicas,
                       "commandline_runs": runs_on(plan, logs), "bcprun": bcprun_facts(plan, logs, kill_log),
                       "kill_seconds": kill_seconds if timed else None,
                       "pending_termination": "PENDING_TERMINATION" in kill_states if timed else None,
                       "runonce_preemption": preemption.answer if preemption else None,
                       "list_lag_seconds": None if lag is None else round(lag, 1)},
             **({"nemo": [fact for _, fact in nemo_results]} if nemo_results else {})}
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
        return lookups.job_history(transport, job_id)
    except BackendCallError:
        return None


def wait_until(transport: Transport, job_id: str, done, timeout: float):
    """Poll `job info` until `done(status)`; the last status (None when it never answered), or None at timeout."""
    deadline = time.monotonic() + timeout
    delay = 0.3
    while time.monotonic() < deadline:
        try:
            status = status_of(transport.job(job_id))
        except BackendCallError:
            status = None
        if status is not None and done(status):
            return status
        time.sleep(delay)
        delay = min(delay * 1.5, 15.0)
    return None


LIST_WAIT_SECONDS = 120.0


def listed_after(transport: Transport, wanted_label: str, job_id: str) -> float | None:
    """Seconds from submission until `job list --label` shows the job (the list index may lag); None: never, within
    LIST_WAIT_SECONDS."""
    started = time.monotonic()
    delay = 0.2
    while time.monotonic() - started < LIST_WAIT_SECONDS:
        try:
            if job_id in {str(j.get("id")) for j in transport.list_jobs([wanted_label])}:
                return time.monotonic() - started
        except BackendCallError:
            pass
        time.sleep(delay)
        delay = min(delay * 1.5, 5.0)
    return None


def timed_kill(transport: Transport, job_id: str) -> tuple[float | None, list[str]]:
    """Kill a running job; seconds until it shows as ended, and the statuses it went through after the kill."""
    before = len(_history(transport, job_id) or [])
    started = time.monotonic()
    transport.kill(job_id)
    ended = wait_until(transport, job_id, lambda s: s.state.finished, KILL_WAIT_SECONDS)
    seconds = time.monotonic() - started if ended else None
    return seconds, (_history(transport, job_id) or [])[before:]


@dataclass(frozen=True, kw_only=True)
class Preemption:
    """What preempting the running kill probe (a RUNONCE job) showed. `answer`: "refused" (`job preempt` was),
    "resumable" (PREEMPTED, then RUNNING again after `job resume`), "not_resumable" (PREEMPTED, `job resume`
    refused), or None (no answer this tool can read); `steps`: what happened, for people; `statuses`: the job's
    statuses from the preempt call until before its kill."""

    answer: str | None
    steps: tuple[str, ...]
    statuses: tuple[str, ...] = ()


def probe_preemption(transport: Transport, job_id: str) -> Preemption:
    """Preempt the running job; once PREEMPTED, resume it and wait until it runs again. Bounded by the waits above."""
    before = len(_history(transport, job_id) or [])
    steps: list[str] = []

    def outcome(answer: str | None) -> Preemption:
        return Preemption(answer=answer, steps=tuple(steps),
                          statuses=tuple((_history(transport, job_id) or [])[before:]))

    try:
        transport.preempt(job_id)
    except BackendCallError as exc:  # refused only while the job still runs: not one that had ended meanwhile
        return outcome("refused" if refused_in(steps, "`job preempt`", exc, transport, job_id, JobState.RUNNING)
                       else None)
    preempted = wait_until(transport, job_id, lambda s: s.state is JobState.PREEMPTED or s.state.finished,
                           PREEMPT_WAIT_SECONDS)
    if preempted is None or preempted.state is not JobState.PREEMPTED:
        steps.append("`job preempt` accepted, but the job " + (
            f"ended {preempted.native}" if preempted else f"was not PREEMPTED after {PREEMPT_WAIT_SECONDS:.0f} s"))
        return outcome(None)
    steps.append(f"`job preempt` accepted: {preempted.native}")
    log_before = _log(transport, job_id, 0, None) or ""
    try:
        transport.resume(job_id)
    except BackendCallError as exc:  # not resumable only while it waits PREEMPTED: not one that went on by itself
        return outcome("not_resumable" if refused_in(steps, "`job resume`", exc, transport, job_id, JobState.PREEMPTED)
                       else None)
    again = wait_until(transport, job_id, lambda s: s.native == "RUNNING" or s.state.finished, RESUME_WAIT_SECONDS)
    if again is None or again.native != "RUNNING":
        steps.append("`job resume` accepted, but the job " + (
            f"ended {again.native}" if again else f"was not RUNNING again after {RESUME_WAIT_SECONDS:.0f} s"))
        return outcome(None)
    restarted = wait_until(transport, job_id, lambda s: s.state.finished or started_again(
        log_before, _log(transport, job_id, 0, None)), RESTART_LOG_WAIT_SECONDS)
    steps.append("`job resume` accepted: RUNNING again" + (
        "; its log shows the commandline started again" if restarted and not restarted.state.finished else
        f"; its log did not show the commandline starting again within {RESTART_LOG_WAIT_SECONDS:.0f} s"))
    return outcome("resumable")


REFUSAL_EXCEPT = frozenset({401, 404, 408, 429})  # a wrong key, no such job, a busy API: not the service saying no


def refusal(exc: BackendCallError) -> bool:
    """The service answered the call with a refusal (a 4xx that is not about the key, the job id or load); a call
    that got no answer, or no status this tool can read, is no answer."""
    return exc.http_status is not None and 400 <= exc.http_status < 500 and exc.http_status not in REFUSAL_EXCEPT


def refused_in(steps: list[str], call: str, exc: BackendCallError, transport: Transport, job_id: str,
               expected: JobState) -> bool:
    """Whether the failed `call` was the service refusing it while the job was still in the `expected` state (as
    read right after); what happened is added to `steps`."""
    now = wait_until(transport, job_id, lambda s: True, STATUS_WAIT_SECONDS)
    refused = refusal(exc) and now is not None and now.state is expected
    after = "" if refused else "; no status read after it" if now is None else f"; the job is {now.native} now"
    steps.append(f"{call} {'refused' if refusal(exc) else 'failed'}: {first_line(exc)}{after}")
    return refused


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:400]


# -- reading what the jobs printed (pure) ------------------------------------------------------------------------
def started_again(log_before: str, log_now: str | None) -> bool:
    """The log shows the kill probe's commandline starting once more: another BCPP-WAITING appended, or a new log
    (not the old one continued) that shows one."""
    waiting = len(lines_of(log_now, "BCPP-WAITING"))
    return waiting > len(lines_of(log_before, "BCPP-WAITING")) or \
        (waiting > 0 and not (log_now or "").startswith(log_before))


def runs_on(plan: ProbePlan, logs: dict[int, str | None]) -> str:
    ran = [r for r, text in logs.items() if lines_of(text, "BCPP-PROBE")]
    if len(ran) == plan.replicas:
        return "per_replica"
    return "launcher" if ran == [0] else "unknown"


def replicas_row(plan: ProbePlan, logs: dict[int, str | None], ended) -> Row:
    assumes = ("the commandline runs on every replica, or once on the launcher node (replica 0): the renderer is "
               "right under both (a bcprun launch; NeMo's launcher on replica 0 only)"
               if plan.replicas > 1 else "the commandline runs once in a one-replica job")
    if ended is None:
        return different("replicas", assumes, f"the probe job had not ended after {WAIT_SECONDS:.0f} s (killed)",
                         "is the ACE full? look at `ngc base-command job list`")
    model = runs_on(plan, logs)
    ran = ", ".join(str(r) for r, t in logs.items() if lines_of(t, "BCPP-PROBE")) or "none"
    showed = f"ended {ended.native}; replicas whose log shows the commandline: {ran}"
    if ended.native != "FINISHED_SUCCESS":
        return different("replicas", assumes, showed + f" ({ended.detail})", "the probe itself failed: its log says why")
    if model == "per_replica":
        return ok("replicas", assumes, showed + (" (on every replica)" if plan.replicas > 1 else ""))
    if model == "launcher" and plan.replicas > 1:
        return ok("replicas", assumes, showed + " (once, on the launcher node)",
                  "multi-node stages rely on bcprun to start the other nodes' ranks from replica 0")
    return different("replicas", assumes, showed, "neither model the renderer knows: report it")


def env_row(plan: ProbePlan, logs: dict[int, str | None], job_id: str) -> Row:
    assumes = (f"each replica sees NGC_JOB_ID, NGC_ARRAY_INDEX (its own), NGC_ARRAY_SIZE={plan.replicas}"
               + (f", NGC_ARRAY_TYPE one of {', '.join(sorted(ARRAY_TYPES))}" if plan.replicas > 1 else ""))
    seen = {r: fields(lines[0]) for r, t in logs.items() if (lines := lines_of(t, "BCPP-PROBE"))}
    if not seen:
        return unchecked("job environment", assumes, "no replica printed its environment")
    problems = []
    for replica, f in seen.items():
        if f.get("replica") != str(replica):
            problems.append(f"replica {replica} has NGC_ARRAY_INDEX={f.get('replica')}")
        if f.get("size") != str(plan.replicas):
            problems.append(f"NGC_ARRAY_SIZE={f.get('size')}")
        if f.get("job") != job_id:
            problems.append(f"NGC_JOB_ID={f.get('job')}")
        if plan.replicas > 1 and f.get("type") not in ARRAY_TYPES:
            problems.append(f"NGC_ARRAY_TYPE={f.get('type')} (not a value this tool knows)")
    names = sorted({line.split("=", 1)[0] for t in logs.values() for line in lines_of(t, "BCPP-ENV")})
    showed = "; ".join(f"replica {r}: " + " ".join(f"{k}={v}" for k, v in f.items() if k != "shell")
                       for r, f in seen.items()) + f"; NGC_* seen: {', '.join(names)}"
    if problems:
        return different("job environment", assumes, showed + "; unexpected: " + "; ".join(sorted(set(problems))),
                         "the stages' ranks come from these: report it (the emulator and the renderer assume the "
                         "values above)")
    return ok("job environment", assumes, showed)


def bcprun_facts(plan: ProbePlan, logs: dict[int, str | None], kill_log: str) -> dict:
    text = logs.get(0) or ""
    single = fields(lines_of(kill_log, "BCPP-SINGLE")[0]) if lines_of(kill_log, "BCPP-SINGLE") else {}
    exits = lines_of(text, "BCPP-BCPRUN-EXIT")
    return {"present": bool(lines_of(text, "BCPP-BCPRUN")) and lines_of(text, "BCPP-BCPRUN")[0].startswith("present"),
            "in_single_replica_jobs": None if not single else single.get("bcprun") != "absent",
            "flags": plan.bcprun_flags, "flags_accepted": exits[:1] == ["0"],
            "slurm_variables": slurm_variables(logs),
            "no_redirect_spelling": next((s for s in ("-no_redirect", "--no_redirect")
                                          if re.search(rf"(^|[\s\[]){re.escape(s)}\b",
                                                       "\n".join(lines_of(text, "BCPP-BCPRUN-HELP")))), None)}


def bcprun_row(plan: ProbePlan, logs: dict[int, str | None], kill_log: str) -> Row:
    facts = bcprun_facts(plan, logs, kill_log)
    flags = " ".join(plan.bcprun_flags)
    assumes = f"bcprun exists in a {plan.replicas}-replica job, and `bcprun {flags}` (as rendered) gives each rank " \
              f"its own RANK of WORLD_SIZE {plan.world} (one-replica stages start their ranks without it)"
    ranks = [fields(line) for t in logs.values() for line in lines_of(t, "BCPP-RANK")]
    rank_text = ", ".join(f"{f.get('rank')}/{f.get('world')}" for f in sorted(
        ranks, key=lambda f: int(f["rank"]) if str(f.get("rank")).isdigit() else -1)) or "none"
    showed = (f"bcprun {'present' if facts['present'] else 'absent'} in the {plan.replicas}-replica job, "
              f"{'present' if facts['in_single_replica_jobs'] else 'absent' if facts['in_single_replica_jobs'] is False else 'unknown'} "
              f"in a one-replica job; RANK/WORLD_SIZE seen: {rank_text}; its usage spells "
              f"{facts['no_redirect_spelling'] or 'no no_redirect flag'}")
    expected = {(str(r), str(plan.world)) for r in range(plan.world)}
    got = [(f.get("rank"), f.get("world")) for f in ranks]
    if not facts["present"]:
        return different("bcprun", assumes, showed, "multi-node stages under bcprun cannot start: `run` refuses "
                         "them while this profile stands (launcher: none with a command starting its own ranks)")
    if sorted(got) != sorted(expected) or not facts["flags_accepted"]:
        return different("bcprun", assumes, showed + f"; exit {lines_of(logs.get(0), 'BCPP-BCPRUN-EXIT')[:1]}",
                         "multi-process stages would see wrong ranks or fail to start: report the bcprun usage above")
    return ok("bcprun", assumes, showed, "" if facts["in_single_replica_jobs"] is not False else
              "no bcprun in one-replica jobs: the renderer does not use it there")


def slurm_variables(logs: dict[int, str | None]) -> str | None:
    """Whether bcprun gives its ranks SLURM_JOB_ID/SLURM_NODEID/SLURM_PROCID: `set` (every rank all three, one
    node and rank pair each), `unset` (no rank any), `partial`; None where no rank printed."""
    seen = [fields(line).get("slurm", "") for text in logs.values() for line in lines_of(text, "BCPP-RANK")]
    if not seen:
        return None
    parts = [value.split("/") for value in seen]
    if all(p == ["unset"] * 3 for p in parts):
        return "unset"
    complete = all(len(p) == 3 and "unset" not in p for p in parts)
    return "set" if complete and len({(p[1], p[2]) for p in parts}) == len(parts) else "partial"


def nsys_names_row(logs: dict[int, str | None]) -> Row:
    """NeMo's launcher names each rank's Nsight file after SLURM_JOB_ID/NODEID/PROCID (`profile`, README
    "Profiling"): what bcprun sets decides whether those names are unique as the launcher writes them."""
    assumes = ("each rank of a `profile` job writes its own Nsight file: the launcher names it after SLURM_JOB_ID, "
               "SLURM_NODEID and SLURM_PROCID, from bcprun where it sets them, else from BCP's job id, replica "
               "and RANK (BASH_ENV=stages/nsys_names.sh)")
    seen = [fields(line).get("slurm", "?") for text in logs.values() for line in lines_of(text, "BCPP-RANK")]
    found = slurm_variables(logs)
    showed = f"SLURM_JOB_ID/NODEID/PROCID per rank: {', '.join(seen) or 'no rank printed'}"
    if found is None:
        return unchecked("nsys file names", assumes, showed, "see the bcprun row")
    if found == "partial":
        return different("nsys file names", assumes, showed, "bcprun sets some SLURM_* variables, or the same "
                         "ones on several ranks: profile files may overwrite each other; profile one rank "
                         "(--ranks 0) and report the values above")
    return ok("nsys file names", assumes, showed, "bcprun sets them: the launcher's names are unique as written"
              if found == "set" else "bcprun sets none: `profile` gives each rank BCP's values instead")


def python_row(logs: dict[int, str | None]) -> Row:
    assumes = "python3 >= 3.10 and pip in the image (what stages/bootstrap.sh needs)"
    text = logs.get(0) or ""
    version = (lines_of(text, "BCPP-PYTHON") or [""])[0].strip()
    pip = (lines_of(text, "BCPP-PIP") or [""])[0].strip()
    showed = f"python3 {version or '(no answer)'}; {pip or 'pip: no answer'}"
    match = re.fullmatch(r"(\d+)\.(\d+)\.\d+", version)
    if match and (int(match.group(1)), int(match.group(2))) >= (3, 10) and pip.startswith("pip "):
        return ok("python", assumes, showed)
    return different("python", assumes, showed, "the bootstrap cannot install the stage packages: use an image "
                     "with python3 >= 3.10 and pip (stages' bcp.image)")


def workspace_row(plan: ProbePlan, logs: dict[int, str | None], kill_log: str) -> Row:
    assumes = "the workspace is mounted read-write, and what one job writes there the next job reads"
    if not plan.mount:
        return unchecked("workspace mount", assumes, "no pipeline named: no workspace to mount")
    written = bool(lines_of(logs.get(0), "BCPP-MARKER"))
    seen = (lines_of(kill_log, "BCPP-SEEN") or [""])[0].strip()
    showed = f"marker {'written' if written else 'NOT written'} at {plan.mount}; the next job read: {seen or 'nothing'}"
    if written and seen == plan.token:
        return ok("workspace mount", assumes, showed)
    return different("workspace mount", assumes, showed, "stages could not hand their outputs on: check the "
                     "workspace's mount mode and the pipeline's workspace name")


def labels_row(ours: set[str], listed: set[str], stranger: set[str], lag: float | None) -> Row:
    assumes = "`job list --label L` finds a run's jobs by label, and only jobs with that label"
    showed = f"the probe label listed {len(ours & listed)} of {len(ours)} probe jobs" + \
        (f", and {len(listed - ours)} other job(s)" if listed - ours else "") + \
        f"; a label nobody has listed {len(stranger)}" + \
        ("; a new job was never listed" if lag is None else f"; a new job was listed after {lag:.1f} s")
    if ours <= listed and not (listed - ours) and not stranger and lag is not None:
        return ok("labels", assumes, showed, "" if lag < 1 else "the list lags: after a crash the backend looks a "
                  "just-submitted job up for longer than that before submitting it again (from this profile)")
    return different("labels", assumes, showed, "the poller and crash recovery find jobs by label: with this "
                     "filter they would miss jobs or adopt strangers")


def history_row(history: list[str] | None) -> Row:
    assumes = "a job's statuses are ones the poller knows, ending FINISHED_SUCCESS"
    if history is None:
        return unchecked("status history", assumes, "`job info` gave no history")
    unknown = [s for s in history if s not in STATE_MAP]
    showed = " -> ".join(history) or "empty"
    if unknown:
        return different("status history", assumes, showed + f"; not known: {', '.join(unknown)}",
                         "the poller treats these as not finished yet: report them")
    if not history or history[-1] != "FINISHED_SUCCESS":
        return different("status history", assumes, showed, "the probe did not end as expected: its log says why")
    return ok("status history", assumes, showed)


def logs_row(plan: ProbePlan, logs: dict[int, str | None], tail: str | None) -> Row:
    assumes = "each replica's log is readable (`job log ID:N`), and `--tail` gives its last lines"
    unreadable = [r for r, t in logs.items() if t is None]
    full = (logs.get(0) or "").splitlines()
    tail_ok = tail is not None and tail.splitlines() == full[-3:]
    showed = f"replicas {', '.join(str(r) for r in logs if r not in unreadable) or 'none'} readable" + \
        (f", {', '.join(map(str, unreadable))} not" if unreadable else "") + \
        f"; --tail 3 {'matches' if tail_ok else 'does not match'} the log's end"
    if unreadable or not tail_ok:
        return different("job logs", assumes, showed, "`status`/`logs` and failure reports read these: they would "
                         "show nothing")
    return ok("job logs", assumes, showed)


def killed_running(native: str | None) -> bool:
    return native is not None and STATE_MAP.get(native) is JobState.RUNNING


def kill_row(seconds: float | None, states: list[str], killed_from: str | None = "RUNNING") -> Row:
    """`killed_from`: the probe job's status just before the kill (after the preemption probe)."""
    assumes = "a killed job ends KILLED_BY_USER (through PENDING_TERMINATION where the ACE grants a grace)"
    if seconds is None:
        return different("kill", assumes, "the job did not show as ended after the kill" if states else
                         "the kill probe never ran", "`cancel` would wait for it: look at the job in the web UI")
    unknown = [s for s in states if s not in STATE_MAP]
    showed = f"{' -> '.join(states) or '(no new status)'} in {seconds:.1f} s"
    if not killed_running(killed_from) and not unknown:
        return unchecked("kill", assumes, f"the probe job was {killed_from or 'in a status not read'} when killed "
                         f"(after the preemption probe), not running: {showed}",
                         "the kill of a running job was not timed: `cancel` waits for the ACE's termination grace")
    if unknown or not states or states[-1] != "KILLED_BY_USER":
        return different("kill", assumes, showed, "`cancel` decides when a job has stopped from these: report them")
    return ok("kill", assumes, showed, "`cancel` waits at least this long" if seconds > 5 else "")


PREEMPTION_ASSUMES = ("a RUNONCE job is never preempted, or, when it is, `job resume` runs it again (the poller "
                      "resumes preempted jobs; stages skip finished shards)")


def preemption_row(preemption: Preemption | None) -> Row:
    """`refused` and `resumable` are what the poller copes with; anything this tool cannot read is never ok."""
    topic, assumes = "preemption", PREEMPTION_ASSUMES
    if preemption is None:
        return unchecked(topic, assumes, "the kill probe never ran")
    showed = "; ".join(preemption.steps) + (f"; statuses: {' -> '.join(preemption.statuses)}"
                                             if preemption.statuses else "")
    unknown = [s for s in preemption.statuses if s not in STATE_MAP]
    if unknown:
        return different(topic, assumes, showed + f"; not known: {', '.join(unknown)}",
                         "the poller treats these as not finished yet: report them")
    if preemption.answer == "refused":
        return ok(topic, assumes, showed, "a RUNONCE job is not preempted on request here (whether the scheduler "
                  "ever preempts one cannot be tried from here)")
    if preemption.answer == "resumable":
        return ok(topic, assumes, showed)
    if preemption.answer == "not_resumable":
        return different(topic, assumes, showed, "the backend resubmits a preempted RUNONCE job instead of resuming "
                         "it (from this profile)")
    ended = [s for s in preemption.statuses if STATE_MAP[s].finished]
    if ended:
        return different(topic, assumes, showed, f"a preempted RUNONCE job ended {ended[0]} instead of waiting for "
                         "`job resume`: its stage would end with it; report it")
    return unchecked(topic, assumes, showed, "no answer this tool can read: `run` resumes preempted jobs as before")
