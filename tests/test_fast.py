"""The fast loop's list (tests/support/fast.py): every entry names a test that exists, outside the cluster and
end-to-end tests, and `fast` is set on exactly the tests it names. That the loop imports every module of
bcp_pipeline/ is scripts/fast-coverage's check (it runs the loop)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support import fast

REPO = Path(__file__).resolve().parents[1]


def defined_names(module: Path) -> set[str]:
    """`name` and `Class::name` of every test function and class a module defines."""
    names = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(f"{node.name}::{inner.name}" for inner in node.body if isinstance(inner, ast.FunctionDef))
    return names


def test_every_entry_names_a_test_that_exists_once() -> None:
    assert len(set(fast.FAST)) == len(fast.FAST)
    for entry in fast.FAST:
        path, _, name = entry.partition("::")
        assert (REPO / path).is_file(), entry
        assert Path(path).name.startswith("test_"), entry
        if name:
            assert name in defined_names(REPO / path), entry


def test_no_entry_is_a_cluster_or_end_to_end_test() -> None:
    """Those take minutes each (docs/testing.md); the cluster fixtures are checked on the collected items below."""
    assert [entry for entry in fast.FAST if entry.startswith("tests/e2e/")] == []


def test_fast_is_set_on_the_entries_and_what_is_inside_them_only() -> None:
    assert fast.is_fast("tests/config/test_config.py::test_anything")
    assert fast.is_fast("tests/engine/test_orchestrator_local.py::test_chain_runs_in_order_and_verifies")
    assert fast.is_fast(
        "tests/backends/bcp/test_transport.py::"
        "test_preempt_through_either_transport_and_a_refusal_keeps_its_http_status[cli]"
    )
    assert not fast.is_fast("tests/engine/test_orchestrator_local.py::test_rank_environment_matches_bcprun")
    assert not fast.is_fast("tests/config/test_config.py_other::test_x")  # a path is matched whole
    assert not fast.is_fast("tests/e2e/test_slurm_e2e.py::test_x")


def test_no_collected_fast_test_uses_a_cluster(request: pytest.FixtureRequest) -> None:
    """Of this session's collection (the whole suite in a plain run, the fast tests in `-m fast`)."""
    clustered = [
        item.nodeid
        for item in request.session.items
        if item.get_closest_marker("fast") and item.get_closest_marker("cluster")
    ]
    assert clustered == []


def test_the_package_modules_are_listed_by_their_dotted_names() -> None:
    modules = fast.package_modules()
    assert {
        "bcp_pipeline",
        "bcp_pipeline.__main__",
        "bcp_pipeline.backends.bcp.render",
        "bcp_pipeline.backends.local.supervisor",
    } <= set(modules)
    assert not [name for name in modules if name.endswith("__init__")]
    assert len(modules) == len(list((REPO / "bcp_pipeline").rglob("*.py")))
