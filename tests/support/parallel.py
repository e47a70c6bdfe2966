"""How the suite runs in parallel (pytest-xdist: `-n auto`, and the scheduler below).

Most tests wait (on an emulated BCP, a scheduler's interval, a subprocess), so on this project's 2-core machine
three workers finish the suite in far less time than one. Tests are handed out a group at a time; a group runs on
one worker, in collection order:

* `clusters`: every test module that uses a cluster of this machine (the fixtures `slurm_cluster`,
  `two_node_cluster`, `sge_cell`): their daemons, ports and Debian packages (installed on first use) are the
  machine's, so those modules run one after another and never install packages at once. Handed out first, being
  the longest group.
* `kubernetes`: the modules that use `k8s_cluster`. Handed out last: their control plane is the last thing
  `.ci/run` has built (in the background, while the rest runs).
* every other module is a group of its own, so its module-scoped fixtures (a trained reference run, a browser)
  are made once, on one worker.

Groups are decided by module, from the module's source (`module_group`), because the xdist controller, which
hands them out, sees test ids only; the workers order their collection by the same function.
(pytest-xdist's own `--dist loadgroup` marks do not work with pytest 9, whose test ids no longer come from the
attribute xdist rewrites.)
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_FIXTURES = re.compile(r"\b(slurm_cluster|two_node_cluster|sge_cell)\b")
K8S_FIXTURE = re.compile(r"\bk8s_cluster\b")
ORDER = {"clusters": 0, "kubernetes": 2}  # every other group: 1


@functools.lru_cache(maxsize=None)
def module_group(module_path: str) -> str:
    """The group of a test module (its path relative to the repository, as test ids begin)."""
    try:
        source = (ROOT / module_path).read_text(errors="replace")
    except OSError:
        return module_path
    if K8S_FIXTURE.search(source):
        return "kubernetes"
    if CLUSTER_FIXTURES.search(source):
        return "clusters"
    return module_path


def group_of_id(nodeid: str) -> str:
    return module_group(nodeid.split("::", 1)[0])


def order_items(items: list) -> None:
    """The workers' collection order, which the controller hands groups out in: `clusters` first, `kubernetes`
    last, the rest as collected (a stable sort)."""
    items.sort(key=lambda item: ORDER.get(group_of_id(item.nodeid), 1))


class GroupScheduling(LoadScopeScheduling):
    """LoadScope scheduling with `module_group` as the scope: a group goes to one worker, whole."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of_id(nodeid)


def workers(cpus: int | None = None) -> int:
    """`-n auto`: one worker more than this process may use CPUs (the tests mostly wait), at least 2;
    PYTEST_XDIST_AUTO_NUM_WORKERS overrides."""
    if (forced := os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").strip()).isdigit():
        return int(forced)
    cpus = cpus or len(os.sched_getaffinity(0))
    return max(2, cpus + 1)
