"""The suite's parallel schedule (tests/support/parallel.py): the cluster modules share one worker, Kubernetes comes last."""

from __future__ import annotations

from support import parallel


def test_modules_that_use_a_machine_wide_cluster_share_one_group_and_the_rest_are_their_own() -> None:
    assert {parallel.module_group(m) for m in ("tests/e2e/test_slurm_e2e.py", "tests/e2e/test_gridengine_e2e.py",
                                               "tests/check/test_check_slurm.py",
                                               "tests/e2e/test_pretrain_backends.py")} == {"clusters"}
    assert parallel.module_group("tests/e2e/test_kubernetes_e2e.py") == "kubernetes"
    assert parallel.module_group("tests/e2e/test_bcp_emulated.py") == "tests/e2e/test_bcp_emulated.py"
    assert parallel.group_of_id("tests/test_parallel.py::test_x[a-b]") == "tests/test_parallel.py"


def test_the_clusters_come_first_and_kubernetes_last_else_collection_order() -> None:
    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

    ids = ["tests/e2e/test_kubernetes_e2e.py::a", "tests/engine/test_state.py::b", "tests/e2e/test_slurm_e2e.py::c",
           "tests/cli/test_cli_edges.py::d", "tests/e2e/test_gridengine_e2e.py::e"]
    items = [Item(i) for i in ids]
    parallel.order_items(items)
    assert [i.nodeid for i in items] == [ids[2], ids[4], ids[1], ids[3], ids[0]]


def test_auto_workers_are_one_more_than_the_cpus() -> None:
    assert parallel.workers(2) == 3 and parallel.workers(1) == 2 and parallel.workers(8) == 9
