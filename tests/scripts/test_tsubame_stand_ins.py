"""The TSUBAME set-up's stand-ins without a cell: the JSV (scripts/_clusters/tsubame_jsv.py) spoken to over Grid
Engine's JSV protocol as qmaster speaks it, and the qsub wrapper (tests/fakes/tsubame_qsub) in front of a recorder
standing where the cell's qsub is. On the real cell: tests/e2e/test_gridengine_tsubame_e2e.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JSV = REPO / "scripts" / "_clusters" / "tsubame_jsv.py"
WRAPPER = REPO / "tests" / "fakes" / "tsubame_qsub" / "qsub"


def verified(params: dict[str, str]) -> list[str]:
    """The JSV's answer lines for one job, after START (STARTED first), as qmaster reads them."""
    lines = ["START", *[f"PARAM {name} {value}" for name, value in params.items()], "BEGIN", "QUIT", ""]
    res = subprocess.run(
        [sys.executable, str(JSV)], input="\n".join(lines), capture_output=True, text=True, timeout=30, check=True
    )
    answer = res.stdout.splitlines()
    assert answer[0] == "STARTED", answer
    return answer[1:]


def test_the_jsv_turns_node_f_into_whole_hosts_of_the_site_s_parallel_environment() -> None:
    assert verified({"l_hard": "h_rt=3600,node_f=2", "ac": "TSUBAME_GROUP=tga-x", "N": "demo.download"}) == [
        "PARAM pe_name site_node_f",
        "PARAM pe_min 2",
        "PARAM pe_max 2",
        "PARAM l_hard h_rt=3600,node_f=1",
        "RESULT STATE CORRECT node_f=2: 2 whole node(s) over site_node_f",
    ]


def test_the_jsv_refuses_what_tsubame_refuses_in_its_words() -> None:
    cases = {
        "h_rt=60": "no resource type",
        "h_rt=60,node_f=0": "-l node_f=0: the number of nodes",
        "node_f=1": "Job is rejected. h_rt must be specified.",
        "node_f=1,h_rt=90000": "longer than 24:00:00",
        "node_f=1,h_rt=0:11:00": "Job is rejected, h_rt can not be longer than 10 mins with this group",
    }
    for l_hard, words in cases.items():
        answer = verified({"l_hard": l_hard})
        assert len(answer) == 1 and answer[0].startswith("RESULT STATE REJECT ") and words in answer[0], answer
    named = verified({"l_hard": "node_f=2,h_rt=60", "pe_name": "mpi", "pe_min": "2", "pe_max": "2"})
    assert named[0].startswith("RESULT STATE REJECT -pe mpi:"), named
    # a trial run (no group) of 10 minutes is taken
    assert verified({"l_hard": "node_f=1,h_rt=600"})[-1].startswith("RESULT STATE CORRECT")


def wrapped(
    tmp_path: Path, *args: str, script: str | None = None, groups: str = "tga-x"
) -> tuple[subprocess.CompletedProcess, list[str], str]:
    """The wrapper run with a recorder as the cell's qsub ($SGE_ROOT/bin/lx-amd64/qsub): (its result, the argv
    the real qsub got, the script it read on stdin)."""
    real = tmp_path / "root" / "bin" / "lx-amd64" / "qsub"
    real.parent.mkdir(parents=True, exist_ok=True)
    real.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/argv\ncat > {tmp_path}/stdin\necho 42\n")
    real.chmod(0o755)
    for name in ("argv", "stdin"):
        (tmp_path / name).unlink(missing_ok=True)
    env = {**os.environ, "SGE_ROOT": str(tmp_path / "root"), "BCP_FAKE_TSUBAME_GROUPS": groups}
    res = subprocess.run(
        [sys.executable, str(WRAPPER), *args], input=script, capture_output=True, text=True, env=env, timeout=30
    )
    argv = (tmp_path / "argv").read_text().splitlines() if (tmp_path / "argv").exists() else []
    stdin = (tmp_path / "stdin").read_text() if (tmp_path / "stdin").exists() else ""
    return res, argv, stdin


def test_the_qsub_wrapper_takes_the_group_on_the_command_line_only(tmp_path: Path) -> None:
    script = "#!/bin/bash\n#$ -l node_f=1\n#$ -l h_rt=0:05:00\necho '-g' is fine in a command\n"
    res, argv, stdin = wrapped(tmp_path, "-terse", "-g", "tga-x", "-w", "v", script=script)
    assert res.returncode == 0 and res.stdout == "42\n", res
    assert argv == ["-terse", "-w", "v", "-ac", "TSUBAME_GROUP=tga-x"] and stdin == script
    # a script file after switches with arguments (-pe takes two): read for #$ lines, handed on as a file
    job = tmp_path / "job.sh"
    job.write_text(script)
    res, argv, _ = wrapped(tmp_path, "-pe", "x", "2", "-N", "n", str(job), "arg1")
    assert res.returncode == 0 and argv == ["-pe", "x", "2", "-N", "n", str(job), "arg1"], (res, argv)
    job.write_text("#!/bin/bash\n#$ -N n\n#$ -j y -g tga-x\ntrue\n")
    res, argv, _ = wrapped(tmp_path, "-g", "tga-x", str(job))
    assert res.returncode == 1 and not argv, res  # nothing reached Grid Engine
    assert "qsub: Unknown option: line 3 of the job script, '#$ -j y -g tga-x'" in res.stderr, res.stderr
    res, argv, _ = wrapped(tmp_path, "-g", "tga-other", script=script)
    assert res.returncode == 1 and not argv and "-g tga-other: not a TSUBAME group of yours (tga-x)" in res.stderr
    # -b y: the command is no script, nothing of it is read
    res, argv, _ = wrapped(tmp_path, "-b", "y", "/bin/echo", "-g")
    assert res.returncode == 0 and argv == ["-b", "y", "/bin/echo", "-g"], (res, argv)
