"""The private network of a multi-node test cluster (Slurm's, Grid Engine's and Kubernetes' alike): one Linux bridge
on the host and, per node, a network namespace joined to it by a veth pair.

Names and subnet are hashed from the cluster's base folder, so two clusters on one machine never share them: a
bridge `bcpbrHHHHHH` holding address S.1 of a /24 S.0/24 (HHHHHH: 6 hex digits of the hash, short enough for
Linux interface names of 15 bytes; S: a /24 of 198.18.0.0/15, the range reserved for benchmarking by RFC 2544,
never a real destination, derived from the same hash) and per node K a namespace `bcpHHHHHHnK` joined to the
bridge by a veth pair (`bcpHHHHHHvK` on the host, `bcpHHHHHHpK` inside) with address S.(10+K), and loopback up.
Nothing else: no default route in the namespaces, no NAT, no change to IP forwarding or firewall rules, so nothing
in a namespace reaches beyond this machine's bridge. `net_up` refuses a /24 that another interface's address
overlaps; `net_down` removes all of it, the processes still inside included.
Needs root, iproute2 (`ip`) and util-linux (`nsenter`, `unshare`).
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .common import ClusterError, run, say

NET = ipaddress.ip_network("198.18.0.0/15")  # reserved for benchmarking (RFC 2544): never a real destination
# nodeK gets .(10+K) of the cluster's /24; the bridge (host side: slurmctld, qmaster, the apiserver) gets .1
NODE_HOST_OFFSET = 10
MAX_NODES = 254 - NODE_HOST_OFFSET  # .(10+K) must stay inside the cluster's /24, so inside 198.18.0.0/15

# Run inside a node's namespaces: set the hostname (new UTS namespace) to the node's name, put the cluster's hosts
# file over /etc/hosts (new mount namespace, so only this node and its jobs see it), then exec the daemon.
SET_HOSTNAME = (
    "import os, socket, subprocess, sys; socket.sethostname(sys.argv[1]); "
    "subprocess.run(['mount', '--bind', sys.argv[2], '/etc/hosts'], check=True); "
    "os.execvp(sys.argv[3], sys.argv[3:])"
)


@dataclass(frozen=True)
class Network:
    """The bridge, namespaces and addresses of a multi-node cluster; names and subnet hashed from the base folder,
    so two clusters on one machine never share them, and short enough for Linux interface names (15 bytes)."""

    base: Path  # the cluster's base folder, which the rest is derived from
    tag: str  # 6 hex digits
    subnet: ipaddress.IPv4Network  # a /24 of 198.18.0.0/15

    @classmethod
    def of(cls, base: Path) -> Network:
        digest = hashlib.sha1(str(base).encode()).hexdigest()
        index = int(digest[6:12], 16) % (NET.num_addresses // 256)
        return cls(base, digest[:6], ipaddress.ip_network(f"{NET.network_address + 256 * index}/24"))

    @property
    def bridge(self) -> str:
        return f"bcpbr{self.tag}"

    @property
    def host_address(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def prefix(self) -> str:  # every namespace and veth of this cluster starts with it
        return f"bcp{self.tag}"

    def namespace(self, k: int) -> str:
        return f"{self.prefix}n{k}"

    def veth_host(self, k: int) -> str:
        return f"{self.prefix}v{k}"

    def veth_node(self, k: int) -> str:
        return f"{self.prefix}p{k}"

    def address(self, k: int) -> str:
        return str(self.subnet.network_address + NODE_HOST_OFFSET + k)


def in_namespace(net: Network, k: int, argv: list[str]) -> list[str]:
    """`argv` run in node K's network namespace. nsenter, not `ip netns exec`: that also remounts /sys, hiding
    /sys/fs/cgroup, and slurmd then refuses to start ("Unable to initialize cgroup plugin")."""
    return ["nsenter", f"--net=/run/netns/{net.namespace(k)}", "--", *argv]


def as_node(net: Network, k: int, hostname: str, hosts_file: Path, argv: list[str]) -> list[str]:
    """`argv` run as node K: in its network namespace, with its own host name (UTS namespace) and `hosts_file`
    over /etc/hosts (a private mount namespace: the machine's /etc/hosts is untouched)."""
    return in_namespace(
        net,
        k,
        [
            "unshare",
            "--uts",
            "--mount",
            "--propagation",
            "private",
            "--",
            sys.executable,
            "-c",
            SET_HOSTNAME,
            hostname,
            str(hosts_file),
            *argv,
        ],
    )


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = run(["ip", *args], timeout=30)
    if check and res.returncode != 0:
        raise ClusterError(f"`ip {' '.join(args)}` failed (exit {res.returncode}): {res.stderr.strip()}")
    return res


def namespaces_of(net: Network) -> list[str]:
    """This cluster's namespaces that exist now (any node count: a stale cluster may have had more)."""
    names = [line.split()[0] for line in ip("netns", "list", check=False).stdout.splitlines() if line.split()]
    return sorted(n for n in names if n.startswith(net.prefix + "n"))


def namespace_pids(namespace: str) -> list[int]:
    return [int(p) for p in ip("netns", "pids", namespace, check=False).stdout.split() if p.isdigit()]


def our_links(net: Network) -> list[str]:
    """This cluster's interfaces on the host: the bridge and the host ends of the veth pairs."""
    lines = ip("-o", "link", "show", check=False).stdout.splitlines()
    names = [line.split(":")[1].strip().split("@")[0] for line in lines if line.count(":") >= 2]
    return [n for n in names if n.startswith(net.prefix) or n == net.bridge]


def net_exists(net: Network) -> bool:
    return bool(namespaces_of(net) or our_links(net))


def kill_namespace_processes(namespace: str) -> None:
    """SIGKILL what still runs in one of this cluster's namespaces (job steps of a lost node, a stray daemon):
    every process there was started by these scripts, since nothing else ever enters these namespaces."""
    pids = namespace_pids(namespace)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while namespace_pids(namespace) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pids:
        say(f"killed {len(pids)} leftover process(es) in namespace {namespace}")


def net_down(net: Network) -> None:
    """Remove every namespace, veth and the bridge of this cluster, and the processes still inside."""
    for namespace in namespaces_of(net):
        kill_namespace_processes(namespace)
        ip("netns", "delete", namespace)  # its veth pair goes with it, a moment later
    deadline = time.monotonic() + 10
    while links := our_links(net):
        for name in links:
            res = ip("link", "delete", name, check=False)
            if res.returncode != 0 and "Cannot find device" not in res.stderr and time.monotonic() > deadline:
                raise ClusterError(f"`ip link delete {name}` failed: {res.stderr.strip()}")
        if time.monotonic() > deadline:
            raise ClusterError(f"interfaces still present after 10 s: {' '.join(links)}")
        time.sleep(0.05)


def address_in_use(net: Network) -> str | None:
    """Another interface's IPv4 address inside this cluster's /24, which would make routing ambiguous."""
    for line in ip("-o", "-4", "addr", "show", check=False).stdout.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] != net.bridge:
            iface = ipaddress.ip_interface(fields[3])
            if iface.network.overlaps(net.subnet):
                return f"{fields[3]} on {fields[1]}"
    return None


def net_up(net: Network, nodes: int) -> None:
    """The bridge at S.1/24 and namespaces 1..`nodes`, each at S.(10+K)/24 with loopback up."""
    if nodes > MAX_NODES:  # a node address past .254 would leave the /24, and possibly 198.18.0.0/15
        raise ClusterError(f"{nodes} nodes: at most {MAX_NODES} fit in one /24")
    if clash := address_in_use(net):
        raise ClusterError(
            f"{net.subnet} (derived from the base folder {net.base}) overlaps {clash}; pass another --base"
        )
    ip("link", "add", net.bridge, "type", "bridge")
    ip("address", "add", f"{net.host_address}/24", "dev", net.bridge)
    ip("link", "set", net.bridge, "up")
    for k in range(1, nodes + 1):
        ns = net.namespace(k)
        ip("netns", "add", ns)
        ip("link", "add", net.veth_host(k), "type", "veth", "peer", "name", net.veth_node(k), "netns", ns)
        ip("link", "set", net.veth_host(k), "master", net.bridge, "up")
        ip("-n", ns, "address", "add", f"{net.address(k)}/24", "dev", net.veth_node(k))
        ip("-n", ns, "link", "set", net.veth_node(k), "up")
        ip("-n", ns, "link", "set", "lo", "up")  # srun and slurmstepd talk over loopback inside a node too
