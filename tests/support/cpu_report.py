"""`BCP_TEST_CPU_REPORT=N`: after the run, the N tests that used the most CPU, beside their wall time, and the
run's total. .ci/run sets it, so that CI's log says where the suite's time goes (on a loaded 2-core machine the wall
times mislead: a test that waits looks as slow as one that computes).

A test's CPU is its process's own and that of the children it reaped (a program run with subprocess.run, and
what that program reaped in turn); a daemon a fixture leaves running (a cluster, an emulator, a fork server) is not
counted. Each process (xdist worker, or the one process of `-n 0`) appends a JSON line a test to a file of its own in
a folder the first process made and named in the environment, which workers inherit; the process that prints the
summary reads them all.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import pytest

COUNT_ENV = "BCP_TEST_CPU_REPORT"
FOLDER_ENV = "BCPP_TEST_CPU_DIR"


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def wanted() -> int:
    text = os.environ.get(COUNT_ENV, "").strip()
    return int(text) if text.isdigit() else 0


def pytest_configure(config: pytest.Config) -> None:
    if wanted() and FOLDER_ENV not in os.environ:  # the first process: the controller, or the only one
        os.environ[FOLDER_ENV] = tempfile.mkdtemp(prefix="bcpp-test-cpu-")
        config.stash[_OWNER] = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if not wanted() or FOLDER_ENV not in os.environ:
        yield
        return
    wall, cpu = time.monotonic(), cpu_seconds()
    yield
    line = json.dumps([item.nodeid, time.monotonic() - wall, cpu_seconds() - cpu])
    name = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(os.environ[FOLDER_ENV]) / f"{name}.jsonl", "a", encoding="utf-8") as out:
        out.write(line + "\n")


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if not config.stash.get(_OWNER, False):
        return
    folder = Path(os.environ[FOLDER_ENV])
    rows = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]
    shutil.rmtree(folder, ignore_errors=True)
    rows.sort(key=lambda row: -row[2])
    total = sum(row[2] for row in rows)
    terminalreporter.section(f"the {wanted()} tests that used the most CPU ({COUNT_ENV})")
    for nodeid, wall, cpu in rows[: wanted()]:
        terminalreporter.write_line(f"{cpu:8.1f} s CPU {wall:8.1f} s wall  {nodeid}")
    modules: dict[str, list[float]] = {}
    for nodeid, wall, cpu in rows:
        spent = modules.setdefault(nodeid.split("::", 1)[0], [0.0, 0.0])
        spent[0], spent[1] = spent[0] + wall, spent[1] + cpu
    terminalreporter.write_line("by module:")
    for module, (wall, cpu) in sorted(modules.items(), key=lambda item: -item[1][1])[: wanted()]:
        terminalreporter.write_line(f"{cpu:8.1f} s CPU {wall:8.1f} s wall  {module}")
    terminalreporter.write_line(f"{total:8.1f} s CPU in all, over {len(rows)} tests")


_OWNER = pytest.StashKey[bool]()
