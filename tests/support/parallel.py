"""How the suite runs in parallel (pytest-xdist: `-n auto`, and the scheduler below).

Most tests wait (on an emulated BCP, a scheduler's interval, a subprocess), so on this project's 2-core machine
three workers finish the suite in far less time than one. Tests are handed out a group at a time; a group runs on
one worker, in collection order:

* `clusters`: every test marked `cluster` (tests/support/markers.py: it uses `slurm_cluster`, `two_node_cluster`,
  `sge_cell` or `tsubame_cell`) but not `k8s_cluster`: the clusters' daemons, ports and Debian packages (installed
  on first use) are the machine's, so those tests run one after another on one worker and never install packages
  at once. Handed out first, being the longest group.
* `kubernetes`: the tests marked `cluster` that use `k8s_cluster`. Handed out second, so that a worker of its own
  starts on them at once: the group takes about 14 minutes of mostly waiting, and handed out last it ran alone at
  the end of CI's run on two idle cores (2026-12-06). Where `.ci/run`'s build of their control plane has not
  ended yet, that worker waits for it (tests/support/k8s_cluster.py) while the others go on.
* every other test is in the group of its module, so a module's module-scoped fixtures (a trained reference run, a
  browser) are made once, on one worker.

A test's group comes from its markers (`group_of`), which only the workers know: the xdist controller, which hands
the groups out, sees test ids only. So each worker writes {test id: group} for its collection to a file of its own
(`write_groups`), in a folder the controller made in pytest_configure (`configure`) and named to the workers in the
environment variable GROUPS_ENV (they inherit the controller's environment); the controller's scheduler reads the
groups from there (`GroupScheduling._split_scope`): it schedules only once every worker has finished collecting,
and a worker writes its file before it reports its collection. The folder goes at the end of the session
(`unconfigure`). With `-n 0` there is no controller, no folder and no file; the order is the same.
(pytest-xdist's own `--dist loadgroup` marks do not work with pytest 9, whose test ids no longer come from the
attribute xdist rewrites.)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

GROUPS_ENV = "BCPP_TEST_GROUPS_DIR"
ORDER = {"clusters": 0, "kubernetes": 1}
OTHERS_ORDER = 2  # every other group
K8S_FIXTURE = "k8s_cluster"


def group_of(item: pytest.Item) -> str:
    """The group of a collected test, from its `cluster` marker and fixtures (see the module's docstring)."""
    if item.get_closest_marker("cluster") is not None:
        return "kubernetes" if K8S_FIXTURE in getattr(item, "fixturenames", ()) else "clusters"
    return module_of(item.nodeid)


def module_of(nodeid: str) -> str:
    """The module part of a test id (its path relative to the root, as test ids begin)."""
    return nodeid.split("::", 1)[0]


def order_items(items: list) -> None:
    """The workers' collection order, which the controller hands groups out in: `clusters` first, `kubernetes`
    second, the rest as collected (a stable sort)."""
    items.sort(key=lambda item: ORDER.get(group_of(item), OTHERS_ORDER))


def is_controller(config: pytest.Config) -> bool:
    """This process hands tests out to xdist workers (not a worker; not a run without xdist, `-n 0`)."""
    if hasattr(config, "workerinput"):
        return False
    try:
        return bool(config.getoption("numprocesses")) and config.getoption("dist") != "no"
    except ValueError:  # xdist not loaded (-p no:xdist)
        return False


def configure(config: pytest.Config) -> None:
    """On the controller: the folder the workers write their groups to, named in their environment."""
    if is_controller(config):
        folder = tempfile.mkdtemp(prefix="bcpp-test-groups-")
        config.stash[_FOLDER] = folder
        os.environ[GROUPS_ENV] = folder


def unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get(GROUPS_ENV) == folder:
            del os.environ[GROUPS_ENV]


def write_groups(config: pytest.Config, items: list) -> None:
    """On a worker: {test id: group} of its collection, into the controller's folder (atomically: written to a
    temporary name in that folder, then renamed)."""
    worker = getattr(config, "workerinput", {}).get("workerid")
    folder = os.environ.get(GROUPS_ENV)
    if worker is None or not folder:
        return
    groups = {item.nodeid: group_of(item) for item in items}
    final = Path(folder) / f"{worker}.json"
    temporary = final.with_name(f".{worker}.json.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(groups))
    os.replace(temporary, final)


def read_groups(folder: str | os.PathLike) -> dict[str, str]:
    """Every worker's {test id: group}, merged (the workers collect the same tests)."""
    groups: dict[str, str] = {}
    for path in sorted(Path(folder).glob("*.json")):
        groups.update(json.loads(path.read_text()))
    return groups


_FOLDER = pytest.StashKey[str]()


class GroupScheduling(LoadScopeScheduling):
    """LoadScope scheduling with `group_of` as the scope: a group goes to one worker, whole."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        super().__init__(config, log)
        self._folder = config.stash.get(_FOLDER, None) or os.environ.get(GROUPS_ENV)
        self._groups: dict[str, str] = {}

    def _split_scope(self, nodeid: str) -> str:
        if nodeid not in self._groups and self._folder:
            self._groups = read_groups(self._folder)
        if nodeid not in self._groups:
            # Cannot happen while the workers write their groups before they report their collection; a test
            # with no group would run beside the clusters' tests, so say so rather than guess quietly.
            raise RuntimeError(
                f"no group for {nodeid}: no worker wrote one to {self._folder} (tests/support/parallel.py)"
            )
        return self._groups[nodeid]


def workers(cpus: int | None = None) -> int:
    """`-n auto`: one worker more than this process may use CPUs (the tests mostly wait), at least 2;
    PYTEST_XDIST_AUTO_NUM_WORKERS overrides."""
    if (forced := os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").strip()).isdigit():
        return int(forced)
    cpus = cpus or len(os.sched_getaffinity(0))
    return max(2, cpus + 1)
