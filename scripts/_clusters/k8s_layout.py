"""Where everything of one Kubernetes test cluster lives (see k8s.py): every path derived from its base folder,
its node count and its ports."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .common import REPO
from .netns import Network

DEFAULT_PORT = 16443  # not 6443, so a real cluster's apiserver on this machine does not clash
# The Service network the apiserver allocates ClusterIPs from. Nothing routes it (no kube-proxy runs), but it is
# still taken from 198.18.0.0/15, the range reserved for benchmarking, so no address of a real network is used.
SERVICE_CIDR = "198.19.255.0/24"
SERVICE_IP = "198.19.255.1"  # the `kubernetes` Service's ClusterIP: the first of SERVICE_CIDR


@dataclass(frozen=True)
class Layout:
    """Every path of one cluster, derived from its base folder."""

    base: Path
    nodes: int = 0  # node agents (0: the control plane alone)

    @classmethod
    def load(cls, base: Path) -> Layout:
        """The cluster as last started under `base` (its node count from run/nodes)."""
        try:
            return cls(base, int((base / "run" / "nodes").read_text().strip()))
        except (OSError, ValueError):
            return cls(base)

    @property
    def node_names(self) -> list[str]:
        return [f"node{k}" for k in range(1, self.nodes + 1)]

    @property
    def net(self) -> Network:
        return Network.of(self.base)

    @property
    def api_address(self) -> str:
        """Where the apiserver listens: the bridge when there are nodes (their namespaces reach it there)."""
        return self.net.host_address if self.nodes else "127.0.0.1"

    @property
    def pki(self) -> Path:
        return self.base / "pki"

    @property
    def logs(self) -> Path:
        return self.base / "log"

    @property
    def run(self) -> Path:
        return self.base / "run"

    @property
    def lock(self) -> Path:
        return self.run / "lock"

    @property
    def kubeconfig(self) -> Path:
        return self.base / "admin.kubeconfig"

    @property
    def port_file(self) -> Path:
        return self.run / "port"

    def node_root(self, node: str) -> Path:
        """A node agent's folder (its pods' folders and hosts file); named in its arguments."""
        return self.base / "nodes" / node

    def pid_file(self, name: str) -> Path:
        return self.run / f"{name}.pid"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def saved_port(self) -> int:
        try:
            return int(self.port_file.read_text().strip())
        except (OSError, ValueError):
            return DEFAULT_PORT


def default_base() -> Path:
    return Path(os.environ.get("BCP_K8S_BASE") or REPO / ".k8s").resolve()


def export_line(lay: Layout) -> str:
    return f"export KUBECONFIG={lay.kubeconfig}"
