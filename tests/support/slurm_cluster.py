"""A real single-node Slurm cluster for tests, started through scripts/slurm-cluster.

Use the session fixture (register it once, e.g. in conftest.py: `from slurm_cluster import slurm_cluster`):

    def test_something(slurm_cluster: SlurmCluster) -> None:
        subprocess.run(["sbatch", ...])  # SLURM_CONF is exported for the whole session

It installs Slurm if missing (Debian packages through `scripts/slurm-cluster install`), starts the cluster unless
one is already running (CI starts it before pytest), exports SLURM_CONF, and stops the cluster at the end of the
session only if it started it. Where Slurm cannot run (not Linux, not root, no apt-get, the install fails) the
tests that use it are skipped, and the reason is printed on the terminal as well as in the `-ra` summary.
Set BCP_SLURM_INSTALL=0 to never install packages (skip instead).

`two_node_cluster` (module scope) is a separate two-node cluster (`start --nodes 2`: each slurmd in its own network
namespace on a private bridge) under a base folder of its own; it is always stopped at the end, namespaces and
bridge included, and one left behind by a killed session is stopped before the new one starts.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.reaper import run_when_gone

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm-cluster"


@dataclass(frozen=True)
class SlurmCluster:
    conf: Path  # the cluster's slurm.conf; exported as SLURM_CONF
    started_here: bool  # this session started it, so this session stops it
    version: str  # e.g. "slurm-wlm 22.05.8"


def script(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run scripts/slurm-cluster with the current interpreter (any cwd, no exec bit needed)."""
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def unavailable_reason(which: Callable[[str], str | None] = shutil.which, euid: int | None = None) -> str | None:
    """Why a real Slurm cannot run on this machine, judged before installing or starting anything."""
    if not sys.platform.startswith("linux"):
        return f"a real Slurm cluster needs Linux (this is {sys.platform})"
    if (os.geteuid() if euid is None else euid) != 0:
        return "a real Slurm cluster needs root (slurmd launches jobs); run the Slurm tests as root"
    if which("sbatch") is None and which("slurmd") is None:
        if which("apt-get") is None:
            return "Slurm is not installed and apt-get is not available to install it"
        if os.environ.get("BCP_SLURM_INSTALL") == "0":
            return "Slurm is not installed and BCP_SLURM_INSTALL=0 forbids installing it"
    return None


def _announce(config: pytest.Config, message: str) -> None:
    """Print on the terminal now, even with output capturing on."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        print(message, file=sys.__stderr__, flush=True)
        return
    with capture.global_and_fixture_disabled():
        reporter.ensure_newline()
        reporter.write_line(message, yellow=True)


def _skip(config: pytest.Config, reason: str) -> None:
    _announce(config, f"SKIPPING the real-Slurm tests: {reason}")
    pytest.skip(reason)


def install_or_skip(config: pytest.Config) -> None:
    """Slurm's packages, installed where missing (BCP_SLURM_INSTALL=0: never); skips where Slurm cannot run."""
    if reason := unavailable_reason():
        _skip(config, reason)
    if os.environ.get("BCP_SLURM_INSTALL") != "0":
        res = script("install")
        if res.returncode != 0:
            _skip(config, f"Slurm could not be installed: {res.stderr.strip()[-1500:]}")


def start_cluster(config: pytest.Config) -> SlurmCluster:
    """Install if needed and start (or reuse) the cluster; export SLURM_CONF. Skips where Slurm cannot run."""
    install_or_skip(config)
    was_running = script("status", timeout=60).returncode == 0
    res = script("start", timeout=120)
    if res.returncode != 0:  # installed but does not come up: a real failure, not a skip
        pytest.fail(f"scripts/slurm-cluster start failed (exit {res.returncode}):\n{res.stderr}", pytrace=False)
    exports = [line for line in res.stdout.splitlines() if line.startswith("export SLURM_CONF=")]
    assert exports, f"no export line in the output of start: {res.stdout!r}"
    conf = Path(exports[-1].split("=", 1)[1])
    os.environ["SLURM_CONF"] = str(conf)
    version = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True).stdout.strip()
    return SlurmCluster(conf=conf, started_here=not was_running, version=version)


def stop_cluster(cluster: SlurmCluster) -> None:
    """Stop the cluster if this session started it; a cluster that was already running is left alone."""
    if cluster.started_here:
        res = script("stop", timeout=120)
        assert res.returncode == 0, f"scripts/slurm-cluster stop failed:\n{res.stderr}"


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    saved = os.environ.get("SLURM_CONF")
    cluster = start_cluster(request.config)
    # Ctrl-C or kill -9 of this test process: the daemons it started are stopped all the same.
    disarm = run_when_gone([sys.executable, str(SCRIPT), "stop"]) if cluster.started_here else (lambda: None)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)
        disarm()
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


@dataclass(frozen=True)
class MultiNodeCluster:
    base: Path
    conf: Path
    nodes: dict[str, str]  # node name -> its address on the cluster's bridge

    def script(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """scripts/slurm-cluster COMMAND --base BASE ARGS (COMMAND first)."""
        return script(args[0], "--base", str(self.base), *args[1:], timeout=timeout)

    def kill_node(self, node: str) -> None:
        """Lose `node`: SIGKILL its slurmd and everything running on it."""
        res = self.script("kill-node", node)
        assert res.returncode == 0, res.stderr

    def restart_missing_nodes(self) -> None:
        res = self.script("start", "--nodes", str(len(self.nodes)))
        assert res.returncode == 0, res.stderr


def multinode_base(repo: Path = REPO) -> Path:
    """One base folder per checkout, in /tmp (munged refuses pytest's 0700 tmp folders), found again after a kill."""
    return Path("/tmp") / f"bcp-pipeline-slurm-2n-{hashlib.sha1(str(repo).encode()).hexdigest()[:8]}"


def node_addresses(conf: Path) -> dict[str, str]:
    """NodeName -> NodeAddr, from the cluster's slurm.conf."""
    nodes = {}
    for line in conf.read_text().splitlines():
        if line.startswith("NodeName="):
            fields = dict(field.split("=", 1) for field in line.split())
            nodes[fields["NodeName"]] = fields["NodeAddr"]
    return nodes


@pytest.fixture(scope="module")
def two_node_cluster(request: pytest.FixtureRequest) -> Iterator[MultiNodeCluster]:
    config = request.config
    install_or_skip(config)
    if shutil.which("ip") is None:
        _skip(config, "a multi-node Slurm needs iproute2 (`ip`)")
    base = multinode_base()
    base.mkdir(mode=0o755, exist_ok=True)
    saved = os.environ.get("SLURM_CONF")
    stale = script("stop", "--base", str(base))  # a cluster a killed session left behind: jobs, daemons, namespaces
    assert stale.returncode == 0, f"stopping a stale cluster under {base} failed:\n{stale.stderr}"
    try:
        res = script("start", "--base", str(base), "--nodes", "2", "--cpus", "4", timeout=120)
        if res.returncode != 0:
            pytest.fail(
                f"scripts/slurm-cluster start --nodes 2 failed (exit {res.returncode}):\n{res.stderr}", pytrace=False
            )
        conf = base / "etc" / "slurm.conf"
        os.environ["SLURM_CONF"] = str(conf)
        yield MultiNodeCluster(base=base, conf=conf, nodes=node_addresses(conf))
    finally:
        res = script("stop", "--base", str(base), timeout=120)
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        assert res.returncode == 0, f"scripts/slurm-cluster stop failed:\n{res.stderr}"
        left = script("status", "--base", str(base), timeout=60)
        assert left.returncode == 3 and "absent; namespaces: none" in left.stdout, left.stdout
