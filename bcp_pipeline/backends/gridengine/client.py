"""Grid Engine's client commands as the backend and its check run them: the hint their failures carry, this
user's jobs from `qstat -xml`, and a job's accounting from `qacct`."""

from __future__ import annotations

import getpass
import re
from xml.etree import ElementTree

from bcp_pipeline.backends.gridengine.states import Accounting, Listed, parse_qacct
from bcp_pipeline.errors import CommandError, SubmissionError
from bcp_pipeline.procs import run_command

HINT = (
    "is the Grid Engine cell reachable from here? try `qstat`; its clients need SGE_ROOT, SGE_CELL (and a "
    "private cell's SGE_QMASTER_PORT) in the environment"
)


def qstat_jobs() -> list[Listed]:
    """This user's jobs Grid Engine lists (pending, running, in error), one entry per `<job_list>`."""
    output = run_command(["qstat", "-u", getpass.getuser(), "-xml"], timeout=60, hint=HINT).stdout
    try:
        root = ElementTree.fromstring(output)
    except ElementTree.ParseError as exc:
        raise SubmissionError(f"`qstat -xml` printed no valid XML ({exc}): {output[:300]!r}") from None
    found = []
    for entry in root.iter("job_list"):
        text = {child.tag: (child.text or "").strip() for child in entry}
        if text.get("JB_job_number"):
            found.append(
                Listed(
                    job_id=text["JB_job_number"],
                    state=text.get("state", ""),
                    name=text.get("JB_name", ""),
                    tasks=text.get("tasks", ""),
                )
            )
    return found


def qacct(job_id: str) -> list[Accounting] | None:
    """The job's accounting records ([] when it has none), None when qacct failed."""
    try:
        text = run_command(["qacct", "-j", job_id], timeout=60, hint=HINT).stdout
    except CommandError as exc:
        # No record (yet), or no accounting file at all: a fresh cell where no job has ended.
        if re.search(r"job id \S+ not found|/accounting: No such file", exc.stderr):
            return []
        return None
    return parse_qacct(text)
