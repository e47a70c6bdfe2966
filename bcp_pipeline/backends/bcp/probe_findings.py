"""What `check`'s BCP probe jobs showed, read back (pure): the plan they ran under, and each row and fact from
their logs, statuses and timings (probe.py runs them)."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

from bcp_pipeline.backends.bcp.states import STATE_MAP
from bcp_pipeline.backends.checks import Row, different, fields, lines_of, ok, unchecked
from bcp_pipeline.backends.contract import JobState

WAIT_SECONDS = 1800.0  # a probe not finished after this (queueing included) is killed and reported
ARRAY_TYPES = {"PYTORCH", "PyTorchJob"}  # NGC_ARRAY_TYPE values known for --array-type PYTORCH (emulator; NVIDIA's


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


@dataclass(frozen=True, kw_only=True)
class Preemption:
    """What preempting the running kill probe (a RUNONCE job) showed. `answer`: "refused" (`job preempt` was),
    "resumable" (PREEMPTED, then RUNNING again after `job resume`), "not_resumable" (PREEMPTED, `job resume`
    refused), or None (no answer this tool can read); `steps`: what happened, for people; `statuses`: the job's
    statuses from the preempt call until before its kill."""

    answer: str | None
    steps: tuple[str, ...]
    statuses: tuple[str, ...] = ()


# -- reading what the jobs printed (pure) ------------------------------------------------------------------------
def started_again(log_before: str, log_now: str | None) -> bool:
    """The log shows the kill probe's commandline starting once more: another BCPP-WAITING appended, or a new log
    (not the old one continued) that shows one."""
    waiting = len(lines_of(log_now, "BCPP-WAITING"))
    return waiting > len(lines_of(log_before, "BCPP-WAITING")) or (
        waiting > 0 and not (log_now or "").startswith(log_before)
    )


def runs_on(plan: ProbePlan, logs: dict[int, str | None]) -> str:
    ran = [r for r, text in logs.items() if lines_of(text, "BCPP-PROBE")]
    if len(ran) == plan.replicas:
        return "per_replica"
    return "launcher" if ran == [0] else "unknown"


def replicas_row(plan: ProbePlan, logs: dict[int, str | None], ended) -> Row:
    assumes = (
        "the commandline runs on every replica, or once on the launcher node (replica 0): the renderer is "
        "right under both (a bcprun launch; NeMo's launcher on replica 0 only)"
        if plan.replicas > 1
        else "the commandline runs once in a one-replica job"
    )
    if ended is None:
        return different(
            "replicas",
            assumes,
            f"the probe job had not ended after {WAIT_SECONDS:.0f} s (killed)",
            "is the ACE full? look at `ngc base-command job list`",
        )
    model = runs_on(plan, logs)
    ran = ", ".join(str(r) for r, t in logs.items() if lines_of(t, "BCPP-PROBE")) or "none"
    showed = f"ended {ended.native}; replicas whose log shows the commandline: {ran}"
    if ended.native != "FINISHED_SUCCESS":
        return different(
            "replicas", assumes, showed + f" ({ended.detail})", "the probe itself failed: its log says why"
        )
    if model == "per_replica":
        return ok("replicas", assumes, showed + (" (on every replica)" if plan.replicas > 1 else ""))
    if model == "launcher" and plan.replicas > 1:
        return ok(
            "replicas",
            assumes,
            showed + " (once, on the launcher node)",
            "multi-node stages rely on bcprun to start the other nodes' ranks from replica 0",
        )
    return different("replicas", assumes, showed, "neither model the renderer knows: report it")


def env_row(plan: ProbePlan, logs: dict[int, str | None], job_id: str) -> Row:
    assumes = f"each replica sees NGC_JOB_ID, NGC_ARRAY_INDEX (its own), NGC_ARRAY_SIZE={plan.replicas}" + (
        f", NGC_ARRAY_TYPE one of {', '.join(sorted(ARRAY_TYPES))}" if plan.replicas > 1 else ""
    )
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
    showed = (
        "; ".join(
            f"replica {r}: " + " ".join(f"{k}={v}" for k, v in f.items() if k != "shell") for r, f in seen.items()
        )
        + f"; NGC_* seen: {', '.join(names)}"
    )
    if problems:
        return different(
            "job environment",
            assumes,
            showed + "; unexpected: " + "; ".join(sorted(set(problems))),
            "the stages' ranks come from these: report it (the emulator and the renderer assume the values above)",
        )
    return ok("job environment", assumes, showed)


def bcprun_facts(plan: ProbePlan, logs: dict[int, str | None], kill_log: str) -> dict:
    text = logs.get(0) or ""
    single = fields(lines_of(kill_log, "BCPP-SINGLE")[0]) if lines_of(kill_log, "BCPP-SINGLE") else {}
    exits = lines_of(text, "BCPP-BCPRUN-EXIT")
    return {
        "present": bool(lines_of(text, "BCPP-BCPRUN")) and lines_of(text, "BCPP-BCPRUN")[0].startswith("present"),
        "in_single_replica_jobs": None if not single else single.get("bcprun") != "absent",
        "flags": plan.bcprun_flags,
        "flags_accepted": exits[:1] == ["0"],
        "slurm_variables": slurm_variables(logs),
        "no_redirect_spelling": next(
            (
                s
                for s in ("-no_redirect", "--no_redirect")
                if re.search(rf"(^|[\s\[]){re.escape(s)}\b", "\n".join(lines_of(text, "BCPP-BCPRUN-HELP")))
            ),
            None,
        ),
    }


def bcprun_row(plan: ProbePlan, logs: dict[int, str | None], kill_log: str) -> Row:
    facts = bcprun_facts(plan, logs, kill_log)
    flags = " ".join(plan.bcprun_flags)
    assumes = (
        f"bcprun exists in a {plan.replicas}-replica job, and `bcprun {flags}` (as rendered) gives each rank "
        f"its own RANK of WORLD_SIZE {plan.world} (one-replica stages start their ranks without it)"
    )
    ranks = [fields(line) for t in logs.values() for line in lines_of(t, "BCPP-RANK")]
    rank_text = (
        ", ".join(
            f"{f.get('rank')}/{f.get('world')}"
            for f in sorted(ranks, key=lambda f: int(f["rank"]) if str(f.get("rank")).isdigit() else -1)
        )
        or "none"
    )
    single = facts["in_single_replica_jobs"]
    showed = (
        f"bcprun {'present' if facts['present'] else 'absent'} in the {plan.replicas}-replica job, "
        f"{'present' if single else 'absent' if single is False else 'unknown'} "
        f"in a one-replica job; RANK/WORLD_SIZE seen: {rank_text}; its usage spells "
        f"{facts['no_redirect_spelling'] or 'no no_redirect flag'}"
    )
    expected = {(str(r), str(plan.world)) for r in range(plan.world)}
    got = [(f.get("rank"), f.get("world")) for f in ranks]
    if not facts["present"]:
        return different(
            "bcprun",
            assumes,
            showed,
            "multi-node stages under bcprun cannot start: `run` refuses "
            "them while this profile stands (launcher: none with a command starting its own ranks)",
        )
    if sorted(got) != sorted(expected) or not facts["flags_accepted"]:
        return different(
            "bcprun",
            assumes,
            showed + f"; exit {lines_of(logs.get(0), 'BCPP-BCPRUN-EXIT')[:1]}",
            "multi-process stages would see wrong ranks or fail to start: report the bcprun usage above",
        )
    return ok(
        "bcprun",
        assumes,
        showed,
        ""
        if facts["in_single_replica_jobs"] is not False
        else "no bcprun in one-replica jobs: the renderer does not use it there",
    )


def last_rank_row(plan: ProbePlan, logs: dict[int, str | None]) -> Row:
    """Megatron-Bridge prints its step lines from the last rank only; `logs`, `status` and the report read replica
    0's log, then the last replica's (BcpBackend.training_log). Where the probe's last rank (started as the rendered
    jobs start theirs) printed says whether they will find those lines on this ACE."""
    last_replica = plan.replicas - 1
    assumes = (
        f"the last rank's output (rank {plan.world - 1}, where Megatron-Bridge prints its step lines) lands in "
        f"replica 0's log or replica {last_replica}'s, the ones `logs`, `status` and the report read"
    )
    last = str(plan.world - 1)
    found = [
        replica
        for replica, text in logs.items()
        if any(fields(line).get("rank") == last for line in lines_of(text, "BCPP-RANK"))
    ]
    if not found:
        return unchecked("last rank's lines", assumes, f"no log shows rank {last}", "see the bcprun row")
    showed = f"rank {last} printed in the log of replica {', '.join(map(str, found))}"
    if 0 in found or last_replica in found:
        return ok("last rank's lines", assumes, showed)
    return different(
        "last rank's lines",
        assumes,
        showed,
        f"Bridge's step lines would be in replica {found[0]}'s log: read them with "
        f"`bcp-pipeline logs RUN pretrain --rank {found[0]}`; `status` and the report show no steps",
    )


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
    """NeMo's launcher names each rank's Nsight file after SLURM_JOB_ID/NODEID/PROCID (`profile`,
    docs/estimates-and-report.md, "Nsight file names on BCP"): what bcprun sets decides whether those names are
    unique as the launcher writes them."""
    assumes = (
        "each rank of a `profile` job writes its own Nsight file: the launcher names it after SLURM_JOB_ID, "
        "SLURM_NODEID and SLURM_PROCID, from bcprun where it sets them, else from BCP's job id, replica "
        "and RANK (BASH_ENV=stages/nsys_names.sh)"
    )
    seen = [fields(line).get("slurm", "?") for text in logs.values() for line in lines_of(text, "BCPP-RANK")]
    found = slurm_variables(logs)
    showed = f"SLURM_JOB_ID/NODEID/PROCID per rank: {', '.join(seen) or 'no rank printed'}"
    if found is None:
        return unchecked("nsys file names", assumes, showed, "see the bcprun row")
    if found == "partial":
        return different(
            "nsys file names",
            assumes,
            showed,
            "bcprun sets some SLURM_* variables, or the same "
            "ones on several ranks: profile files may overwrite each other; profile one rank "
            "(--ranks 0) and report the values above",
        )
    return ok(
        "nsys file names",
        assumes,
        showed,
        "bcprun sets them: the launcher's names are unique as written"
        if found == "set"
        else "bcprun sets none: `profile` gives each rank BCP's values instead",
    )


def python_row(logs: dict[int, str | None]) -> Row:
    assumes = "python3 >= 3.10 and pip in the image (what stages/bootstrap.sh needs)"
    text = logs.get(0) or ""
    version = (lines_of(text, "BCPP-PYTHON") or [""])[0].strip()
    pip = (lines_of(text, "BCPP-PIP") or [""])[0].strip()
    showed = f"python3 {version or '(no answer)'}; {pip or 'pip: no answer'}"
    match = re.fullmatch(r"(\d+)\.(\d+)\.\d+", version)
    if match and (int(match.group(1)), int(match.group(2))) >= (3, 10) and pip.startswith("pip "):
        return ok("python", assumes, showed)
    return different(
        "python",
        assumes,
        showed,
        "the bootstrap cannot install the stage packages: use an image "
        "with python3 >= 3.10 and pip (stages' bcp.image)",
    )


def workspace_row(plan: ProbePlan, logs: dict[int, str | None], kill_log: str) -> Row:
    assumes = "the workspace is mounted read-write, and what one job writes there the next job reads"
    if not plan.mount:
        return unchecked("workspace mount", assumes, "no pipeline named: no workspace to mount")
    written = bool(lines_of(logs.get(0), "BCPP-MARKER"))
    seen = (lines_of(kill_log, "BCPP-SEEN") or [""])[0].strip()
    showed = f"marker {'written' if written else 'NOT written'} at {plan.mount}; the next job read: {seen or 'nothing'}"
    if written and seen == plan.token:
        return ok("workspace mount", assumes, showed)
    return different(
        "workspace mount",
        assumes,
        showed,
        "stages could not hand their outputs on: check the workspace's mount mode and the pipeline's workspace name",
    )


def labels_row(ours: set[str], listed: set[str], stranger: set[str], lag: float | None) -> Row:
    assumes = "`job list --label L` finds a run's jobs by label, and only jobs with that label"
    showed = (
        f"the probe label listed {len(ours & listed)} of {len(ours)} probe jobs"
        + (f", and {len(listed - ours)} other job(s)" if listed - ours else "")
        + f"; a label nobody has listed {len(stranger)}"
        + ("; a new job was never listed" if lag is None else f"; a new job was listed after {lag:.1f} s")
    )
    if ours <= listed and not (listed - ours) and not stranger and lag is not None:
        return ok(
            "labels",
            assumes,
            showed,
            ""
            if lag < 1
            else "the list lags: after a crash the backend looks a "
            "just-submitted job up for longer than that before submitting it again (from this profile)",
        )
    return different(
        "labels",
        assumes,
        showed,
        "the poller and crash recovery find jobs by label: with this filter they would miss jobs or adopt strangers",
    )


def history_row(history: list[str] | None) -> Row:
    assumes = "a job's statuses are ones the poller knows, ending FINISHED_SUCCESS"
    if history is None:
        return unchecked("status history", assumes, "`job info` gave no history")
    unknown = [s for s in history if s not in STATE_MAP]
    showed = " -> ".join(history) or "empty"
    if unknown:
        return different(
            "status history",
            assumes,
            showed + f"; not known: {', '.join(unknown)}",
            "the poller treats these as not finished yet: report them",
        )
    if not history or history[-1] != "FINISHED_SUCCESS":
        return different("status history", assumes, showed, "the probe did not end as expected: its log says why")
    return ok("status history", assumes, showed)


def logs_row(plan: ProbePlan, logs: dict[int, str | None], tail: str | None) -> Row:
    assumes = "each replica's log is readable (`job log ID:N`), and `--tail` gives its last lines"
    unreadable = [r for r, t in logs.items() if t is None]
    full = (logs.get(0) or "").splitlines()
    tail_ok = tail is not None and tail.splitlines() == full[-3:]
    showed = (
        f"replicas {', '.join(str(r) for r in logs if r not in unreadable) or 'none'} readable"
        + (f", {', '.join(map(str, unreadable))} not" if unreadable else "")
        + f"; --tail 3 {'matches' if tail_ok else 'does not match'} the log's end"
    )
    if unreadable or not tail_ok:
        return different(
            "job logs", assumes, showed, "`status`/`logs` and failure reports read these: they would show nothing"
        )
    return ok("job logs", assumes, showed)


def killed_running(native: str | None) -> bool:
    return native is not None and STATE_MAP.get(native) is JobState.RUNNING


def kill_row(seconds: float | None, states: list[str], killed_from: str | None = "RUNNING") -> Row:
    """`killed_from`: the probe job's status just before the kill (after the preemption probe)."""
    assumes = "a killed job ends KILLED_BY_USER (through PENDING_TERMINATION where the ACE grants a grace)"
    if seconds is None:
        return different(
            "kill",
            assumes,
            "the job did not show as ended after the kill" if states else "the kill probe never ran",
            "`cancel` would wait for it: look at the job in the web UI",
        )
    unknown = [s for s in states if s not in STATE_MAP]
    showed = f"{' -> '.join(states) or '(no new status)'} in {seconds:.1f} s"
    if not killed_running(killed_from) and not unknown:
        return unchecked(
            "kill",
            assumes,
            f"the probe job was {killed_from or 'in a status not read'} when killed "
            f"(after the preemption probe), not running: {showed}",
            "the kill of a running job was not timed: `cancel` waits for the ACE's termination grace",
        )
    if unknown or not states or states[-1] != "KILLED_BY_USER":
        return different("kill", assumes, showed, "`cancel` decides when a job has stopped from these: report them")
    return ok("kill", assumes, showed, "`cancel` waits at least this long" if seconds > 5 else "")


PREEMPTION_ASSUMES = (
    "a RUNONCE job is never preempted, or, when it is, `job resume` runs it again (the poller "
    "resumes preempted jobs; stages skip finished shards)"
)


def preemption_row(preemption: Preemption | None) -> Row:
    """`refused` and `resumable` are what the poller copes with; anything this tool cannot read is never ok."""
    topic, assumes = "preemption", PREEMPTION_ASSUMES
    if preemption is None:
        return unchecked(topic, assumes, "the kill probe never ran")
    showed = "; ".join(preemption.steps) + (
        f"; statuses: {' -> '.join(preemption.statuses)}" if preemption.statuses else ""
    )
    unknown = [s for s in preemption.statuses if s not in STATE_MAP]
    if unknown:
        return different(
            topic,
            assumes,
            showed + f"; not known: {', '.join(unknown)}",
            "the poller treats these as not finished yet: report them",
        )
    if preemption.answer == "refused":
        return ok(
            topic,
            assumes,
            showed,
            "a RUNONCE job is not preempted on request here (whether the scheduler "
            "ever preempts one cannot be tried from here)",
        )
    if preemption.answer == "resumable":
        return ok(topic, assumes, showed)
    if preemption.answer == "not_resumable":
        return different(
            topic,
            assumes,
            showed,
            "the backend resubmits a preempted RUNONCE job instead of resuming it (from this profile)",
        )
    ended = [s for s in preemption.statuses if STATE_MAP[s].finished]
    if ended:
        return different(
            topic,
            assumes,
            showed,
            f"a preempted RUNONCE job ended {ended[0]} instead of waiting for "
            "`job resume`: its stage would end with it; report it",
        )
    return unchecked(topic, assumes, showed, "no answer this tool can read: `run` resumes preempted jobs as before")
