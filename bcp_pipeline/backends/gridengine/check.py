"""Checks of a Grid Engine cell: qmaster answers; every rendered job script verified (verify.py: `qsub -w v`, or on
a cell with a server-side JSV, the job as the JSV changes it), which names an unknown resource, parallel
environment or queue; every requested resource a requestable
complex of `qconf -sc` and every queue one of `qconf -sql`; the parallel environment of
each distributed stage gives one slot per host; a probe job over two hosts (`$PE_HOSTFILE`, `qrsh -inherit` to
each host, a marker written in the shared workspace on the second host and read here); and Apptainer on the exec
hosts where a stage runs in a container (its `--nv` needs the NVIDIA driver there), with a note that a `docker://`
image is pulled on every host.

The probe job is always deleted (by id, and by its unique name where qsub had not answered) when the check ends.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import subprocess
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from bcp_pipeline.backends.checks import (
    CheckInput,
    CheckOutcome,
    ProbeJob,
    Row,
    different,
    ok,
    poll_until,
    removed_at_exit,
    unchecked,
)
from bcp_pipeline.backends.gridengine.client import HINT
from bcp_pipeline.backends.gridengine.render import job_values, qsub_argv, site_setup, start_hosts
from bcp_pipeline.backends.gridengine.training import FIND_QRSH
from bcp_pipeline.backends.gridengine.verify import verify_row
from bcp_pipeline.backends.shared.batch import paths_for
from bcp_pipeline.backends.shared.command import shell_exports
from bcp_pipeline.config.resources import rank_layout
from bcp_pipeline.errors import CommandError
from bcp_pipeline.procs import run_command

PROBE_HOSTS = 2
PROBE_WAIT_SECONDS = 180.0
PROBE_LINE = re.compile(r"^BCPP-HOST (.*)$", re.M)


def check_gridengine(ctx: CheckInput) -> CheckOutcome:
    try:
        run_command(["qstat", "-g", "c"], timeout=60, hint=HINT)
        environments = run_command(["qconf", "-spl"], timeout=60, hint=HINT).stdout.split()
    except CommandError as exc:
        row = different(
            "qmaster",
            "Grid Engine's qmaster answers (qstat, qconf)",
            str(exc).splitlines()[0],
            "set SGE_ROOT/SGE_CELL (and a private cell's ports); nothing else could be checked",
        )
        return CheckOutcome(target={"cell": "unreachable"}, profile_parts=("gridengine", "unreachable"), rows=[row])
    cell = cell_name()
    rows = [
        ok("qmaster", "Grid Engine's qmaster answers (qstat, qconf)", f"cell {cell}"),
        verify_row(ctx),
        requests_row(ctx),
        environments_row(ctx, environments),
        image_row(ctx),
    ]
    facts: dict = {"parallel_environments": environments}
    notes = []
    shape = probe_shape(ctx) if ctx.jobs else None
    if shape is not None:
        notes.append(f"probe job: {shape.said} for a few seconds (deleted when check ends)")
        ctx.announce(notes[-1])
        probe_rows, probe_facts = probe(ctx, shape)
        rows += probe_rows
        facts.update(probe_facts)
    else:
        why = (
            "--no-jobs: no probe job submitted"
            if not ctx.jobs
            else "no parallel environment and no stage over several hosts to probe (set backends.gridengine."
            "parallel_environment)"
        )
        rows += [unchecked("hosts", hosts_assumption(), why), unchecked("shared folder", shared_assumption(), why)]
    return CheckOutcome(
        target={"cell": cell},
        profile_parts=("gridengine", cell.replace("/", "-")),
        rows=[r for r in rows if r is not None],
        facts=facts,
        notes=notes,
    )


def cell_name() -> str:
    """`QMASTER_HOST/CELL` from the cell's act_qmaster file (what names the profile)."""
    root, cell = os.environ.get("SGE_ROOT", "/var/lib/gridengine"), os.environ.get("SGE_CELL", "default")
    try:
        master = (Path(root) / cell / "common" / "act_qmaster").read_text().strip()
    except OSError:
        master = "unknown-qmaster"
    return f"{master}/{cell}"


def requested(ctx: CheckInput) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The `-l` resource names and `-q` queues each stage asks for (h_rt too), by name -> stages."""
    options = ctx.config.options["gridengine"]
    resources: dict[str, set[str]] = {}
    queues: dict[str, set[str]] = {}
    for name, stage in ctx.pipeline.stages.items() if ctx.pipeline else []:
        res = stage.gridengine
        asked = [*res.resources, *[arg.split(None, 1)[1] for arg in res.extra_args if arg.startswith("-l ")]]
        for words in asked:
            for one in words.split(","):
                resources.setdefault(one.split("=", 1)[0].strip(), set()).add(name)
        if res.h_rt or stage.bcp.total_runtime:
            resources.setdefault("h_rt", set()).add(name)
        extra_queues = [arg.split(None, 1)[1] for arg in res.extra_args if arg.startswith("-q ")]
        for queue in [res.queue or options.queue, *extra_queues]:
            if queue:
                queues.setdefault(queue.split("@", 1)[0], set()).add(name)
    return resources, queues


def requests_row(ctx: CheckInput) -> Row | None:
    """Every requested resource is a requestable complex (`qconf -sc`: its name or shortcut) and every queue exists
    (`qconf -sql`): a site resource such as TSUBAME's node_f is defined by the site's complexes."""
    resources, queues = requested(ctx)
    if not resources and not queues:
        return None
    assumes = "every requested resource is a requestable complex (qconf -sc) and every queue exists (qconf -sql)"
    try:
        complexes = run_command(["qconf", "-sc"], timeout=60, hint=HINT).stdout
        known_queues = set(run_command(["qconf", "-sql"], timeout=60, hint=HINT).stdout.split())
    except CommandError as exc:
        return unchecked("requested resources", assumes, f"qconf failed: {str(exc).splitlines()[0]}")
    requestable = {}
    for line in complexes.splitlines():
        fields = line.split()
        if len(fields) >= 5 and not line.startswith("#"):
            for key in fields[:2]:
                requestable[key] = fields[4].upper() in ("YES", "FORCED")
    problems = [
        f"{name} ({', '.join(sorted(stages))}): " + ("not requestable" if name in requestable else "no such complex")
        for name, stages in sorted(resources.items())
        if not requestable.get(name)
    ]
    problems += [
        f"queue {queue} ({', '.join(sorted(stages))}): no such queue"
        for queue, stages in sorted(queues.items())
        if queue not in known_queues
    ]
    fine = sorted(name for name in resources if requestable.get(name)) + [
        f"queue {queue}" for queue in sorted(queues) if queue in known_queues
    ]
    showed = "; ".join(problems + [f"requestable: {', '.join(fine)}" if fine else "nothing requestable asked"])
    if problems:
        return different(
            "requested resources",
            assumes,
            showed,
            "qsub refuses those jobs: name the cell's own "
            "complexes and queues (`qconf -sc`, `qconf -sql`), or ask the site which to request",
        )
    return ok("requested resources", assumes, showed)


def environments_row(ctx: CheckInput, environments: list[str]) -> Row | None:
    """Each distributed stage's parallel environment exists and puts one slot on each host (allocation_rule 1)."""
    assumes = "each distributed stage's parallel environment gives one slot per host (allocation_rule 1)"
    options = ctx.config.options["gridengine"]
    wanted = {}
    for name, stage in ctx.pipeline.stages.items() if ctx.pipeline else []:
        if stage.gridengine.distributed or over_hosts_training(stage):
            wanted[name] = stage.gridengine.parallel_environment or options.parallel_environment
    if not wanted:
        return ok(
            "parallel environments", assumes, f"the cell has {', '.join(environments) or 'none'}; no distributed stage"
        )
    problems, fine = [], []
    for stage, pe in wanted.items():
        if pe is None:
            fine.append(f"{stage}: none (the site's resource request must make the job parallel)")
        elif pe not in environments:
            problems.append(f"{stage}: {pe} does not exist")
        else:
            rule = allocation_rule(pe)
            (fine if rule == "1" else problems).append(f"{stage}: {pe} (allocation_rule {rule})")
    showed = "; ".join(problems + fine)
    if problems:
        return different(
            "parallel environments",
            assumes,
            showed,
            "a distributed stage needs one host per node: "
            "name a parallel environment with allocation_rule 1 (gridengine.parallel_environment)",
        )
    return ok("parallel environments", assumes, showed)


def allocation_rule(pe: str) -> str:
    try:
        text = run_command(["qconf", "-sp", pe], timeout=60, hint=HINT).stdout
    except CommandError:
        return "unknown"
    found = re.search(r"^allocation_rule\s+(\S+)", text, re.M)
    return found.group(1) if found else "unknown"


def container_stages(ctx: CheckInput) -> dict[str, str]:
    options = ctx.config.options["gridengine"]
    if options.container != "apptainer" or ctx.pipeline is None:
        return {}
    return {
        name: stage.gridengine.container_image
        for name, stage in ctx.pipeline.stages.items()
        if stage.gridengine.container_image
    }


def image_row(ctx: CheckInput) -> Row | None:
    images = container_stages(ctx)
    if not images:
        return None
    assumes = "each container image is a .sif every host reads, or a reference each host can pull"
    pulled = sorted({image for image in images.values() if "://" in image})
    showed = "; ".join(f"{stage}: {image}" for stage, image in images.items())
    if pulled:
        return ok(
            "container images",
            assumes,
            showed,
            "a docker:// (or other URI) image is pulled on every host "
            "of every job (Apptainer converts it to a .sif in its cache first): `apptainer pull` it once to a "
            ".sif on the shared file system to avoid that",
        )
    return ok("container images", assumes, showed)


def over_hosts_training(stage) -> bool:
    """A training on more than one host: one parallel job, `distributed` or not (render.py training_shape)."""
    return bool(stage.engine) and not stage.gridengine.command and rank_layout(stage, "gridengine").nodes > 1


@dataclass(frozen=True)
class ProbeShape:
    """What the probe job asks of the cell and how it reaches its hosts."""

    requests: list[str]  # its `#$` requests beyond its own name, log and runtime: `-pe NAME N`, or a stage's
    hosts: int  # the hosts it expects in $PE_HOSTFILE
    start_hosts: str  # qrsh | mpirun: as the stage over several hosts starts its hosts
    prelude: list[str]  # that stage's env and set-up lines (mpirun's, e.g. `module load openmpi`), for mpirun
    said: str  # what it asks for, in words


# A stage script's `#$` lines that are the job's own (name, shell, folder, log, runtime, array), not a request of
# hosts: the probe asks for everything else the stage asks for.
OWN_DIRECTIVES = ("-N ", "-S ", "-wd ", "-j ", "-o ", "-l h_rt=", "-t ", "-tc ")


def probe_shape(ctx: CheckInput) -> ProbeShape | None:
    """With a parallel environment (a distributed stage's, else the backend's): PROBE_HOSTS of its slots. Without
    one (TSUBAME: a site resource such as `-l node_f=N` makes the job parallel), the first stage over several hosts'
    own requests, expecting its nodes. Either way its hosts are started as that stage starts them (start_hosts)."""
    options = ctx.config.options["gridengine"]
    submission = next(
        (s for s in ctx.submissions() if s.request.kind == "stage" and spans_hosts(s.request.stage)), None
    )
    start, prelude = options.start_hosts, []
    if submission is not None:
        request = submission.request
        start = start_hosts(request, options)[0]
        if start == "mpirun":
            values = job_values(request, options, ctx.backend().paths)
            prelude = [*shell_exports(request, "gridengine", values, request.label), *site_setup(request)]
    pe = probe_environment(ctx) or options.parallel_environment
    if pe:
        return ProbeShape(
            requests=[f"-pe {pe} {PROBE_HOSTS}"],
            hosts=PROBE_HOSTS,
            start_hosts=start,
            prelude=prelude,
            said=f"{PROBE_HOSTS} hosts of parallel environment {pe}, started by {start}",
        )
    if submission is None:
        return None
    requests = [
        line[3:]
        for line in submission.printable.splitlines()
        if line.startswith("#$ ") and not line[3:].startswith(OWN_DIRECTIVES)
    ]
    nodes = rank_layout(submission.request.stage, "gridengine").nodes
    return ProbeShape(
        requests=requests,
        hosts=nodes,
        start_hosts=start,
        prelude=prelude,
        said=f"the {nodes} hosts stage {submission.request.stage.name} asks for "
        f"({' '.join(requests) or 'no request'}; no parallel environment), started by {start}",
    )


def spans_hosts(stage) -> bool:
    return (stage.gridengine.distributed and rank_layout(stage, "gridengine").nodes > 1) or over_hosts_training(stage)


def probe_environment(ctx: CheckInput) -> str | None:
    for stage in ctx.pipeline.stages.values() if ctx.pipeline else []:
        if (stage.gridengine.distributed or over_hosts_training(stage)) and stage.gridengine.parallel_environment:
            return stage.gridengine.parallel_environment
    return None


def hosts_assumption() -> str:
    return (
        "a job over several hosts (the parallel environment's slots, or a stage's own requests) gets them in "
        "$PE_HOSTFILE, and `qrsh -inherit` (or the stage's mpirun) starts a command on each"
    )


def shared_assumption() -> str:
    return "the workspace folder and the state folder are the same files on every exec host as here"


HOST_PART = (
    'echo "BCPP-HOST host=$(hostname) apptainer=$(command -v apptainer || echo none) '
    'nvidia=$(command -v nvidia-smi >/dev/null && echo yes || echo no) marker=$(cat "$1" 2>/dev/null)"'
)


# mpirun's start of the probe's part on each host, as a stage's (training.py's MPIRUN): one process a host.
MPIRUN_PART = r"""awk '{print $1 " slots=1"}' "$PE_HOSTFILE" > @HOSTFILE@
if [ -z "${ARC:-}" ] && [ -n "${arch:-}" ]; then export ARC="$arch"; fi
mpirun -np "$NHOSTS" -npernode 1 -hostfile @HOSTFILE@ --bind-to none /bin/bash @PART@ @MARKER@"""


def probe_script(name: str, output: Path, part: Path, marker_path: Path, marker: str, shape: ProbeShape) -> str:
    """A job over the shape's hosts: the first host writes the marker, every host (through `qrsh -inherit`, or the
    stage's mpirun) reports its name, apptainer, nvidia-smi and the marker it sees."""
    if shape.start_hosts == "mpirun":
        words = {"@HOSTFILE@": f"{part}.hostfile", "@PART@": str(part), "@MARKER@": str(marker_path)}
        start = [*shape.prelude, re.sub("|".join(words), lambda m: shlex.quote(words[m.group()]), MPIRUN_PART)]
    else:
        start = [
            "for host in $(awk '{print $1}' \"$PE_HOSTFILE\"); do",
            f'  "$qrsh" -inherit -nostdin "$host" /bin/bash {shlex.quote(str(part))} {shlex.quote(str(marker_path))} &',
            "done",
            "wait",
        ]
    return "\n".join(
        [
            "#!/bin/bash",
            f"#$ -N {name}",
            "#$ -S /bin/bash",
            "#$ -j y",
            f"#$ -o {output}",
            "#$ -l h_rt=0:05:00",
            *[f"#$ {line}" for line in shape.requests],
            'echo "BCPP-PE nhosts=$NHOSTS hostfile=$(awk \'{print $1}\' "$PE_HOSTFILE" | paste -sd,)"',
            f"mkdir -p {shlex.quote(str(marker_path.parent))} && echo {marker} > {shlex.quote(str(marker_path))}",
            f"printf '%s\\n' {shlex.quote(HOST_PART)} > {shlex.quote(str(part))}",
            FIND_QRSH,
            *start,
            "",
        ]
    )


def probe(ctx: CheckInput, shape: ProbeShape) -> tuple[list[Row], dict]:
    options = ctx.config.options["gridengine"]
    token = f"bcpp-check-{secrets.token_hex(4)}"
    folder = ctx.state_root / "checks" / "probes"
    folder.mkdir(parents=True, exist_ok=True)
    output, part = folder / f"{token}.out", folder / f"{token}.sh"
    if ctx.pipeline is not None:
        workspace = Path(
            paths_for(
                options,
                config_dir=ctx.config.file.parent.resolve(),
                stages_dir=ctx.config.stages_dir,
                run_dir=folder,
                workspace_name=ctx.pipeline.workspace.name,
                orchestrator_python="",
            ).workspace
        )
    else:
        workspace = folder
    marker = f".{token}"
    script = probe_script(token, output, part, workspace / marker, marker, shape)
    with deleted_at_exit(token) as job:
        started = time.monotonic()
        job.id = run_command(qsub_argv(options, "-terse"), input_text=script, timeout=60, hint=HINT).stdout.strip()
        finished = wait_gone(job.id, PROBE_WAIT_SECONDS)
        seconds = time.monotonic() - started
    if not finished:
        why = f"job {job.id} had not ended after {PROBE_WAIT_SECONDS:.0f} s (deleted)"
        return [
            different(
                "hosts",
                hosts_assumption(),
                why,
                "is the queue full, or the parallel environment too small? `qstat -f`, `qstat -j ID`",
            ),
            unchecked("shared folder", shared_assumption(), why),
        ], {}
    text = output.read_text(errors="replace") if output.is_file() else ""
    hosts = [dict(p.split("=", 1) for p in line.split() if "=" in p) for line in PROBE_LINE.findall(text)]
    rows = [hosts_row(text, hosts, shape), shared_row(output, hosts, marker, shape.hosts), apptainer_row(ctx, hosts)]
    for leftover in (workspace / marker, output, part, Path(f"{part}.hostfile")):
        leftover.unlink(missing_ok=True)
    return [r for r in rows if r is not None], {
        "probe_seconds": round(seconds, 1),
        "hosts": [h.get("host", "?") for h in hosts],
    }


def hosts_row(text: str, hosts: list[dict], shape: ProbeShape) -> Row:
    names = sorted({h.get("host", "?") for h in hosts})
    pe_line = next((line for line in text.splitlines() if line.startswith("BCPP-PE ")), "BCPP-PE (none)")
    showed = f"{pe_line[8:]}; answered from: {', '.join(names) or 'no host'} (started by {shape.start_hosts})"
    if len(names) == shape.hosts:
        return ok("hosts", hosts_assumption(), showed)
    return different(
        "hosts",
        hosts_assumption(),
        showed + f"; the job's output ends: {text.strip()[-200:]!r}",
        "a distributed stage would not reach its other hosts: check the parallel environment "
        "(control_slaves TRUE) and that qrsh -inherit (or mpirun) works between the exec hosts",
    )


def shared_row(output: Path, hosts: list[dict], marker: str, expected: int) -> Row:
    seen = sorted(h.get("host", "?") for h in hosts if h.get("marker") == marker)
    showed = (
        f"the job's output {'is' if output.is_file() else 'is NOT'} here ({output.parent}); the marker "
        f"written on the first host is seen on: {', '.join(seen) or 'no host'}"
    )
    if output.is_file() and len(seen) == len(hosts) == expected:
        return ok("shared folder", shared_assumption(), showed)
    return different(
        "shared folder",
        shared_assumption(),
        showed,
        "stages' outputs and logs would be invisible "
        "here or on the other hosts: put backends.gridengine.workspace_dir and the state folder on a "
        "file system every exec host mounts",
    )


def apptainer_row(ctx: CheckInput, hosts: list[dict]) -> Row | None:
    if not container_stages(ctx) or not hosts:
        return None
    assumes = "every exec host has apptainer, and the NVIDIA driver its --nv binds in"
    showed = "; ".join(f"{h.get('host')}: apptainer {h.get('apptainer')}, nvidia-smi {h.get('nvidia')}" for h in hosts)
    if any(h.get("apptainer") in (None, "none") for h in hosts):
        return different(
            "apptainer",
            assumes,
            showed,
            "container stages fail on those hosts: install Apptainer there, or drop the stages' container_image",
        )
    if any(h.get("nvidia") != "yes" for h in hosts):
        return different(
            "apptainer",
            assumes,
            showed,
            "--nv finds no NVIDIA driver on those hosts: GPU stages see no GPU there (CPU stages still run)",
        )
    return ok("apptainer", assumes, showed)


def deleted_at_exit(name: str) -> AbstractContextManager[ProbeJob]:
    """Whatever ends the block, the probe is deleted: by id where qsub answered, by name where it had not."""
    return removed_at_exit(
        lambda job: subprocess.run(["qdel", job.id or name], capture_output=True, timeout=60, check=False)
    )


def wait_gone(job_id: str, timeout: float) -> bool:
    """Until qstat no longer knows the job (it ended); False at the timeout."""
    return bool(
        poll_until(
            lambda: subprocess.run(["qstat", "-j", job_id], capture_output=True, timeout=60).returncode != 0 or None,
            timeout,
        )
    )
