"""The suite's parallel schedule (tests/support/parallel.py): groups from the markers, written by the workers and
read by the controller's scheduler; the cluster tests share one worker, Kubernetes comes second."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from support import parallel

TESTS = Path(__file__).resolve().parent


class Item:
    """What the grouping reads of a collected test: its id, its fixtures' closure and its markers."""

    def __init__(self, nodeid: str, fixtures: tuple[str, ...] = (), marks: tuple[str, ...] = ()) -> None:
        self.nodeid, self.fixturenames, self.marks = nodeid, list(fixtures), marks

    def get_closest_marker(self, name: str):
        return getattr(pytest.mark, name).mark if name in self.marks else None


def test_cluster_tests_share_one_group_kubernetes_its_own_and_the_rest_are_grouped_by_module() -> None:
    slurm = Item("tests/e2e/test_slurm_e2e.py::test_a", ("tmp_path", "slurm_cluster"), ("cluster", "e2e"))
    sge = Item("tests/e2e/test_gridengine_e2e.py::test_b", ("sge_cell",), ("cluster", "e2e"))
    two_nodes = Item("tests/e2e/test_pretrain_backends.py::test_slurm[x]", ("two_node_cluster",), ("cluster",))
    k8s = Item("tests/e2e/test_kubernetes_e2e.py::test_c", ("workspace", "k8s_cluster"), ("cluster", "e2e"))
    local = Item("tests/e2e/test_pretrain_backends.py::test_local", ("data_dir",), ("e2e",))
    emulated = Item("tests/e2e/test_bcp_emulated.py::test_d[sdk]", ("fake",), ("emulator", "e2e"))
    assert {parallel.group_of(i) for i in (slurm, sge, two_nodes)} == {"clusters"}
    assert parallel.group_of(k8s) == "kubernetes"
    # The module's other tests stay in the module's group; the marker decides, not the module's source.
    assert parallel.group_of(local) == "tests/e2e/test_pretrain_backends.py"
    assert parallel.group_of(emulated) == "tests/e2e/test_bcp_emulated.py"


def test_the_clusters_come_first_and_kubernetes_second_else_collection_order() -> None:
    items = [
        Item("tests/e2e/test_kubernetes_e2e.py::a", ("k8s_cluster",), ("cluster",)),
        Item("tests/engine/test_state.py::b"),
        Item("tests/e2e/test_slurm_e2e.py::c", ("slurm_cluster",), ("cluster",)),
        Item("tests/cli/test_cli_edges.py::d"),
        Item("tests/e2e/test_gridengine_e2e.py::e", ("sge_cell",), ("cluster",)),
    ]
    ids = [i.nodeid for i in items]
    parallel.order_items(items)
    assert [i.nodeid for i in items] == [ids[2], ids[4], ids[0], ids[1], ids[3]]


class Config:
    """A pytest config as `write_groups` reads it: a worker's has `workerinput`."""

    def __init__(self, worker: str | None) -> None:
        if worker is not None:
            self.workerinput = {"workerid": worker}


def test_each_worker_writes_its_groups_and_the_scheduler_reads_them(tmp_path, monkeypatch) -> None:
    items = [
        Item("tests/e2e/test_slurm_e2e.py::c", ("slurm_cluster",), ("cluster",)),
        Item("tests/cli/test_cli_edges.py::d[1]"),
    ]
    monkeypatch.setenv(parallel.GROUPS_ENV, str(tmp_path))
    for worker in ("gw0", "gw1"):
        parallel.write_groups(Config(worker), items)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gw0.json", "gw1.json"]  # no temporary left
    assert json.loads((tmp_path / "gw1.json").read_text()) == {
        "tests/e2e/test_slurm_e2e.py::c": "clusters",
        "tests/cli/test_cli_edges.py::d[1]": "tests/cli/test_cli_edges.py",
    }
    scheduler = parallel.GroupScheduling.__new__(parallel.GroupScheduling)  # only what _split_scope reads
    scheduler._folder, scheduler._groups = str(tmp_path), {}
    assert scheduler._split_scope("tests/e2e/test_slurm_e2e.py::c") == "clusters"
    assert scheduler._split_scope("tests/cli/test_cli_edges.py::d[1]") == "tests/cli/test_cli_edges.py"
    with pytest.raises(RuntimeError, match="no group for tests/x.py::y"):
        scheduler._split_scope("tests/x.py::y")


def test_without_xdist_nothing_is_written(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(parallel.GROUPS_ENV, str(tmp_path))
    parallel.write_groups(Config(None), [Item("tests/cli/test_cli_edges.py::d")])  # -n 0: not a worker
    monkeypatch.delenv(parallel.GROUPS_ENV)
    parallel.write_groups(Config("gw0"), [Item("tests/cli/test_cli_edges.py::d")])  # no controller's folder
    assert list(tmp_path.iterdir()) == []


# A suite of its own, run by a real pytest-xdist with this conftest's hooks (tests/support/): cluster tests in three
# modules, one of them Kubernetes, and tests of their own in each module.
SUITE_CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import pytest
from support import markers, parallel

@pytest.fixture(scope="session")
def slurm_cluster(): return "slurm"

@pytest.fixture(scope="session")
def k8s_cluster(): return "k8s"

@pytest.fixture
def through_another(slurm_cluster): return slurm_cluster

def pytest_configure(config):
    markers.register(config)
    parallel.configure(config)

def pytest_unconfigure(config):
    parallel.unconfigure(config)

def pytest_collection_modifyitems(config, items):
    markers.mark(items)
    parallel.order_items(items)
    parallel.write_groups(config, items)

def pytest_xdist_make_scheduler(config, log):
    return parallel.GroupScheduling(config, log)
"""
RECORD = """
import json, os, time

def record(name):
    time.sleep(0.2)  # long enough for both workers to take groups
    with open(os.environ["RECORD"], "a") as out:
        out.write(json.dumps([name, os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("{env}")]) + "\\n")
""".replace("{env}", parallel.GROUPS_ENV)
SUITE_TEST = (
    RECORD
    + """
def test_own_1(): record(__name__ + ".own_1")
def test_own_2(): record(__name__ + ".own_2")
def test_cluster(slurm_cluster): record(__name__ + ".cluster")
def test_cluster_through_a_fixture(through_another): record(__name__ + ".through")
"""
)
K8S_TEST = (
    RECORD
    + """
def test_k8s(k8s_cluster): record("k8s")
"""
)


def test_a_real_xdist_run_gives_each_group_to_one_worker_and_removes_the_folder(tmp_path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(SUITE_CONFTEST)
    for name in ("test_one", "test_two", "test_three"):
        (suite / f"{name}.py").write_text(SUITE_TEST)
    (suite / "test_k8s.py").write_text(K8S_TEST)
    record = tmp_path / "record.jsonl"
    env = {k: v for k, v in os.environ.items() if k != parallel.GROUPS_ENV}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--no-loadscope-reorder",
            "-q",
            "--rootdir",
            str(suite),
            "-c",
            os.devnull,
            str(suite),
        ],
        cwd=suite,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "RECORD": str(record)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [json.loads(line) for line in record.read_text().splitlines()]
    worker = {name: w for name, w, _ in runs}
    assert len(runs) == 13 and len(set(worker.values())) == 2, runs
    cluster = [name for name in worker if name.endswith((".cluster", ".through"))]
    assert len(cluster) == 6 and len({worker[name] for name in cluster}) == 1  # all on one worker
    for module in ("test_one", "test_two", "test_three"):
        assert worker[f"{module}.own_1"] == worker[f"{module}.own_2"]
    # Each worker ran its groups in order: the clusters first on one, Kubernetes first on the other.
    order = [name for name, w, _ in runs if w == worker["k8s"]]
    assert order[0] == "k8s" and worker["k8s"] != worker[cluster[0]], order
    assert set([name for name, w, _ in runs if w == worker[cluster[0]]][:6]) == set(cluster)
    folders = {folder for _, _, folder in runs}
    assert len(folders) == 1 and None not in folders and not Path(folders.pop()).exists()  # cleaned up


def test_auto_workers_are_one_more_than_the_cpus() -> None:
    assert parallel.workers(2) == 3 and parallel.workers(1) == 2 and parallel.workers(8) == 9


HANGING_TEST = (
    RECORD
    + """
import time

def test_hangs(): time.sleep(60)
def test_after_it(): record(__name__ + ".after")
def test_hangs_on_the_cluster(slurm_cluster): time.sleep(60)
def test_after_it_on_the_cluster(slurm_cluster): record(__name__ + ".cluster_after")
"""
)


def test_a_test_over_its_timeout_fails_and_its_worker_goes_on_with_its_group(tmp_path) -> None:
    """pytest-timeout as pyproject.toml sets it (its method, fixtures excluded), with a 1 s limit: the hung tests
    fail by name, and the tests after them in their groups run on the same workers (no worker is lost, and
    the suite's scheduler keeps its groups)."""
    settings = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(SUITE_CONFTEST)
    (suite / "test_hanging.py").write_text(HANGING_TEST)
    (suite / "test_one.py").write_text(SUITE_TEST)
    record = tmp_path / "record.jsonl"
    env = {k: v for k, v in os.environ.items() if k != parallel.GROUPS_ENV}
    options = [
        "-o",
        "timeout=1",
        "-o",
        f"timeout_method={settings['timeout_method']}",
        "-o",
        f"timeout_func_only={str(settings['timeout_func_only']).lower()}",
    ]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            *options,
            "-rf",
            "--no-loadscope-reorder",
            "-q",
            "--rootdir",
            str(suite),
            "-c",
            os.devnull,
            str(suite),
        ],
        cwd=suite,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "RECORD": str(record)},
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "2 failed, 6 passed" in out, out
    assert "FAILED test_hanging.py::test_hangs - Failed: Timeout" in out, out
    assert "FAILED test_hanging.py::test_hangs_on_the_cluster - Failed: Timeout" in out, out
    assert "crashed" not in out and "replacing" not in out, out
    worker = {name: w for name, w, _ in (json.loads(line) for line in record.read_text().splitlines())}
    assert worker["test_hanging.cluster_after"] == worker["test_one.cluster"] == worker["test_one.through"]
    assert {"test_hanging.after", "test_one.own_1", "test_one.own_2"} <= set(worker)
