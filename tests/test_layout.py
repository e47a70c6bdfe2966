"""The test tree's own rules (docs/testing.md, "Layout"): the markers tests/conftest.py sets from what a test uses
(tests/support/markers.py) and the parallel groups they give (tests/support/parallel.py), on known tests; shared
code lives in tests/support/, so no test module imports another."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import parallel

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# A plugin for a collection in a subprocess: every collected test's markers and group, as JSON.
DUMP_PLUGIN = """
import json, os

def pytest_collection_finish(session):
    from support import parallel
    with open(os.environ["MARKER_DUMP"], "w") as out:
        json.dump({item.nodeid: {"markers": sorted({m.name for m in item.iter_markers()}),
                                 "group": parallel.group_of(item)} for item in session.items}, out)
"""
MODULES = [
    "tests/e2e/test_slurm_e2e.py",
    "tests/e2e/test_backend_conformance.py",
    "tests/e2e/test_bcp_emulated.py",
    "tests/e2e/test_kubernetes_e2e.py",
    "tests/e2e/test_pretrain_backends.py",
    "tests/backends/slurm/test_check.py",
    "tests/stages/test_data_list.py",
]
CONFORMANCE = "tests/e2e/test_backend_conformance.py"
KILLED = "test_sigkilled_orchestrator_resumes_without_duplicate_jobs"


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """{test id: {"markers": [...], "group": ...}} of MODULES, as a real collection (`-n 0`) marks them."""
    folder = tmp_path_factory.mktemp("marker-dump")
    (folder / "marker_dump.py").write_text(DUMP_PLUGIN)
    dump = folder / "collected.json"
    env = {k: v for k, v in os.environ.items() if k != parallel.GROUPS_ENV}
    env.update(MARKER_DUMP=str(dump), PYTHONPATH=os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")])))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "marker_dump",
            "-n",
            "0",
            "--collect-only",
            "-q",
            *MODULES,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(dump.read_text())


def marks(collected: dict, nodeid: str) -> set[str]:
    return set(collected[nodeid]["markers"]) & {"cluster", "emulator", "e2e"}


def test_markers_come_from_the_fixtures_a_test_uses_and_e2e_from_its_folder(collected) -> None:
    # A Slurm end-to-end test: on the machine's cluster, under tests/e2e/.
    assert marks(
        collected, "tests/e2e/test_slurm_e2e.py::test_scancel_of_a_stage_job_is_reported_cancelled_and_rerun_continues"
    ) == {"cluster", "e2e"}
    # The cluster through a module's `pytestmark = usefixtures(...)`, outside tests/e2e/.
    assert marks(collected, "tests/backends/slurm/test_check.py::test_slurm_check_on_the_real_cluster") == {"cluster"}
    # `fake` on one transport (the engine above it is the same) or on both (the transport is what is tested).
    assert marks(
        collected, "tests/e2e/test_bcp_emulated.py::test_failed_job_then_rerun_continues_from_that_stage[sdk]"
    ) == {"emulator", "e2e"}
    assert marks(collected, "tests/e2e/test_bcp_emulated.py::test_cancel_kills_the_active_job[cli]") == {
        "emulator",
        "e2e",
    }
    # A module of both: only the tests that use the two-node cluster are cluster tests.
    assert marks(collected, "tests/e2e/test_pretrain_backends.py::test_local_two_processes_train_as_one") == {"e2e"}
    assert marks(collected, "tests/e2e/test_pretrain_backends.py::test_slurm_two_nodes_train_as_one") == {
        "cluster",
        "e2e",
    }
    # A pure unit test: none.
    assert (
        marks(collected, "tests/stages/test_data_list.py::test_74_chunks_weights_proportional_and_summing_to_one")
        == set()
    )
    # The conformance scenario: each backend's class brings its fixtures, and so its markers.
    assert marks(collected, f"{CONFORMANCE}::TestLocal::{KILLED}") == {"e2e"}
    assert marks(collected, f"{CONFORMANCE}::TestBcp::{KILLED}[cli]") == {"emulator", "e2e"}
    for backend in ("Slurm", "GridEngine", "Kubernetes"):
        assert marks(collected, f"{CONFORMANCE}::Test{backend}::{KILLED}") == {"cluster", "e2e"}, backend


def test_a_test_with_emulator_arguments_keeps_them(collected) -> None:
    """`@pytest.mark.emulator(variants=...)` starts `fake` as another variant: no bare marker is added beside it."""
    nodeid = (
        "tests/e2e/test_bcp_emulated.py::test_chain_when_the_commandline_runs_once_and_one_replica_jobs_have_no"
        "_bcprun[sdk]"
    )
    assert collected[nodeid]["markers"].count("emulator") == 1


def test_the_groups_follow_the_markers(collected) -> None:
    groups = {nodeid: entry["group"] for nodeid, entry in collected.items()}
    for nodeid, entry in collected.items():
        if "cluster" not in entry["markers"]:
            assert groups[nodeid] == nodeid.split("::", 1)[0], nodeid  # its module's group
    assert (
        groups[f"{CONFORMANCE}::TestSlurm::{KILLED}"]
        == groups[f"{CONFORMANCE}::TestGridEngine::{KILLED}"]
        == groups["tests/backends/slurm/test_check.py::test_slurm_check_on_the_real_cluster"]
        == "clusters"
    )
    assert groups[f"{CONFORMANCE}::TestKubernetes::{KILLED}"] == "kubernetes"
    assert {groups[n] for n in groups if n.startswith("tests/e2e/test_kubernetes_e2e.py::")} == {"kubernetes"}


def test_the_markers_are_registered(request: pytest.FixtureRequest) -> None:
    registered = {line.split(":")[0].split("(")[0] for line in request.config.getini("markers")}
    assert {"cluster", "emulator", "e2e", "both_transports"} <= registered


def test_no_test_module_imports_another() -> None:
    """What tests share lives in tests/support/ (conftest.py no longer puts every test folder on sys.path; the
    folders being packages, a module could be imported by its dotted name, `from e2e.test_x import ...`, too)."""
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted(TESTS.rglob("*.py"))
        if "fakes" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.match(r"\s*(from\s+([\w.]+\.)?test_\w+\s+import|import\s+([\w.]+\.)?test_\w+\b)", line)
    ]
    assert found == []
