"""Shared test set-up: the stage programs are importable as top-level modules, as they are inside jobs."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGES = REPO / "stages"
if str(STAGES) not in sys.path:
    sys.path.insert(0, str(STAGES))
# The shared helpers are the package tests/support/ (`from support.x import ...`): tests/ itself is on sys.path (pytest
# puts a rootdir conftest's folder there; said here too, for any import mode). No test module imports another.
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(1, str(TESTS))

# The emulated BCP's fixtures (`fake`, once per transport), for every test module.
from support import (  # noqa: E402
    fast,  # noqa: E402  (the inner loop, `-m fast`: the tests it lists)
    markers,  # noqa: E402  (cluster, emulator, e2e: set from the fixtures a test uses, or its folder)
    parallel,  # noqa: E402  (which tests share a worker, in what order)
)
from support.bcp_emulation import fake, ngc_tls_dir, transports_for  # noqa: E402,F401
from support.offline import offline  # noqa: E402,F401  (autouse: no test reaches the internet)
from support.own_state import own_state  # noqa: E402,F401  (autouse: its own $XDG_STATE_HOME, never the user's)
from support.tmpfs_mount import tmpfs  # noqa: E402,F401  (a small real file system, root only)

pytest_plugins = ("support.cpu_report",)  # BCP_TEST_CPU_REPORT=N: where the suite's CPU goes (.ci/run sets it)


def pytest_configure(config):
    markers.register(config)
    config.addinivalue_line(
        "markers",
        "both_transports: run this `fake` test on the ngc CLI and on ngcsdk "
        "(tests/support/bcp_emulation.py: else on one)",
    )
    config.addinivalue_line("markers", fast.DESCRIPTION)
    parallel.configure(config)


def pytest_unconfigure(config):
    parallel.unconfigure(config)


def pytest_generate_tests(metafunc):
    if "fake" in metafunc.fixturenames and (transports := transports_for(metafunc)) is not None:
        metafunc.parametrize("fake", transports, indirect=True)


def pytest_collection_modifyitems(config, items):
    markers.mark(items)  # first: the groups below come from the markers
    fast.mark(items)
    parallel.order_items(items)
    parallel.write_groups(config, items)


def pytest_xdist_make_scheduler(config, log):
    return parallel.GroupScheduling(config, log)


def pytest_xdist_auto_num_workers(config):
    return parallel.workers()
