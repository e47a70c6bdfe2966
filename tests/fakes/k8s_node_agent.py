"""A STAND-IN for the kubelet, for the test cluster of scripts/k8s-cluster (no container runtime or images exist
on the test machine, so no real kubelet can run there). One agent is one Node:

- it registers the Node (its address, CPU, memory and pod capacity, and, with --gpus/--efa, `nvidia.com/gpu` and
  `vpc.amazonaws.com/efa` capacity as EKS's device plugins advertise it: counts only, no device is behind them;
  the real scheduler places pods by them), removes the `node.kubernetes.io/not-ready` taint the apiserver puts on
  a new Node, keeps its Lease in kube-node-lease renewed and its Ready condition fresh, so the real
  controller-manager and scheduler treat it as a node;
- IMAGES: no image is pulled, but the agent knows which images its node "can pull": those matching an --images
  fnmatch pattern (default `*`: every image). A pod of another image never runs: its container waits as the
  kubelet's does, `ErrImagePull` (with a message naming the image) at each try and `ImagePullBackOff` between
  tries (the kubelet's back-off, 10 s doubling to 300 s), the pod Pending with its startTime set; a name no
  runtime can parse waits in `InvalidImageName` for good;
- it runs each other pod bound to it (by the real scheduler) as a process: the first container's `command` +
  `args` (the command runs on this machine), in a private mount and UTS namespace of the pod:
  - ENVIRONMENT: exactly the container's `env` as rendered, resolved as the kubelet does (in order, `$(VAR)` in a
    `value` expanded over the entries before it, `$$` an escaped `$`, an undefined reference kept as written;
    `fieldRef`s such as the completion index annotation of an Indexed Job's pod, `secretKeyRef`s read), and
    `$(VAR)` in `command` and `args` expanded over it; under it only what a container runtime adds, HOSTNAME and
    PATH (the image's ENV PATH, for which this machine's stands in). Nothing else of the agent's environment
    reaches the process. The kubelet's service-link variables (KUBERNETES_SERVICE_HOST, ...) are not set: a
    real container has more variables, never fewer;
  - /dev/shm: a tmpfs of its own in the pod's mount namespace, 64 MiB (a container runtime's default), as on a
    real node; a memory `emptyDir` is a tmpfs too, sized as the kubelet sizes it (the pod's memory limit, else
    the node's allocatable memory; its sizeLimit where that is smaller), so one mounted at /dev/shm replaces the
    64 MiB;
  - Secret volumes written as files (0600) and PersistentVolumeClaims bound to a `hostPath` or `local`
    PersistentVolume bind-mounted at their `mountPath`; a disk `emptyDir` is a folder of the pod's;
  - the pod's host name set and resolvable, with every pod's `hostname.subdomain` (a headless Service's DNS
    names, as cluster DNS would give them) and a headless Service's own name (its endpoint: the training
    operator's per-replica Services), through a hosts file bind-mounted over /etc/hosts;
- it patches the pod's status (Running, then Succeeded/Failed with the container's exit code or signal; when
  the container's main process ends, what it left running is killed, as a container's processes end with it),
  kills the process group on deletion (SIGTERM, SIGKILL after the grace period) and then removes the pod;
- it serves `/containerLogs/NAMESPACE/POD/CONTAINER` (tailLines, follow) over TLS on the node's address, so
  `kubectl logs` / `pods/log` work through the real apiserver.

Where it differs from a real node, and why it is never kinder: the process sees this machine's files beyond its
mounts (there is no image root to give it); pods share the node's network namespace (as with hostNetwork: a
pod's IP is its node's address); only `restartPolicy: Never` is honoured (a failed container is never
restarted); GPUs and EFA devices are counts the scheduler uses, with nothing to open behind them. The agent runs
as the node's own identity (a client certificate of `system:node:NAME` in `system:nodes`), so the apiserver's
Node authorizer decides what it may touch, as for a real kubelet.

    python tests/fakes/k8s_node_agent.py --kubeconfig NODE.kubeconfig --node node1 --address 198.18.x.11 \
        --port 10250 --tls-cert node1.crt --tls-key node1.key --client-ca ca.crt --root DIR \
        [--gpus 8 --efa 4] [--images 'nvcr.io/*' --images 'python:*']
"""

from __future__ import annotations

import argparse
import base64
import datetime
import fnmatch
import http.server
import json
import logging
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

LEASE_RENEW_S = 2.0
STATUS_REFRESH_S = 5.0
AUTHORIZER_LAG_S = 15.0
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
GPU, EFA = "nvidia.com/gpu", "vpc.amazonaws.com/efa"  # the extended resources EKS's device plugins advertise
SHM_DEFAULT_BYTES = 64 * 1024 * 1024  # a container runtime's /dev/shm (containerd, CRI-O, Docker: 64 MiB)
# The kubelet's image pull back-off (pkg/kubelet/images: 10 s doubling to 300 s between tries).
PULL_BACKOFF_S, PULL_BACKOFF_MAX_S = 10.0, 300.0
# An image reference as the container runtime parses it (distribution's reference grammar, simplified): what fails
# it is InvalidImageName, never pulled.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(
    rf"^(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z]"
    r"[A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
QUANTITY = re.compile(r"^([0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
QUANTITY_FACTORS = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
# Runs first in the pod's new UTS + mount namespaces: host name, /etc/hosts, the volumes, then the command.
POD_INIT = """
import json, os, socket, subprocess, sys
spec = json.loads(sys.argv[1])
socket.sethostname(spec["hostname"])
subprocess.run(["mount", "--bind", spec["hosts"], "/etc/hosts"], check=True)
for mount in spec["mounts"]:
    target = mount["target"]
    os.makedirs(target, exist_ok=True)
    if mount.get("tmpfs_bytes") is not None:  # the pod's /dev/shm, or a memory emptyDir: a tmpfs of its size
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mount['tmpfs_bytes']},mode={mount['mode']}",
                        mount["name"], target], check=True)
    else:
        subprocess.run(["mount", "--bind", mount["source"], target], check=True)
    if mount["read_only"]:
        subprocess.run(["mount", "-o", "remount,bind,ro", target], check=True)
os.chdir(spec["workdir"])
os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
"""

log = logging.getLogger("k8s-node-agent")


def quantity_bytes(text: str) -> int:
    """A Kubernetes quantity ("64Mi", "1G", "512") in bytes, rounded up as the API rounds memory."""
    match = QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a quantity the node agent stand-in reads")
    value = float(match.group(1)) * QUANTITY_FACTORS[match.group(2)]
    return int(value) + (value > int(value))


def expand(text: str, values: dict[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion of env values, command and args (third_party/forked/golang/expansion):
    `$(NAME)` becomes the variable where it is defined and stays as written where not; `$$` is one `$`."""
    out, i = [], 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
            continue
        follow = text[i + 1]
        if follow == "$":
            out.append("$")
            i += 2
        elif follow == "(" and (end := text.find(")", i + 2)) != -1:
            name = text[i + 2 : end]
            out.append(values.get(name, f"$({name})"))
            i = end + 1
        else:  # an operator that begins no reference (or an unclosed one): kept as written
            out.append(text[i : i + 2])
            i += 2
    return "".join(out)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@dataclass
class RunningPod:
    uid: str
    namespace: str
    name: str
    container: str
    process: subprocess.Popen | None
    log_path: Path
    started: datetime.datetime
    deleting: bool = False
    kill_at: float | None = None
    reported: bool = False  # its exit is in the pod's status
    hostname: str = ""
    image: str = ""
    pull_failures: int = 0  # tries at pulling an image this node cannot pull (the container never starts)
    next_pull_at: float | None = None  # the next try, after the back-off
    backoff_at: float | None = None  # when the pod's waiting reason turns from ErrImagePull to ImagePullBackOff


@dataclass
class Agent:
    node: str
    address: str
    port: int
    root: Path
    cpu: str
    memory: str
    core: client.CoreV1Api
    coordination: client.CoordinationV1Api
    discovery: client.DiscoveryV1Api  # with the DNS stand-in's identity (nodes may not list EndpointSlices)
    gpus: int = 0  # nvidia.com/gpu capacity (the NVIDIA device plugin's count); no device is behind it
    efa: int = 0  # vpc.amazonaws.com/efa capacity (the EFA device plugin's count); no device is behind it
    images: tuple[str, ...] = ("*",)  # the images this node can pull (fnmatch patterns); others: ErrImagePull
    pods: dict[str, RunningPod] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)  # write_hosts takes it inside on_pod
    hosts_lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)

    # -- the Node, its Lease and its Ready condition ---------------------------------------------------------
    def ready_condition(self) -> dict[str, Any]:
        stamp = now().isoformat()
        return {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
            "message": "k8s_node_agent (kubelet stand-in) is posting ready status",
        }

    def register(self) -> None:
        capacity = self.capacity()
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": {"kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux"},
            },
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "addresses": [
                    {"type": "InternalIP", "address": self.address},
                    {"type": "Hostname", "address": self.node},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
                "nodeInfo": {
                    "kubeletVersion": "v0.0.0-k8s-node-agent",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                    "containerRuntimeVersion": "none://stand-in",
                    "kernelVersion": os.uname().release,
                    "osImage": "k8s_node_agent",
                    "kubeProxyVersion": "",
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": str(time.time_ns()),
                },
                "conditions": [self.ready_condition()],
            },
        }
        try:
            self.core.create_node(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            # A Node of an earlier start: its capacity as this start gives it (a real kubelet re-posts it too).
            self.core.patch_node_status(self.node, {"status": {"capacity": capacity, "allocatable": capacity}})
        self.refresh_status()
        self.remove_not_ready_taint()

    def capacity(self) -> dict[str, str]:
        """CPU, memory and pods; GPUs and EFA devices as the device plugins advertise them, where this node has
        some (an EKS p4de: 8 and 4), so the real scheduler counts them as it does on EKS."""
        extended = {GPU: self.gpus, EFA: self.efa}
        return {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": "110",
            **{name: str(count) for name, count in extended.items() if count},
        }

    def refresh_status(self) -> None:
        self.core.patch_node_status(self.node, {"status": {"conditions": [self.ready_condition()]}})

    def remove_not_ready_taint(self) -> None:
        node = self.core.read_node(self.node)
        taints = node.spec.taints or []
        kept = [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints if t.key != NOT_READY_TAINT]
        if len(kept) != len(taints):
            self.core.patch_node(self.node, {"spec": {"taints": kept}})

    def renew_lease(self) -> None:
        body = {
            "metadata": {"name": self.node, "namespace": "kube-node-lease"},
            "spec": {
                "holderIdentity": self.node,
                "leaseDurationSeconds": 40,
                "renewTime": now().strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            },
        }
        try:
            self.coordination.patch_namespaced_lease(self.node, "kube-node-lease", body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.coordination.create_namespaced_lease("kube-node-lease", body)

    def heartbeat_loop(self) -> None:
        last_status = 0.0
        while not self.stopping.is_set():
            try:
                self.renew_lease()
                if time.monotonic() - last_status > STATUS_REFRESH_S:
                    self.refresh_status()
                    self.remove_not_ready_taint()  # the node controller adds it back after an outage
                    last_status = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - a heartbeat must survive an apiserver restart
                log.warning("heartbeat failed: %s", exc)
            self.stopping.wait(LEASE_RENEW_S)

    # -- pods -------------------------------------------------------------------------------------------------
    def pod_dir(self, uid: str) -> Path:
        return self.root / "pods" / uid

    def resolve_env(self, pod: client.V1Pod, container: client.V1Container) -> dict[str, str]:
        """The container's `env` as the kubelet resolves it: in order, a `value`'s `$(VAR)` expanded over the
        entries before it, `fieldRef`s and `secretKeyRef`s read. Nothing of this machine's environment: what the
        runtime adds is runtime_env's."""
        env: dict[str, str] = {}
        for var in container.env or []:
            if var.value_from is None:
                env[var.name] = expand(var.value or "", env)
            elif var.value_from.field_ref is not None:
                env[var.name] = self.field_value(pod, var.value_from.field_ref.field_path)
            elif var.value_from.secret_key_ref is not None:
                ref = var.value_from.secret_key_ref
                secret = self.core.read_namespaced_secret(ref.name, pod.metadata.namespace)
                env[var.name] = base64.b64decode((secret.data or {})[ref.key]).decode()
        return env

    @staticmethod
    def runtime_env(pod: client.V1Pod) -> dict[str, str]:
        """What the container runtime sets under the pod's `env`: HOSTNAME, and PATH, the image's (ENV PATH), for
        which this machine's stands in (no image exists here). The kubelet's service-link variables
        (KUBERNETES_SERVICE_HOST, ...) are not set: a real container has more variables than this, never fewer."""
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOSTNAME": pod.spec.hostname or pod.metadata.name}

    def field_value(self, pod: client.V1Pod, path: str) -> str:
        simple = {
            "metadata.name": pod.metadata.name,
            "metadata.namespace": pod.metadata.namespace,
            "metadata.uid": pod.metadata.uid,
            "spec.nodeName": self.node,
            "status.podIP": self.address,
            "status.hostIP": self.address,
            "spec.serviceAccountName": pod.spec.service_account_name or "",
        }
        if path in simple:
            return simple[path]
        for prefix, values in (
            ("metadata.annotations", pod.metadata.annotations),
            ("metadata.labels", pod.metadata.labels),
        ):
            if path.startswith(prefix + "['") and path.endswith("']"):
                return (values or {}).get(path[len(prefix) + 2 : -2], "")
        raise ValueError(f"fieldRef {path!r} is not supported by the node agent stand-in")

    def volume_sources(self, pod: client.V1Pod) -> dict[str, dict[str, Any]]:
        """Each volume of the pod as what is mounted: a folder on this machine (`source`: a Secret's keys as
        files, a PVC's bound PV, a disk emptyDir) or a tmpfs (`tmpfs_bytes`: a memory emptyDir)."""
        sources: dict[str, dict[str, Any]] = {}
        for volume in pod.spec.volumes or []:
            if volume.secret is not None:
                folder = self.pod_dir(pod.metadata.uid) / "volumes" / volume.name
                folder.mkdir(parents=True, exist_ok=True, mode=0o700)
                secret = self.core.read_namespaced_secret(volume.secret.secret_name, pod.metadata.namespace)
                for key, value in (secret.data or {}).items():
                    path = folder / key
                    path.write_bytes(base64.b64decode(value))
                    path.chmod(0o600)
                sources[volume.name] = {"source": str(folder)}
            elif volume.persistent_volume_claim is not None:
                claim = self.core.read_namespaced_persistent_volume_claim(
                    volume.persistent_volume_claim.claim_name, pod.metadata.namespace
                )
                if not claim.spec.volume_name:
                    raise ValueError(f"PVC {claim.metadata.name} is not bound to a PersistentVolume")
                pv = self.core.read_persistent_volume(claim.spec.volume_name)
                local = pv.spec.host_path or pv.spec.local
                if local is None:
                    raise ValueError(f"PV {pv.metadata.name} is neither hostPath nor local")
                Path(local.path).mkdir(parents=True, exist_ok=True)
                sources[volume.name] = {"source": local.path}
            elif volume.empty_dir is not None and volume.empty_dir.medium == "Memory":
                sources[volume.name] = {
                    "tmpfs_bytes": self.memory_volume_bytes(pod, volume.empty_dir.size_limit),
                    "mode": "0777",
                }
            elif volume.empty_dir is not None:
                folder = self.pod_dir(pod.metadata.uid) / "volumes" / volume.name
                folder.mkdir(parents=True, exist_ok=True)
                sources[volume.name] = {"source": str(folder)}
            # Projected service-account tokens and others are not provided: the manifests set
            # automountServiceAccountToken: false, and stage programs never call the API.
        return sources

    def memory_volume_bytes(self, pod: client.V1Pod, size_limit: str | None) -> int:
        """A memory emptyDir's tmpfs size as the kubelet sets it (pkg/volume/emptydir, SizeMemoryBackedVolumes):
        the pod's memory limit (its containers' limits summed; none: the node's allocatable memory), or the
        volume's sizeLimit where that is smaller."""
        limits = [
            quantity_bytes(c.resources.limits["memory"])
            for c in pod.spec.containers
            if c.resources and c.resources.limits and "memory" in c.resources.limits
        ]
        size = sum(limits) if limits else quantity_bytes(self.memory)
        return min(size, quantity_bytes(size_limit)) if size_limit else size

    def pod_mounts(self, container: client.V1Container, sources: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        """What the pod's mount namespace gets, in order: its own /dev/shm (a tmpfs of the runtime's 64 MiB, as a
        container runtime gives every pod), then the container's volumeMounts (a memory emptyDir at /dev/shm
        mounted over it, as on a real node)."""
        mounts = [
            {"name": "shm", "target": "/dev/shm", "tmpfs_bytes": SHM_DEFAULT_BYTES, "mode": "1777", "read_only": False}
        ]
        for mount in container.volume_mounts or []:
            if mount.name in sources:
                mounts.append(
                    {
                        "name": mount.name,
                        "target": mount.mount_path,
                        "read_only": bool(mount.read_only),
                        **sources[mount.name],
                    }
                )
        return mounts

    def image_problem(self, image: str) -> tuple[str, str] | None:
        """(reason, message) where the container runtime would not have the image: a name it cannot parse
        (InvalidImageName, never retried), or one this node cannot pull (ErrImagePull: not among --images)."""
        if not IMAGE_REFERENCE.match(image):
            return "InvalidImageName", (
                f'Failed to apply default image tag "{image}": couldn\'t parse image name '
                f'"{image}": invalid reference format'
            )
        if not any(fnmatch.fnmatchcase(image, pattern) for pattern in self.images):
            return "ErrImagePull", (
                f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
                f"k8s_node_agent (kubelet stand-in): not among the images this node can pull "
                f"({', '.join(self.images)})"
            )
        return None

    def start_pod(self, pod: client.V1Pod) -> None:
        """Run the pod's first container. Its status says Running (with the pod's IP) and the hosts file names it
        before the process starts, so the process resolves its own host name at once (gloo binds to it)."""
        uid, container = pod.metadata.uid, pod.spec.containers[0]
        folder = self.pod_dir(uid)
        folder.mkdir(parents=True, exist_ok=True)
        log_path = folder / f"{container.name}.log"
        running = RunningPod(
            uid,
            pod.metadata.namespace,
            pod.metadata.name,
            container.name,
            None,
            log_path,
            now(),
            hostname=pod.spec.hostname or pod.metadata.name,
            image=container.image or "",
        )
        self.pods[uid] = running
        if self.pull_image(running):
            return
        try:
            env, sources = self.pod_inputs(pod, container)
            # The kubelet expands $(VAR) in command and args over the container's env (not the runtime's PATH).
            argv = [expand(word, env) for word in [*(container.command or []), *(container.args or [])]]
            if not argv:
                raise ValueError("the container has no command: the node agent pulls no image to take one from")
            spec = {
                "hostname": pod.spec.hostname or pod.metadata.name,
                "hosts": str(self.root / "hosts"),
                "mounts": self.pod_mounts(container, sources),
                "workdir": container.working_dir or "/",
                "argv": argv,
                "env": {**self.runtime_env(pod), **env},
            }
            self.patch_running(pod, container, running.started)
            self.write_hosts()
            with open(log_path, "ab") as output:
                running.process = subprocess.Popen(
                    [
                        "unshare",
                        "--uts",
                        "--mount",
                        "--propagation",
                        "private",
                        "--",
                        sys.executable,
                        "-c",
                        POD_INIT,
                        json.dumps(spec),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=output,
                    start_new_session=True,
                )
        except (ValueError, KeyError, ApiException, OSError) as exc:
            log_path.write_text(f"k8s_node_agent: cannot start the container: {exc}\n")
            self.patch_terminated(running, 128, "StartError", str(exc))
            running.reported = True

    def pull_image(self, running: RunningPod) -> bool:
        """Whether the pod's image cannot be had (its container then never starts): its status says why, as the
        kubelet's does, ErrImagePull at each try, ImagePullBackOff between tries; InvalidImageName for good."""
        problem = self.image_problem(running.image)
        if problem is None:
            return False
        reason, message = problem
        if reason == "ErrImagePull":
            running.pull_failures += 1
            backoff = min(PULL_BACKOFF_S * 2 ** (running.pull_failures - 1), PULL_BACKOFF_MAX_S)
            running.next_pull_at = time.monotonic() + backoff
            running.backoff_at = time.monotonic() + 1.0  # the next pod sync says back-off
        log.info("pod %s/%s: %s: %s", running.namespace, running.name, reason, message)
        self.patch_waiting(running, reason, message)
        return True

    def retry_pull(self, running: RunningPod) -> None:
        """A pod whose image did not come: back-off, then another try (which fails again: the node's images do
        not change while it runs)."""
        clock = time.monotonic()
        if running.backoff_at is not None and clock >= running.backoff_at:
            running.backoff_at = None
            _, message = self.image_problem(running.image) or ("", "")
            self.patch_waiting(
                running, "ImagePullBackOff", f'Back-off pulling image "{running.image}": ErrImagePull: {message}'
            )
        elif running.next_pull_at is not None and clock >= running.next_pull_at:
            self.pull_image(running)

    def patch_waiting(self, running: RunningPod, reason: str, message: str) -> None:
        """A pod whose container waits (Pending, started on its node: startTime set, not ready)."""
        stamp = running.started.isoformat()
        unready = f"containers with unready status: [{running.container}]"
        conditions = [
            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": stamp},
            {"type": "Initialized", "status": "True", "lastTransitionTime": stamp},
            *(
                {
                    "type": kind,
                    "status": "False",
                    "reason": "ContainersNotReady",
                    "message": unready,
                    "lastTransitionTime": stamp,
                }
                for kind in ("ContainersReady", "Ready")
            ),
        ]
        try:
            self.core.patch_namespaced_pod_status(
                running.name,
                running.namespace,
                {
                    "status": {
                        "phase": "Pending",
                        "hostIP": self.address,
                        "hostIPs": [{"ip": self.address}],
                        "podIP": self.address,
                        "podIPs": [{"ip": self.address}],
                        "startTime": stamp,
                        "conditions": conditions,
                        "containerStatuses": [
                            {
                                "name": running.container,
                                "image": running.image,
                                "imageID": "",
                                "ready": False,
                                "started": False,
                                "restartCount": 0,
                                "state": {"waiting": {"reason": reason, "message": message}},
                            }
                        ],
                    }
                },
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def pod_inputs(
        self, pod: client.V1Pod, container: client.V1Container
    ) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        """The pod's environment and volumes. The apiserver's Node authorizer learns of a new binding a moment after
        the scheduler made it (its graph), so a 403 is retried for a while, as the kubelet does."""
        deadline = time.monotonic() + AUTHORIZER_LAG_S
        while True:
            try:
                return self.resolve_env(pod, container), self.volume_sources(pod)
            except ApiException as exc:
                if exc.status != 403 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def patch_running(self, pod: client.V1Pod, container: client.V1Container, started: datetime.datetime) -> None:
        stamp = started.isoformat()
        conditions = [
            {"type": kind, "status": "True", "lastTransitionTime": stamp}
            for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
        ]
        self.core.patch_namespaced_pod_status(
            pod.metadata.name,
            pod.metadata.namespace,
            {
                "status": {
                    "phase": "Running",
                    "hostIP": self.address,
                    "hostIPs": [{"ip": self.address}],
                    "podIP": self.address,
                    "podIPs": [{"ip": self.address}],
                    "startTime": stamp,
                    "conditions": conditions,
                    "containerStatuses": [
                        {
                            "name": container.name,
                            "image": container.image or "",
                            "imageID": "",
                            "ready": True,
                            "started": True,
                            "restartCount": 0,
                            "state": {"running": {"startedAt": stamp}},
                        }
                    ],
                }
            },
        )

    def patch_terminated(self, running: RunningPod, code: int, reason: str, message: str = "") -> None:
        stamp = now().isoformat()
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [
                {"type": kind, "status": "False", "reason": "PodCompleted", "lastTransitionTime": stamp}
                for kind in ("ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": running.container,
                    "image": "",
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": code,
                            "reason": reason,
                            "message": message,
                            "startedAt": running.started.isoformat(),
                            "finishedAt": stamp,
                        }
                    },
                }
            ],
        }
        try:
            self.core.patch_namespaced_pod_status(running.name, running.namespace, {"status": status})
        except ApiException as exc:
            if exc.status != 404:
                raise

    def reap(self) -> None:
        """Finished processes: their exit code into the pod's status; deleted pods removed once their process is
        gone (a SIGKILL once the grace period is over)."""
        for running in list(self.pods.values()):
            process = running.process
            code = None if process is None else process.poll()
            if process is not None and code is None:
                if running.kill_at is not None and time.monotonic() >= running.kill_at:
                    self.signal_group(process, signal.SIGKILL)
                continue
            if process is None and not running.deleting and running.next_pull_at is not None:
                self.retry_pull(running)
                continue
            if process is not None and not running.reported:
                # A container ends with its main process: what it left running goes too (the runtime kills the
                # container's processes; here, the process group the agent started).
                self.signal_group(process, signal.SIGKILL)
                reason = "Completed" if code == 0 else ("Error" if code > 0 else "Killed")
                self.patch_terminated(running, code if code >= 0 else 128 - code, reason)
                running.reported = True
            if running.deleting:
                # The kubelet's last word on a deleted pod: its containers are gone, so the object may go too.
                try:
                    # The grace period in the body: with a body, the apiserver reads the options from it alone.
                    self.core.delete_namespaced_pod(
                        running.name,
                        running.namespace,
                        body=client.V1DeleteOptions(
                            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=running.uid)
                        ),
                    )
                    log.info("pod %s/%s removed", running.namespace, running.name)
                except ApiException as exc:
                    if exc.status not in (404, 409):  # 409: the uid differs, a new pod of the same name
                        log.warning("removing pod %s/%s: %s", running.namespace, running.name, exc.reason)
                        continue
                del self.pods[running.uid]

    @staticmethod
    def signal_group(process: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass

    def on_pod(self, pod: client.V1Pod) -> None:
        uid = pod.metadata.uid
        with self.lock:
            running = self.pods.get(uid)
            if pod.metadata.deletion_timestamp is not None:
                if running is None:
                    running = RunningPod(
                        uid,
                        pod.metadata.namespace,
                        pod.metadata.name,
                        pod.spec.containers[0].name,
                        None,
                        Path("/dev/null"),
                        now(),
                    )
                    running.reported = True
                    self.pods[uid] = running
                if not running.deleting:
                    log.info("pod %s/%s deleted: stopping it", running.namespace, running.name)
                    running.deleting = True
                    grace = pod.metadata.deletion_grace_period_seconds or 0
                    running.kill_at = time.monotonic() + grace
                    if running.process is not None:
                        self.signal_group(running.process, signal.SIGTERM if grace else signal.SIGKILL)
                return
            if running is None and pod.status.phase in (None, "Pending"):
                self.start_pod(pod)

    def watch_pods(self) -> None:
        selector = f"spec.nodeName={self.node}"
        while not self.stopping.is_set():
            try:
                listed = self.core.list_pod_for_all_namespaces(field_selector=selector)
                for pod in listed.items:
                    self.on_pod(pod)
                for event in watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=60,
                ):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.on_pod(event["object"])
            except Exception as exc:  # noqa: BLE001 - a watch ends or fails; list again, as the kubelet does
                log.warning("pod watch: %s", exc)
                self.stopping.wait(1)

    def write_hosts(self) -> None:
        """The pods' /etc/hosts, as cluster DNS answers: every headless Service's endpoints by
        `hostname.service.namespace.svc.cluster.local` (from EndpointSlices, read with the DNS stand-in's own
        identity, as CoreDNS reads them), and this node's own pods' host names. Rewritten in place (the pods' bind
        mounts keep the file's inode)."""
        lines = ["127.0.0.1 localhost"]
        try:
            # Raw JSON: the client's model refuses a slice with no endpoints (a Service whose pods are gone).
            answer = self.discovery.list_endpoint_slice_for_all_namespaces(_preload_content=False)
            slices = json.loads(answer.data).get("items", [])
        except (ApiException, ValueError) as exc:
            log.warning("listing EndpointSlices: %s", exc)
            slices = []
        for endpoint_slice in slices:
            metadata = endpoint_slice.get("metadata", {})
            service = metadata.get("labels", {}).get("kubernetes.io/service-name")
            for endpoint in endpoint_slice.get("endpoints") or []:
                hostname, addresses = endpoint.get("hostname"), endpoint.get("addresses")
                if service and hostname and addresses:
                    fqdn = f"{hostname}.{service}.{metadata.get('namespace')}.svc"
                    lines.append(f"{addresses[0]} {fqdn}.cluster.local {fqdn} {hostname}.{service}")
                elif service and addresses:  # a headless Service's own name: its endpoint (the training operator's
                    fqdn = f"{service}.{metadata.get('namespace')}.svc"  # one Service per replica), as the pod's
                    lines.append(f"{addresses[0]} {fqdn}.cluster.local {fqdn} {service}")  # DNS search path finds it
        with self.lock:
            own = sorted({pod.hostname for pod in self.pods.values() if pod.hostname})
        lines += [f"{self.address} {hostname}" for hostname in own]
        with self.hosts_lock, open(self.root / "hosts", "a+") as handle:
            handle.seek(0)
            handle.truncate()
            handle.write("\n".join(lines) + "\n")

    def hosts_loop(self) -> None:
        while not self.stopping.is_set():
            self.write_hosts()
            self.stopping.wait(1.0)

    def reap_loop(self) -> None:
        while not self.stopping.is_set():
            with self.lock:
                try:
                    self.reap()
                except Exception as exc:  # noqa: BLE001 - the next round tries again
                    log.warning("reaping: %s", exc)
            self.stopping.wait(0.2)

    # -- logs ---------------------------------------------------------------------------------------------------
    def find_log(self, namespace: str, name: str) -> RunningPod | None:
        with self.lock:
            return next(
                (p for p in self.pods.values() if p.namespace == namespace and p.name == name), None
            ) or self.find_finished_log(namespace, name)

    def find_finished_log(self, namespace: str, name: str) -> RunningPod | None:
        try:
            pod = self.core.read_namespaced_pod(name, namespace)
        except ApiException:
            return None
        path = self.pod_dir(pod.metadata.uid) / f"{pod.spec.containers[0].name}.log"
        return (
            RunningPod(pod.metadata.uid, namespace, name, pod.spec.containers[0].name, None, path, now())
            if path.is_file()
            else None
        )


def log_handler(agent: Agent) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            log.info("logs: " + format, *args)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                self.send_error(404, "only /containerLogs/NAMESPACE/POD/CONTAINER is served by the node agent")
                return
            query = urllib.parse.parse_qs(url.query)
            pod = agent.find_log(parts[1], parts[2])
            if pod is None:
                self.send_error(404, f"no log for pod {parts[1]}/{parts[2]} on {agent.node}")
                return
            if pod.process is None and not pod.reported and agent.image_problem(pod.image) is not None:
                # The kubelet's answer for a container that never started (the apiserver passes it on).
                self.send_error(
                    400,
                    f'container "{pod.container}" in pod "{pod.name}" is waiting to start: '
                    "trying and failing to pull image",
                )
                return
            text = whole = pod.log_path.read_bytes() if pod.log_path.is_file() else b""
            if "tailLines" in query:
                count = int(query["tailLines"][0])
                lines = text.splitlines(keepends=True)
                text = b"".join(lines[-count:]) if count else b""
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(text)
            if query.get("follow", ["false"])[0] == "true":
                offset = len(whole)  # followed from what was sent: nothing twice, nothing left out
                # Until the container ends, then what it wrote last (the kubelet's stream, too, ends with the
                # container's last line: none is lost between the last read and its exit).
                while True:
                    running = pod.process is not None and pod.process.poll() is None
                    time.sleep(0.2 if running else 0)
                    with open(pod.log_path, "rb") as handle:
                        handle.seek(offset)
                        chunk = handle.read()
                    offset += len(chunk)
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    if not running:
                        break

    return Handler


def serve_logs(agent: Agent, cert: str, key: str, client_ca: str) -> None:
    server = http.server.ThreadingHTTPServer((agent.address, agent.port), log_handler(agent))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.load_verify_locations(client_ca)
    context.verify_mode = ssl.CERT_REQUIRED  # only the apiserver (its kubelet-client certificate) reads logs
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True, name="logs").start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="kubelet stand-in: one Node of the test cluster")
    for name in (
        "--kubeconfig",
        "--dns-kubeconfig",
        "--node",
        "--address",
        "--tls-cert",
        "--tls-key",
        "--client-ca",
        "--root",
    ):
        parser.add_argument(name, required=True)
    parser.add_argument("--port", type=int, default=10250)
    parser.add_argument("--cpu", default="8")
    parser.add_argument("--memory", default="16Gi")
    parser.add_argument("--gpus", type=int, default=0, help=f"{GPU} capacity (no device behind it)")
    parser.add_argument("--efa", type=int, default=0, help=f"{EFA} capacity (no device behind it)")
    parser.add_argument(
        "--images",
        action="append",
        default=None,
        metavar="PATTERN",
        help="an image this node can pull (fnmatch pattern; repeatable; default: every image)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    api = config.new_client_from_config(config_file=args.kubeconfig)
    agent = Agent(
        node=args.node,
        address=args.address,
        port=args.port,
        root=Path(args.root),
        cpu=args.cpu,
        memory=args.memory,
        core=client.CoreV1Api(api),
        coordination=client.CoordinationV1Api(api),
        discovery=client.DiscoveryV1Api(config.new_client_from_config(config_file=args.dns_kubeconfig)),
        gpus=args.gpus,
        efa=args.efa,
        images=tuple(args.images or ("*",)),
    )
    agent.root.mkdir(parents=True, exist_ok=True)
    agent.write_hosts()
    serve_logs(agent, args.tls_cert, args.tls_key, args.client_ca)
    agent.register()
    for target in (agent.heartbeat_loop, agent.reap_loop, agent.hosts_loop):
        threading.Thread(target=target, daemon=True, name=target.__name__).start()
    signal.signal(signal.SIGTERM, lambda *_: agent.stopping.set())
    log.info("node %s ready at %s:%d", args.node, args.address, args.port)
    agent.watch_pods()
    return 0


if __name__ == "__main__":
    sys.exit(main())
