"""Fixtures for tests on the emulated BCP: NVIDIA's client (ngc CLI code, or ngcsdk in-process) against the NGC API
EMULATOR on loopback (tests/fakes/ngc_api.py, a fake, named so).

Which transports a `fake` test runs on (`transports_for`): both where the transport is what is tested (tests marked
`@pytest.mark.both_transports`, a module's `pytestmark` included: the BCP backend's transports, retries and telemetry,
the emulator itself, the demo end to end, submit/kill/resume by label, logs, transient API errors, credentials and
org); else one, `SINGLE_TRANSPORT`, since the engine above the
transport is the same code whichever it is. `BCP_TEST_TRANSPORTS=cli,sdk` runs every `fake` test on both."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from support import ngc_parser
from support.golden_files import REPO
from support.reaper import shutdown_emulator_when_gone

sys.path.insert(0, str(REPO / "tests" / "fakes"))
from ngc_control import FakeNgc, reread_ngcsdk_environment  # noqa: E402

TRANSPORTS = ("cli", "sdk")
SINGLE_TRANSPORT = "sdk"  # in-process ngcsdk: the cheaper of the two (no `ngc` process per API call)
needs_ngcsdk = pytest.mark.skipif(not ngc_parser.available(), reason="ngcsdk[telemetry]==4.19.1 not installed")


def point_ngcsdk_at_environment() -> None:
    """Each test starts its own emulator, so an in-process ngcsdk must read its NGC_CLI_* settings again.
    ngcsdk is imported here first the way the offline parser check imports it (tests/support/ngc_parser.py, with its own
    placeholder settings), so that a later parser check cannot leave those settings behind."""
    ngc_parser.parse_args(["batch", "list"])
    reread_ngcsdk_environment()


@pytest.fixture(scope="session")
def ngc_tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One certificate for the session: gRPC reads GRPC_DEFAULT_SSL_ROOTS_FILE_PATH once per process."""
    return tmp_path_factory.mktemp("ngc-tls")


def transports_for(metafunc: pytest.Metafunc) -> tuple[str, ...] | None:
    """The transports a test that uses `fake` runs on; None where the test parametrizes `fake` itself."""
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        if "fake" in ([n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)):
            return None
    if forced := os.environ.get("BCP_TEST_TRANSPORTS"):
        return tuple(t.strip() for t in forced.split(",") if t.strip())
    if metafunc.definition.get_closest_marker("both_transports"):
        return TRANSPORTS
    return (SINGLE_TRANSPORT,)


@pytest.fixture
def fake(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ngc_tls_dir: Path):
    """A running emulator with workspace `main`; this process's environment points NVIDIA's client at it.
    `fake.transport` is the transport the test's config should name. `@pytest.mark.emulator(api_key=...,
    variants={...})` starts it as another variant of the service (tests/fakes/README.md "Variants")."""
    marker = request.node.get_closest_marker("emulator")
    ngc = FakeNgc(tmp_path / "ngc-home", tls_dir=ngc_tls_dir, **(marker.kwargs if marker else {})).start()
    ngc.transport = request.param
    ngc.create_workspace("main")
    for key in [k for k in os.environ if k.startswith("NGC_CLI_")]:
        monkeypatch.delenv(key)
    for key, value in ngc.env().items():
        monkeypatch.setenv(key, value)
    # The BCP workspace writer locks live in the user's state folder (engine/workspace_lock.py): one per test.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    point_ngcsdk_at_environment()
    disarm = shutdown_emulator_when_gone(ngc)  # Ctrl-C or kill -9 of this test process: stopped all the same
    yield ngc
    ngc.shutdown()
    disarm()


def status_calls(fake: FakeNgc) -> int:
    """`job list` calls made so far: CLI invocations, or the lists ngcsdk asked for (first pages)."""
    if fake.transport == "cli":
        return len(fake.calls("job list"))
    return len([r for r in fake.requests("GET", "/v2/org/*/jobs") if "page-number=" not in r["query"]])


def jobs_by_stage(fake: FakeNgc) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for record in fake.jobs().values():
        grouped.setdefault(record["job"]["jobDefinition"]["name"], []).append(record["job"])
    return grouped
