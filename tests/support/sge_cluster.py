"""A real two-host Son of Grid Engine cell for tests, started through scripts/sge-cluster.

    from support.sge_cluster import SgeCell, sge_cell  # noqa: F401 (the fixture)

    def test_something(sge_cell: SgeCell) -> None:
        subprocess.run(["qsub", ...])  # SGE_ROOT, SGE_CELL and the cell's ports are exported while it runs

`sge_cell` (module scope) installs Grid Engine if missing (Debian packages, `scripts/sge-cluster install`), starts
a private cell of two exec hosts (this machine's name, and `node2` in its own network, UTS and mount namespaces)
under a base folder of its own in /tmp, exports its environment, and always stops it at the end, namespace and
bridge included; one left behind by a killed session is stopped before the new one starts. Where Grid Engine
cannot run (not Linux, not root, no apt-get, the install fails) the tests are skipped with the reason printed.
Set BCP_SGE_INSTALL=0 to never install packages (skip instead).

`tsubame_cell` is the same cell set up as TSUBAME4 (`start --site tsubame`: node_f, the site's JSV), with TSUBAME's
client side on PATH while it runs: the qsub wrapper stand-in and qacct lagging by minutes (tests/fakes/README.md).
A module uses one of the two; each starts a fresh cell.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.reaper import run_when_gone
from support.slurm_cluster import _skip

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "sge-cluster"
ENV_KEYS = ("SGE_ROOT", "SGE_CELL", "SGE_QMASTER_PORT", "SGE_EXECD_PORT")


@dataclass(frozen=True)
class SgeCell:
    base: Path
    hosts: list[str]  # the first exec host (this machine's name), then node2

    def script(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """scripts/sge-cluster COMMAND --base BASE ARGS (COMMAND first)."""
        return script(args[0], "--base", str(self.base), *args[1:], timeout=timeout)


def script(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def unavailable_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"a real Grid Engine cell needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "a real Grid Engine cell needs root (execd starts jobs as their owners); run these tests as root"
    if shutil.which("ip") is None and shutil.which("apt-get") is None:
        return "a two-host cell needs iproute2 (`ip`), and apt-get is not there to install it"
    if shutil.which("sge_qmaster") is None and not Path("/usr/lib/gridengine/sge_qmaster").exists():
        if shutil.which("apt-get") is None:
            return "Grid Engine is not installed and apt-get is not available to install it"
        if os.environ.get("BCP_SGE_INSTALL") == "0":
            return "Grid Engine is not installed and BCP_SGE_INSTALL=0 forbids installing it"
    return None


def cell_base(repo: Path = REPO) -> tuple[Path, int]:
    """One base folder and qmaster port per checkout, so two checkouts' test cells never share either."""
    digest = hashlib.sha1(str(repo).encode()).hexdigest()
    return Path("/tmp") / f"bcp-pipeline-sge-2n-{digest[:8]}", 17000 + 2 * (int(digest[8:12], 16) % 400)


@pytest.fixture(scope="module")
def sge_cell(request: pytest.FixtureRequest) -> Iterator[SgeCell]:
    yield from running_cell(request.config)


# TSUBAME's client side, stand-ins on PATH (tests/fakes/README.md): its qsub wrapper (the group only as `-g GROUP` on
# the command line) and accounting that lags by minutes, as on a busy site.
TSUBAME_CLIENT_PATH = [REPO / "tests" / "fakes" / "tsubame_qsub", REPO / "tests" / "fakes" / "slow_qacct"]
TSUBAME_GROUP = "tga-bcpp"  # the test user's TSUBAME group, the one the qsub stand-in accepts
TSUBAME_QACCT_LAG_S = 180


@pytest.fixture(scope="module")
def tsubame_cell(request: pytest.FixtureRequest) -> Iterator[SgeCell]:
    """The same two-host cell with TSUBAME4's set-up (`scripts/sge-cluster start --site tsubame`: node_f, the
    site's parallel environment, its JSV), and its client side on PATH while it runs: the qsub wrapper stand-in
    (accepting the group TSUBAME_GROUP) and qacct lagging by TSUBAME_QACCT_LAG_S."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", os.pathsep.join([*map(str, TSUBAME_CLIENT_PATH), os.environ["PATH"]]))
        patch.setenv("BCP_FAKE_TSUBAME_GROUPS", TSUBAME_GROUP)
        patch.setenv("BCP_FAKE_QACCT_LAG", str(TSUBAME_QACCT_LAG_S))
        yield from running_cell(request.config, "--site", "tsubame")


def running_cell(config: pytest.Config, *start_args: str) -> Iterator[SgeCell]:
    """Grid Engine installed where missing, a fresh two-host cell started (`start_args` added), its environment
    exported while it runs, and it stopped whatever happens."""
    if reason := unavailable_reason():
        _skip(config, reason)
    if os.environ.get("BCP_SGE_INSTALL") != "0":
        res = script("install")
        if res.returncode != 0:
            _skip(config, f"Grid Engine could not be installed: {res.stderr.strip()[-1500:]}")
    base, port = cell_base()
    saved = {key: os.environ.get(key) for key in ENV_KEYS}
    stale = script("stop", "--base", str(base), timeout=120)
    assert stale.returncode == 0, f"stopping a stale cell under {base} failed:\n{stale.stderr}"
    disarm = run_when_gone([sys.executable, str(SCRIPT), "stop", "--base", str(base)])  # Ctrl-C, kill -9: stopped
    try:
        res = script(
            "start", "--base", str(base), "--nodes", "2", "--slots", "4", "--port", str(port), *start_args, timeout=180
        )
        if res.returncode != 0:
            pytest.fail(
                f"scripts/sge-cluster start --nodes 2 failed (exit {res.returncode}):\n{res.stderr}", pytrace=False
            )
        exports = [line for line in res.stdout.splitlines() if line.startswith("export ")]
        assert exports, res.stdout
        for pair in exports[-1].split()[1:]:
            key, _, value = pair.partition("=")
            os.environ[key] = value
        yield SgeCell(base=base, hosts=[socket.gethostname(), "node2"])
    finally:
        res = script("stop", "--base", str(base), timeout=120)
        disarm()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        assert res.returncode == 0, f"scripts/sge-cluster stop failed:\n{res.stderr}"
        left = script("status", "--base", str(base), timeout=60)
        assert left.returncode == 3, left.stdout
        # node2's namespace and the bridge (named as scripts/slurm-cluster names them, from the base folder) are gone.
        tag = hashlib.sha1(str(base).encode()).hexdigest()[:6]
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"bcpbr{tag}" not in links and f"bcp{tag}" not in namespaces, (links, namespaces)
