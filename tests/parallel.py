"""How the suite runs in parallel (pytest-xdist, `-n auto --dist loadgroup` in pyproject.toml).

Most tests wait (on an emulated BCP, a scheduler's interval, a subprocess), so on this project's 2-core machine
three workers finish the suite in far less time than one. What decides who runs where:

* A test that uses a cluster of this machine (Slurm, Grid Engine: their daemons, ports, Debian packages installed
  on first use) runs in the one group `clusters`, so those clusters start one at a time and never install packages
  at once. Kubernetes tests are the group `kubernetes`: their control plane is the last thing `.ci/run` has built
  (in the background while the rest runs), so they come last.
* Every other test runs in the group of its module, so a module's expensive module-scoped fixtures (a trained
  reference run, a browser) are made once, on one worker.
* Groups are handed out in the order below (`--no-loadscope-reorder`): `clusters` first, being the longest;
  `kubernetes` last.
"""

from __future__ import annotations

import os

import pytest

# Fixtures that stand for a cluster of the whole machine -> the xdist group of every test that uses one.
CLUSTER_GROUPS = {"slurm_cluster": "clusters", "two_node_cluster": "clusters", "sge_cell": "clusters",
                  "k8s_cluster": "kubernetes"}
ORDER = {"clusters": 0, "kubernetes": 2}  # everything else: 1


def group_of(item: pytest.Item) -> str:
    for fixture in getattr(item, "fixturenames", ()):
        if fixture in CLUSTER_GROUPS:
            return CLUSTER_GROUPS[fixture]
    return item.module.__name__ if getattr(item, "module", None) else item.nodeid.split("::")[0]


def assign_groups(items: list[pytest.Item]) -> None:
    """Mark each test with its xdist group, and order the tests so that the groups are handed out as above."""
    groups = {}
    for item in items:
        groups[item.nodeid] = group_of(item)
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    items.sort(key=lambda item: ORDER.get(groups[item.nodeid], 1))  # stable: collection order within a rank


def workers(cpus: int | None = None) -> int:
    """`-n auto`: one worker more than this process may use CPUs (the tests mostly wait), at least 2;
    PYTEST_XDIST_AUTO_NUM_WORKERS overrides."""
    if (forced := os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").strip()).isdigit():
        return int(forced)
    cpus = cpus or len(os.sched_getaffinity(0))
    return max(2, cpus + 1)
