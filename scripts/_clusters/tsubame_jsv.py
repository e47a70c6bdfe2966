#!/usr/bin/python3
"""STAND-IN for TSUBAME4's server-side job submission verifier (JSV): not the site's script, which is not public.

Run by the test cell's sge_qmaster for every submitted job (`jsv_url` in the global configuration; written by
`scripts/sge-cluster start --site tsubame`, see sge_site.py). It speaks Grid Engine's JSV protocol on stdin/stdout
as $SGE_ROOT/util/resources/jsv/jsv_include.sh does (START -> STARTED; PARAM lines, BEGIN -> PARAM changes and one
RESULT STATE ACCEPT|CORRECT|REJECT line; QUIT), and enforces what TSUBAME4's users meet:

- every job names a resource type: here only `-l node_f=N`, N whole nodes (a host's node_f capacity is 1);
- node_f=N makes the job parallel by itself: the JSV adds the site's parallel environment (`-pe site_node_f N`,
  one slot a host) and turns the request into node_f=1 a slot, so the job holds N whole hosts and gets a
  $PE_HOSTFILE; a job that names a parallel environment of its own is refused, as users never name one;
- `-l h_rt` is required ("Job is rejected. h_rt must be specified.", as TSUBAME4's FAQ quotes it), at most 24
  hours; a job without a TSUBAME group (the job context TSUBAME_GROUP, which the site's qsub stand-in,
  tests/fakes/tsubame_qsub, sets from `qsub -g GROUP`) is a trial run, refused over 10 minutes ("Job is rejected,
  h_rt can not be longer than 10 mins with this group").
A refusal reaches qsub as Grid Engine's "Unable to run job: ..." with the reason given here. (Being server-side,
it does not run for `qsub -w v`, which verifies the job as submitted: -l node_f=2 there asks 2 node_f of one host.)
"""

from __future__ import annotations

import re
import sys

SITE_PE = "site_node_f"
MAX_H_RT_S = 24 * 3600
TRIAL_H_RT_S = 10 * 60


def seconds(value: str) -> int | None:
    """A Grid Engine time (`H:M:S` or seconds) in seconds; None where it is neither."""
    if re.fullmatch(r"\d+", value):
        return int(value)
    if re.fullmatch(r"\d*:\d*:\d*", value):
        hours, minutes, secs = (int(part or 0) for part in value.split(":"))
        return hours * 3600 + minutes * 60 + secs
    return None


def requests(value: str) -> dict[str, str]:
    """`l_hard`'s `name=value,...` list."""
    found = {}
    for item in filter(None, value.split(",")):
        name, _, wanted = item.partition("=")
        found[name] = wanted
    return found


def verify(params: dict[str, str]) -> tuple[str, str, list[str]]:
    """(ACCEPT|CORRECT|REJECT, message, PARAM lines to send first) for one job's parameters."""
    hard = requests(params.get("l_hard", ""))
    if "node_f" not in hard:
        return (
            "REJECT",
            ("no resource type: request whole nodes with -l node_f=N (this TSUBAME stand-in knows node_f only)"),
            [],
        )
    nodes = hard["node_f"]
    if not re.fullmatch(r"[1-9]\d*", nodes):
        return "REJECT", f"-l node_f={nodes}: the number of nodes must be a whole number of 1 or more", []
    if params.get("pe_name"):
        return (
            "REJECT",
            (
                f"-pe {params['pe_name']}: a resource type (node_f) makes the job parallel by itself; "
                "do not name a parallel environment"
            ),
            [],
        )
    if "h_rt" not in hard:
        return "REJECT", "Job is rejected. h_rt must be specified.", []
    limit = seconds(hard["h_rt"])
    if limit is None or limit > MAX_H_RT_S:
        return "REJECT", f"Job is rejected. h_rt {hard['h_rt']} is longer than 24:00:00", []
    if not requests(params.get("ac", "")).get("TSUBAME_GROUP") and limit > TRIAL_H_RT_S:
        return "REJECT", "Job is rejected, h_rt can not be longer than 10 mins with this group", []
    hard["node_f"] = "1"  # a slot's share: one slot a host (the PE's allocation_rule 1), so N hosts in all
    changes = [
        f"PARAM pe_name {SITE_PE}",
        f"PARAM pe_min {nodes}",
        f"PARAM pe_max {nodes}",
        "PARAM l_hard " + ",".join(f"{name}={value}" if value else name for name, value in hard.items()),
    ]
    return "CORRECT", f"node_f={nodes}: {nodes} whole node(s) over {SITE_PE}", changes


def send(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> int:
    params: dict[str, str] = {}
    for raw in sys.stdin:
        words = raw.rstrip("\n").split(" ", 2)
        command = words[0]
        if command == "QUIT":
            return 0
        if command == "START":
            send("STARTED")
        elif command == "PARAM" and len(words) >= 2:
            params[words[1]] = words[2] if len(words) > 2 else ""
        elif command == "ENV":
            pass  # environment variables are not needed here (only sent where the JSV asks for them)
        elif command == "BEGIN":
            state, message, changes = verify(params)
            for change in changes:
                send(change)
            send(f"RESULT STATE {state} {message}")
            params = {}
        elif command:
            send(f'ERROR JSV script got unknown command "{command}"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
