"""A STAND-IN for the kubelet, for the test cluster of scripts/k8s-cluster (no container runtime or images exist
on the test machine, so no real kubelet can run there). One agent is one Node:

- it registers the Node (its address, CPU, memory and pod capacity, its log port), removes the
  `node.kubernetes.io/not-ready` taint the apiserver puts on a new Node, keeps its Lease in kube-node-lease
  renewed and its Ready condition fresh, so the real controller-manager and scheduler treat it as a node;
- it runs each pod bound to it (by the real scheduler) as a process: the first container's `command` + `args`
  (no image is pulled: the command runs on this machine, with the machine's PATH under the pod's `env`), with
  `env` values, `fieldRef`s (e.g. the completion index annotation of an Indexed Job's pod) and `secretKeyRef`s
  resolved; Secret volumes written as files (0600) and PersistentVolumeClaims bound to a `hostPath` or `local`
  PersistentVolume bind-mounted at their `mountPath`, in a private mount namespace of the pod; the pod's host name
  set in a UTS namespace and resolvable, with every pod's `hostname.subdomain` (a headless Service's DNS names,
  as cluster DNS would give them) and a headless Service's own name (its endpoint: the training operator's
  per-replica Services), through a hosts file bind-mounted over /etc/hosts;
- it patches the pod's status (Running, then Succeeded/Failed with the container's exit code or signal), kills
  the process group on deletion (SIGTERM, SIGKILL after the grace period) and then removes the pod;
- it serves `/containerLogs/NAMESPACE/POD/CONTAINER` (tailLines, follow) over TLS on the node's address, so
  `kubectl logs` / `pods/log` work through the real apiserver.

Pods share the node's network namespace (as with hostNetwork): a pod's IP is its node's address. Only
`restartPolicy: Never` is honoured (a failed container is never restarted here). The agent runs as the node's own
identity (a client certificate of `system:node:NAME` in `system:nodes`), so the apiserver's Node authorizer decides
what it may touch, as for a real kubelet.

    python tests/fakes/k8s_node_agent.py --kubeconfig NODE.kubeconfig --node node1 --address 198.18.x.11 \
        --port 10250 --tls-cert node1.crt --tls-key node1.key --client-ca ca.crt --root DIR
"""

from __future__ import annotations

import argparse
import base64
import datetime
import http.server
import json
import logging
import os
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
# Runs first in the pod's new UTS + mount namespaces: host name, /etc/hosts, the volumes, then the command.
POD_INIT = """
import json, os, socket, subprocess, sys
spec = json.loads(sys.argv[1])
socket.sethostname(spec["hostname"])
subprocess.run(["mount", "--bind", spec["hosts"], "/etc/hosts"], check=True)
for source, target, read_only in spec["mounts"]:
    os.makedirs(target, exist_ok=True)
    subprocess.run(["mount", "--bind", source, target], check=True)
    if read_only:
        subprocess.run(["mount", "-o", "remount,bind,ro", target], check=True)
os.chdir(spec["workdir"])
os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
"""

log = logging.getLogger("k8s-node-agent")


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
    pods: dict[str, RunningPod] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)  # write_hosts takes it inside on_pod
    hosts_lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)

    # -- the Node, its Lease and its Ready condition ---------------------------------------------------------
    def ready_condition(self) -> dict[str, Any]:
        stamp = now().isoformat()
        return {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp, "message": "k8s_node_agent (kubelet stand-in) is posting ready status"}

    def register(self) -> None:
        capacity = {"cpu": self.cpu, "memory": self.memory, "pods": "110"}
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.node, "labels": {"kubernetes.io/hostname": self.node,
                                                            "kubernetes.io/os": "linux"}},
                "status": {"capacity": capacity, "allocatable": capacity,
                           "addresses": [{"type": "InternalIP", "address": self.address},
                                         {"type": "Hostname", "address": self.node}],
                           "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
                           "nodeInfo": {"kubeletVersion": "v0.0.0-k8s-node-agent", "operatingSystem": "linux",
                                        "architecture": "amd64", "containerRuntimeVersion": "none://stand-in",
                                        "kernelVersion": os.uname().release, "osImage": "k8s_node_agent",
                                        "kubeProxyVersion": "", "machineID": "", "systemUUID": "",
                                        "bootID": str(time.time_ns())},
                           "conditions": [self.ready_condition()]}}
        try:
            self.core.create_node(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
        self.refresh_status()
        self.remove_not_ready_taint()

    def refresh_status(self) -> None:
        self.core.patch_node_status(self.node, {"status": {"conditions": [self.ready_condition()]}})

    def remove_not_ready_taint(self) -> None:
        node = self.core.read_node(self.node)
        taints = node.spec.taints or []
        kept = [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints if t.key != NOT_READY_TAINT]
        if len(kept) != len(taints):
            self.core.patch_node(self.node, {"spec": {"taints": kept}})

    def renew_lease(self) -> None:
        body = {"metadata": {"name": self.node, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": self.node, "leaseDurationSeconds": 40,
                         "renewTime": now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}
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
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOSTNAME": pod.spec.hostname or pod.metadata.name}
        for var in container.env or []:
            if var.value_from is None:
                env[var.name] = var.value or ""
            elif var.value_from.field_ref is not None:
                env[var.name] = self.field_value(pod, var.value_from.field_ref.field_path)
            elif var.value_from.secret_key_ref is not None:
                ref = var.value_from.secret_key_ref
                secret = self.core.read_namespaced_secret(ref.name, pod.metadata.namespace)
                env[var.name] = base64.b64decode((secret.data or {})[ref.key]).decode()
        return env

    def field_value(self, pod: client.V1Pod, path: str) -> str:
        simple = {"metadata.name": pod.metadata.name, "metadata.namespace": pod.metadata.namespace,
                  "metadata.uid": pod.metadata.uid, "spec.nodeName": self.node, "status.podIP": self.address,
                  "status.hostIP": self.address, "spec.serviceAccountName": pod.spec.service_account_name or ""}
        if path in simple:
            return simple[path]
        for prefix, values in (("metadata.annotations", pod.metadata.annotations),
                               ("metadata.labels", pod.metadata.labels)):
            if path.startswith(prefix + "['") and path.endswith("']"):
                return (values or {}).get(path[len(prefix) + 2:-2], "")
        raise ValueError(f"fieldRef {path!r} is not supported by the node agent stand-in")

    def volume_sources(self, pod: client.V1Pod) -> dict[str, str]:
        """Each volume of the pod as a folder on this machine: a Secret's keys as files, a PVC's bound PV."""
        sources: dict[str, str] = {}
        for volume in pod.spec.volumes or []:
            if volume.secret is not None:
                folder = self.pod_dir(pod.metadata.uid) / "volumes" / volume.name
                folder.mkdir(parents=True, exist_ok=True, mode=0o700)
                secret = self.core.read_namespaced_secret(volume.secret.secret_name, pod.metadata.namespace)
                for key, value in (secret.data or {}).items():
                    path = folder / key
                    path.write_bytes(base64.b64decode(value))
                    path.chmod(0o600)
                sources[volume.name] = str(folder)
            elif volume.persistent_volume_claim is not None:
                claim = self.core.read_namespaced_persistent_volume_claim(
                    volume.persistent_volume_claim.claim_name, pod.metadata.namespace)
                if not claim.spec.volume_name:
                    raise ValueError(f"PVC {claim.metadata.name} is not bound to a PersistentVolume")
                pv = self.core.read_persistent_volume(claim.spec.volume_name)
                local = pv.spec.host_path or pv.spec.local
                if local is None:
                    raise ValueError(f"PV {pv.metadata.name} is neither hostPath nor local")
                Path(local.path).mkdir(parents=True, exist_ok=True)
                sources[volume.name] = local.path
            elif volume.empty_dir is not None:
                folder = self.pod_dir(pod.metadata.uid) / "volumes" / volume.name
                folder.mkdir(parents=True, exist_ok=True)
                sources[volume.name] = str(folder)
            # Projected service-account tokens and others are not provided: the manifests set
            # automountServiceAccountToken: false, and stage programs never call the API.
        return sources

    def start_pod(self, pod: client.V1Pod) -> None:
        """Run the pod's first container. Its status says Running (with the pod's IP) and the hosts file names it
        before the process starts, so the process resolves its own host name at once (gloo binds to it)."""
        uid, container = pod.metadata.uid, pod.spec.containers[0]
        folder = self.pod_dir(uid)
        folder.mkdir(parents=True, exist_ok=True)
        log_path = folder / f"{container.name}.log"
        running = RunningPod(uid, pod.metadata.namespace, pod.metadata.name, container.name, None, log_path, now(),
                             hostname=pod.spec.hostname or pod.metadata.name)
        self.pods[uid] = running
        try:
            env, sources = self.pod_inputs(pod, container)
            mounts = [(sources[m.name], m.mount_path, bool(m.read_only))
                      for m in container.volume_mounts or [] if m.name in sources]
            argv = [*(container.command or []), *(container.args or [])]
            if not argv:
                raise ValueError("the container has no command: the node agent pulls no image to take one from")
            spec = {"hostname": pod.spec.hostname or pod.metadata.name, "hosts": str(self.root / "hosts"),
                    "mounts": mounts, "workdir": container.working_dir or "/", "argv": argv, "env": env}
            self.patch_running(pod, container, running.started)
            self.write_hosts()
            with open(log_path, "ab") as output:
                running.process = subprocess.Popen(
                    ["unshare", "--uts", "--mount", "--propagation", "private", "--", sys.executable, "-c", POD_INIT,
                     json.dumps(spec)], stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                    start_new_session=True)
        except (ValueError, KeyError, ApiException, OSError) as exc:
            log_path.write_text(f"k8s_node_agent: cannot start the container: {exc}\n")
            self.patch_terminated(running, 128, "StartError", str(exc))
            running.reported = True

    def pod_inputs(self, pod: client.V1Pod, container: client.V1Container) -> tuple[dict[str, str], dict[str, str]]:
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
        conditions = [{"type": kind, "status": "True", "lastTransitionTime": stamp}
                      for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")]
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": {
            "phase": "Running", "hostIP": self.address, "hostIPs": [{"ip": self.address}], "podIP": self.address,
            "podIPs": [{"ip": self.address}], "startTime": stamp, "conditions": conditions,
            "containerStatuses": [{"name": container.name, "image": container.image or "", "imageID": "",
                                   "ready": True, "started": True, "restartCount": 0,
                                   "state": {"running": {"startedAt": stamp}}}]}})

    def patch_terminated(self, running: RunningPod, code: int, reason: str, message: str = "") -> None:
        stamp = now().isoformat()
        status = {"phase": "Succeeded" if code == 0 else "Failed", "conditions": [
            {"type": kind, "status": "False", "reason": "PodCompleted", "lastTransitionTime": stamp}
            for kind in ("ContainersReady", "Ready")],
            "containerStatuses": [{"name": running.container, "image": "", "imageID": "", "ready": False,
                                   "started": False, "restartCount": 0, "state": {"terminated": {
                                       "exitCode": code, "reason": reason, "message": message,
                                       "startedAt": running.started.isoformat(), "finishedAt": stamp}}}]}
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
            if process is not None and not running.reported:
                reason = "Completed" if code == 0 else ("Error" if code > 0 else "Killed")
                self.patch_terminated(running, code if code >= 0 else 128 - code, reason)
                running.reported = True
            if running.deleting:
                # The kubelet's last word on a deleted pod: its containers are gone, so the object may go too.
                try:
                    # The grace period in the body: with a body, the apiserver reads the options from it alone.
                    self.core.delete_namespaced_pod(running.name, running.namespace, body=client.V1DeleteOptions(
                        grace_period_seconds=0, preconditions=client.V1Preconditions(uid=running.uid)))
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
                    running = RunningPod(uid, pod.metadata.namespace, pod.metadata.name,
                                         pod.spec.containers[0].name, None, Path("/dev/null"), now())
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
                for event in watch.Watch().stream(self.core.list_pod_for_all_namespaces, field_selector=selector,
                                                  resource_version=listed.metadata.resource_version,
                                                  timeout_seconds=60):
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
            return next((p for p in self.pods.values() if p.namespace == namespace and p.name == name), None) or \
                self.find_finished_log(namespace, name)

    def find_finished_log(self, namespace: str, name: str) -> RunningPod | None:
        try:
            pod = self.core.read_namespaced_pod(name, namespace)
        except ApiException:
            return None
        path = self.pod_dir(pod.metadata.uid) / f"{pod.spec.containers[0].name}.log"
        return RunningPod(pod.metadata.uid, namespace, name, pod.spec.containers[0].name, None, path, now()) \
            if path.is_file() else None


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
    for name in ("--kubeconfig", "--dns-kubeconfig", "--node", "--address", "--tls-cert", "--tls-key", "--client-ca",
                 "--root"):
        parser.add_argument(name, required=True)
    parser.add_argument("--port", type=int, default=10250)
    parser.add_argument("--cpu", default="8")
    parser.add_argument("--memory", default="16Gi")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    api = config.new_client_from_config(config_file=args.kubeconfig)
    agent = Agent(node=args.node, address=args.address, port=args.port, root=Path(args.root), cpu=args.cpu,
                  memory=args.memory, core=client.CoreV1Api(api), coordination=client.CoordinationV1Api(api),
                  discovery=client.DiscoveryV1Api(config.new_client_from_config(config_file=args.dns_kubeconfig)))
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
