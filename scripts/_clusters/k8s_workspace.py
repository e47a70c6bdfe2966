"""`scripts/k8s-cluster workspace FOLDER`: the workspace a pipeline needs on the test cluster, and how to name it.

A pipeline on Kubernetes mounts its workspace from a PersistentVolumeClaim (`backends.kubernetes.workspace_claim`)
that every pod of a stage can mount at once (ReadWriteMany), as FSx for Lustre or a Filestore share would be at a
real site. The test cluster has no storage provisioner, so this makes the volume by hand: a hostPath
PersistentVolume on FOLDER (the node agents run pods as processes of this machine, so every node sees it) and a
claim bound to it by name. It prints the `--set` options that point a run at this cluster: the kubeconfig, the
namespace, the claim, the Python the pods run (no container runtime here: a pod's `python3` would be the host's,
without this project's packages) and the stages folder (no image carries it here).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .common import ClusterError, say
from .k8s_daemons import admin_context, agent_python
from .k8s_layout import Layout

REPO = Path(__file__).resolve().parents[2]


def api_call(lay: Layout, method: str, path: str, body: dict | None = None) -> tuple[int, Any]:
    """One call to the apiserver as the cluster's admin: (HTTP status, the JSON answer)."""
    request = urllib.request.Request(
        f"https://{lay.api_address}:{lay.saved_port()}{path}",
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, context=admin_context(lay), timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except OSError as exc:
        raise ClusterError(f"the apiserver does not answer ({exc}): `scripts/k8s-cluster start` first") from None


def create(lay: Layout, path: str, body: dict) -> None:
    """Create the object; one that exists already is kept (a second `workspace` of the same name is a no-op)."""
    status, answer = api_call(lay, "POST", path, body)
    if status not in (200, 201, 409):
        raise ClusterError(f"creating {body['kind']} {body['metadata']['name']}: {answer.get('message', answer)}")


def make_workspace(lay: Layout, folder: Path, name: str, namespace: str, size: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    status, volume = api_call(lay, "GET", f"/api/v1/persistentvolumes/{name}")
    if status == 200 and volume["spec"].get("hostPath", {}).get("path") != str(folder):
        raise ClusterError(
            f"volume {name} exists on {volume['spec'].get('hostPath', {}).get('path')}, not "
            f"{folder}: choose another --name, or remove it"
        )
    create(lay, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    create(
        lay,
        "/api/v1/persistentvolumes",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": ["ReadWriteMany"],
                "hostPath": {"path": str(folder)},
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
            },
        },
    )
    create(
        lay,
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": size}},
                "storageClassName": "",
                "volumeName": name,
            },
        },
    )
    deadline = time.monotonic() + 60
    while True:
        status, claim = api_call(lay, "GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}")
        phase = claim.get("status", {}).get("phase") if status == 200 else None
        if phase == "Bound":
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"claim {namespace}/{name} is {phase or 'missing'} after 60 s, not Bound: is the "
                "controller-manager running (`scripts/k8s-cluster status`)?"
            )
        time.sleep(0.3)


def set_options(lay: Layout, name: str, namespace: str) -> list[str]:
    """The `--set` options that run a pipeline on this cluster, with this claim."""
    options = {
        "kubeconfig": str(lay.kubeconfig),
        "namespace": namespace,
        "workspace_claim": name,
        "python": agent_python(),
        "code_dir": str(REPO / "stages"),
    }
    return [f"--set backends.kubernetes.{key}={value}" for key, value in options.items()]


def cmd_workspace(args: Any) -> None:
    lay = Layout.load(args.base)
    folder = args.folder.resolve()
    make_workspace(lay, folder, args.name, args.namespace, args.size)
    say(
        f"claim {args.namespace}/{args.name} is Bound to {folder} (ReadWriteMany, every node); run a pipeline "
        "with the options below (`run ... --backend kubernetes $(scripts/k8s-cluster workspace FOLDER)`):"
    )
    print(" ".join(set_options(lay, args.name, args.namespace)))
    sys.stdout.flush()
