"""The markers tests/conftest.py sets from what a test uses, so that `-m` can select by them (`-m "not cluster and
not e2e"`; the inner loop's `fast` is tests/support/fast.py's) and the parallel schedule can group by them
(tests/support/parallel.py).

* `cluster`: the test uses one of this machine's clusters, the fixtures `slurm_cluster`, `two_node_cluster`,
  `sge_cell`, `tsubame_cell` or `k8s_cluster`, directly or through another fixture (pytest's closure of the
  test's fixtures, `item.fixturenames`, which also holds those a parametrization requests indirectly).
* `emulator`: the test uses the NGC API emulator, the fixture `fake`, directly or through another fixture. The
  same marker with arguments, `@pytest.mark.emulator(api_key=..., variants=...)`, is how a test starts `fake` as
  another variant of the service; such a test already carries it.
* `e2e`: the test is an end-to-end run of a pipeline, i.e. its module is under tests/e2e/ (its path decides,
  nothing else).
"""

from __future__ import annotations

from pathlib import Path

import pytest

CLUSTER_FIXTURES = frozenset({"slurm_cluster", "two_node_cluster", "sge_cell", "tsubame_cell", "k8s_cluster"})
EMULATOR_FIXTURE = "fake"
E2E_FOLDER = Path(__file__).resolve().parents[1] / "e2e"

DESCRIPTIONS = {
    "cluster": "set by tests/conftest.py on every test that uses a cluster of this machine: the fixtures "
    "slurm_cluster, two_node_cluster, sge_cell, tsubame_cell or k8s_cluster, directly or through another "
    "fixture (item.fixturenames); run these only one checkout at a time (docs/testing.md)",
    "emulator": "emulator(api_key=None, variants=None): set by tests/conftest.py on every test that uses the NGC "
    "API emulator fixture `fake`, directly or through another fixture; with arguments, start `fake` as "
    "another variant of the service (tests/fakes/README.md)",
    "e2e": "set by tests/conftest.py on every test whose module is under tests/e2e/ (an end-to-end run of a "
    "pipeline on a backend), and on no other",
}


def register(config: pytest.Config) -> None:
    for name, description in DESCRIPTIONS.items():
        text = description if description.startswith(name + "(") else f"{name}: {description}"
        config.addinivalue_line("markers", text)


def uses_a_cluster(item: pytest.Item) -> bool:
    return bool(CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())))


def mark(items: list[pytest.Item]) -> None:
    """Add `cluster`, `emulator` and `e2e` to the items they apply to (see the module's docstring)."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if CLUSTER_FIXTURES & fixtures:
            item.add_marker("cluster")
        # A test with `emulator(...)` already carries the marker; a bare one added beside it could shadow its
        # arguments where they come from the module or class (the `fake` fixture reads the closest one).
        if EMULATOR_FIXTURE in fixtures and item.get_closest_marker("emulator") is None:
            item.add_marker("emulator")
        if E2E_FOLDER in Path(str(item.path)).resolve().parents:
            item.add_marker("e2e")
