"""scripts/_clusters, the code of scripts/slurm-cluster, sge-cluster and k8s-cluster, without starting a cluster: the
one check of "is this pid ours", the private network's addresses, the Kubernetes build cache's layout, and the
three scripts being thin shims over the package."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from _clusters import common, k8s_build, netns  # noqa: E402 (after scripts/ is on the path)

SHIMS = ["slurm-cluster", "sge-cluster", "k8s-cluster"]


def _wait_for_exec(pid: int, cmdline: bytes) -> None:
    """Wait until the child's exec is complete. Popen returns when the exec closes its close-on-exec pipe, but the
    kernel sets the new program's name and argument pages after that, so /proc/PID can still show the parent's for a
    moment (a CI run under load saw it). A daemon writes its own pid file, after its exec, so it has no such window."""
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/cmdline").read_bytes() != cmdline:
        assert time.monotonic() < deadline, f"process {pid} did not finish its exec in 10 s"
        time.sleep(0.01)


def test_a_pid_file_is_trusted_only_for_our_live_daemon(tmp_path: Path) -> None:
    # The marker argument: "0", as GNU sleep sums its arguments and refuses any that is not a number.
    process = subprocess.Popen(["sleep", "60", "0"], env={**os.environ, "BCP_TEST_ROOT": "/cell"})
    pid_file = tmp_path / "sleep.pid"
    pid_file.write_text(f"{process.pid}\n")
    try:
        _wait_for_exec(process.pid, b"sleep\x0060\x000\x00")
        assert common.PidFile(pid_file, "sleep", ("0",)).live_pid() == process.pid
        assert common.PidFile(pid_file, "sleep", ("BCP_TEST_ROOT=/cell",)).live_pid() == process.pid  # its environ
        assert common.PidFile(pid_file, None, ("0",)).live_pid() == process.pid  # any program
        assert common.PidFile(pid_file, "sleep", ("1",)).live_pid() is None  # another cluster's
        assert common.PidFile(pid_file, "sleep", ("BCP_TEST_ROOT=/other",)).live_pid() is None
        assert common.PidFile(pid_file, "slurmd", ("0",)).live_pid() is None  # a reused pid
        os.kill(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while common.PidFile(pid_file, "sleep").live_pid() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert common.PidFile(pid_file, "sleep").live_pid() is None  # a zombie (not reaped yet) is not alive
    finally:
        process.kill()
        process.wait()
    assert common.PidFile(pid_file, "sleep").live_pid() is None
    for text in ("", "garbage\n", "0\n", "-1\n"):
        pid_file.write_text(text)
        assert common.PidFile(pid_file, None).live_pid() is None
    assert common.PidFile(tmp_path / "absent.pid", None).live_pid() is None


def test_terminate_sends_sigkill_to_a_daemon_that_ignores_sigterm(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    process = subprocess.Popen([sys.executable, "-c", code, "--stubborn"], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    pid_file = tmp_path / "stubborn.pid"
    pid_file.write_text(f"{process.pid}\n")
    try:
        common.terminate({"stubborn": common.PidFile(pid_file, None, ("--stubborn",))}, grace=0.5, announce=False)
        assert process.wait(timeout=10) == -signal.SIGKILL
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize(
    "base",
    [
        Path("/"),
        Path("/tmp/bcp-pipeline-slurm-1234abcd"),
        REPO / ".slurm",
        *(Path(f"/tmp/base-{i}") for i in range(100)),
    ],
)
def test_the_network_uses_only_198_18_0_0_15(base: Path) -> None:
    net = netns.Network.of(base)
    benchmark = ipaddress.ip_network("198.18.0.0/15")
    assert net.subnet.subnet_of(benchmark) and net.subnet.prefixlen == 24
    addresses = [net.host_address, *(net.address(k) for k in range(1, netns.MAX_NODES + 1))]
    assert all(ipaddress.ip_address(a) in net.subnet for a in addresses)
    assert len(set(addresses)) == len(addresses)
    names = [net.bridge, net.namespace(netns.MAX_NODES), net.veth_host(netns.MAX_NODES), net.veth_node(netns.MAX_NODES)]
    assert all(len(n.encode()) <= 15 for n in names)  # Linux interface names
    assert net.tag == hashlib.sha1(str(base).encode()).hexdigest()[:6]  # as tests/sge_cluster.py names them


def test_net_up_refuses_a_node_address_past_the_clusters_slash_24() -> None:
    with pytest.raises(common.ClusterError, match="at most"):
        netns.net_up(netns.Network.of(Path("/tmp/too-many")), netns.MAX_NODES + 1)


def test_the_kubernetes_build_cache_keeps_its_layout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    release = k8s_build.release()
    monkeypatch.delenv("BCP_K8S_CACHE", raising=False)
    assert k8s_build.cache_bin() == Path.home() / ".cache" / "bcp-pipeline" / "k8s" / release / "bin"
    monkeypatch.setenv("BCP_K8S_CACHE", str(tmp_path))
    assert k8s_build.cache_bin() == tmp_path / release / "bin"
    assert k8s_build.build_lock_path() == tmp_path / release / "bin" / ".build.lock"
    assert k8s_build.build_log_path() == tmp_path / release / "bin" / "build.log"


@pytest.mark.parametrize("shim", SHIMS)
def test_the_scripts_are_thin_shims_over_the_package(shim: str) -> None:
    text = (SCRIPTS / shim).read_text()
    assert len(text.splitlines()) <= 12 and "from _clusters import" in text
    assert os.access(SCRIPTS / shim, os.X_OK)
    res = subprocess.run(
        [sys.executable, str(SCRIPTS / shim), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == 0 and f"usage: {shim}" in res.stdout, res.stderr


def test_no_script_is_loaded_from_a_file_and_no_module_is_long() -> None:
    sources = [
        *(SCRIPTS / "_clusters").glob("*.py"),
        *(SCRIPTS / s for s in SHIMS),
        REPO / "tests" / "fakes" / "k8s_node_agent.py",
    ]
    assert not [p for p in sources if "SourceFileLoader" in p.read_text()]
    assert not [p.name for p in (SCRIPTS / "_clusters").glob("*.py") if len(p.read_text().splitlines()) > 400]


def test_the_test_clusters_default_ports_do_not_overlap():
    """Slurm, Grid Engine and Kubernetes on one machine at once, each on its default ports (issue: GE's qmaster
    and execd took the Kubernetes controller-manager's and scheduler's)."""
    from _clusters import k8s_layout, sge_cell, slurm_layout

    ranges = {
        "kubernetes": range(k8s_layout.DEFAULT_PORT, k8s_layout.DEFAULT_PORT + 5),  # apiserver .. etcd peers
        "gridengine": range(sge_cell.DEFAULT_PORT, sge_cell.DEFAULT_PORT + 2),  # qmaster, execd
        "slurm": range(slurm_layout.DEFAULT_PORT, slurm_layout.DEFAULT_PORT + 2),
    }  # slurmctld, slurmd
    names = sorted(ranges)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            assert not set(ranges[first]) & set(ranges[second]), (first, second)
