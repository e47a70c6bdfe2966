"""`check --backend kubernetes`'s probe: an Indexed Job of two pods shaped as the pipeline's first stage job (its
image, workspace claim and mount, node selector, tolerations, resources, service account), running a short script
instead of the stage program. It shows:

- each pod's completion index, the RANK the stage launcher would give it, and its node;
- the workspace mount seen from both pods: index 0 writes a marker, index 1 must read it;
- kill timing: once both pods wait, the Job is deleted as `cancel` deletes (foreground propagation), and the time
  until no pod of it is left is measured; a pod that traps SIGTERM says so in its log.

The Job and its headless Service are deleted however the check ends (backends/checks.py always_cleaned_up).
"""

from __future__ import annotations

import copy
import re
import secrets
import time
from typing import Any

from bcp_pipeline.backends.checks import CheckInput, Row, always_cleaned_up, different, ok, poll_until, unchecked
from bcp_pipeline.backends.kubernetes.client import api_error, create_object
from bcp_pipeline.backends.kubernetes.render import CONTAINER, LABEL_JOB, LABEL_KIND, MANAGED_BY
from bcp_pipeline.backends.shared import templates
from bcp_pipeline.config.resources import KubernetesOptions
from bcp_pipeline.errors import BackendCallError

PODS = 2
START_SECONDS = 120.0  # for both pods to print their lines (scheduled, started)
KILL_OK_SECONDS = 30.0  # the default grace period: a pod still there after it was killed, not stopped
GONE_SECONDS = 90.0
PROBE_SCRIPT = templates.load(__package__, "probe.sh")  # $1 the marker's path, $2 the marker (probe.sh)
POD_LINE = re.compile(r"^BCPP-POD (.*)$", re.M)


def ranks_assumption() -> str:
    return f"an Indexed Job of {PODS} pods gets completion indexes 0..{PODS - 1}, one RANK each, on the cluster's nodes"


def mount_assumption(mount: str) -> str:
    return f"the workspace claim is mounted at {mount} in every pod, the same files in each (ReadWriteMany)"


def kill_assumption() -> str:
    return f"deleting a Job (foreground, as `cancel` does) ends its pods within {KILL_OK_SECONDS:.0f} s"


def probe_rows(ctx: CheckInput, api: Any, options: KubernetesOptions) -> tuple[list[Row], dict]:
    """The probe's three rows (unchecked where no probe could run) and its facts."""
    mount = ctx.pipeline.workspace.mount.rstrip("/") if ctx.pipeline is not None else "the workspace mount"
    job = next(
        (
            obj
            for s in ctx.submissions()
            if s.request.kind == "stage"
            for obj in s.payload["manifests"]
            if obj["kind"] == "Job"
        ),
        None,
    )
    why = (
        "--no-jobs: no probe job submitted"
        if not ctx.jobs
        else "no pipeline named, or none of its stages is a batch/v1 Job: nothing to shape a probe on"
        if job is None
        else None
    )
    if why is not None:
        return [
            unchecked("probe ranks", ranks_assumption(), why),
            unchecked("probe mount", mount_assumption(mount), why),
            unchecked("kill timing", kill_assumption(), why),
        ], {}
    token = f"bcpp-check-{secrets.token_hex(4)}"
    marker = f"{mount}/.{token}"
    objects = probe_manifests(job, token, marker)
    ctx.announce(
        f"probe job: {PODS} pods of {token} in namespace {options.namespace} for a few seconds "
        "(deleted when check ends)"
    )
    probe = Probe(api, options.namespace, token)
    with always_cleaned_up(probe.delete):
        try:
            for obj in objects:
                create_object(api, obj)
            lines = probe.wait_for_lines()
            killed = probe.kill_and_time() if lines is not None else None
        except BackendCallError as exc:
            why = str(exc).split("; the Kubernetes API answers")[0]
            return [
                different("probe ranks", ranks_assumption(), why, "the probe could not run: see the row's words"),
                unchecked("probe mount", mount_assumption(mount), why),
                unchecked("kill timing", kill_assumption(), why),
            ], {}
    if lines is None:
        why = f"both pods had not printed their lines after {START_SECONDS:.0f} s: {probe.stuck()}"
        return [
            different(
                "probe ranks",
                ranks_assumption(),
                why,
                f"are the nodes full, or the image not pulled? `kubectl -n {options.namespace} describe pod`",
            ),
            unchecked("probe mount", mount_assumption(mount), why),
            unchecked("kill timing", kill_assumption(), why),
        ], {}
    pods = [dict(part.split("=", 1) for part in line.split() if "=" in part) for line in lines]
    rows = [ranks_row(pods), mount_row(pods, mount, token), kill_row(killed)]
    return rows, {"probe_pods": pods, "kill_seconds": killed[0] if killed else None}


def probe_manifests(job: dict[str, Any], token: str, marker: str) -> list[dict[str, Any]]:
    """The stage's Job made a probe: its name and labels the probe's own, PODS pods, the probe script for a
    command, no secret in its environment (the probe reads none)."""
    job = copy.deepcopy(job)
    labels = {"app.kubernetes.io/managed-by": MANAGED_BY, LABEL_KIND: "probe", LABEL_JOB: token}
    namespace = job["metadata"]["namespace"]
    job["metadata"] = {"name": token, "namespace": namespace, "labels": labels}
    spec = job["spec"]
    spec.update(completions=PODS, parallelism=PODS, backoffLimit=0, activeDeadlineSeconds=600)
    for key in ("backoffLimitPerIndex", "maxFailedIndexes"):  # the stage's retries: no probe's (nor fit PODS)
        spec.pop(key, None)
    # Outside the stage's Kueue queue (its label is not copied above): the probe asks of pods, the mount and a
    # delete, not of admission (the `kueue queue` row checks the queue), and waits for no quota.
    spec.pop("suspend", None)
    spec["template"]["metadata"] = {"labels": labels}
    pod = spec["template"]["spec"]
    pod["subdomain"] = token
    pod["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {LABEL_JOB: token}},
        }
    ]
    container = next(c for c in pod["containers"] if c["name"] == CONTAINER)
    container["command"] = ["bash", "-c", PROBE_SCRIPT, "bcpp-probe", marker, token]
    container["args"] = []
    container["env"] = [e for e in container["env"] if "secretKeyRef" not in e.get("valueFrom", {})] + [
        {"name": "BCPP_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    ]
    for mount in container.get("volumeMounts", []):
        mount["readOnly"] = False  # index 0 writes the marker
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": token, "namespace": namespace, "labels": labels},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {LABEL_JOB: token}},
    }
    return [service, job]


class Probe:
    """The probe Job on the cluster: its pods' lines, its deletion timed, and its removal."""

    def __init__(self, api: Any, namespace: str, name: str) -> None:
        from kubernetes import client

        self.core, self.batch = client.CoreV1Api(api), client.BatchV1Api(api)
        self.namespace, self.name = namespace, name

    def pods(self) -> list[Any]:
        try:
            return self.core.list_namespaced_pod(self.namespace, label_selector=f"{LABEL_JOB}={self.name}").items
        except Exception as exc:  # noqa: BLE001
            raise api_error("list probe pods", exc) from None

    def log(self, pod: Any) -> str:
        try:
            return self.core.read_namespaced_pod_log(pod.metadata.name, self.namespace) or ""
        except Exception:  # noqa: BLE001 - not started yet: no log
            return ""

    def wait_for_lines(self) -> list[str] | None:
        """Each pod's BCPP-POD line once every pod waits (printed BCPP-WAITING); None at the timeout."""

        def ask() -> list[str] | None:
            logs = [self.log(pod) for pod in self.pods() if pod.status.phase == "Running"]
            if len(logs) == PODS and all("BCPP-WAITING" in text for text in logs):
                return [POD_LINE.search(text).group(1) for text in logs if POD_LINE.search(text)]
            return None

        return poll_until(ask, START_SECONDS, first_delay=0.5, max_delay=0.5)

    def stuck(self) -> str:
        pods = self.pods()
        return "; ".join(f"{p.metadata.name}: {p.status.phase}" for p in pods) or "no pod was created"

    def kill_and_time(self) -> tuple[float, bool] | None:
        """(seconds until no pod of the Job is left after a foreground delete, whether a pod said BCPP-TERM);
        None when pods were still there after GONE_SECONDS."""
        started = time.monotonic()
        try:
            self.batch.delete_namespaced_job(self.name, self.namespace, propagation_policy="Foreground")
        except Exception as exc:  # noqa: BLE001
            raise api_error("delete probe job", exc) from None
        termed = False

        def gone() -> tuple[float, bool] | None:
            nonlocal termed
            left = self.pods()
            for pod in left:  # a log read while the pod still exists
                termed = termed or "BCPP-TERM" in self.log(pod)
            return None if left else (time.monotonic() - started, termed)

        return poll_until(gone, GONE_SECONDS, max_delay=0.2)

    def delete(self) -> None:
        """The Job and the Service, whatever is left of them (a 404 is fine)."""
        for delete in (self.batch.delete_namespaced_job, self.core.delete_namespaced_service):
            try:
                delete(self.name, self.namespace, propagation_policy="Background")
            except Exception:  # noqa: BLE001 - gone already, or the API is down: nothing more to do here
                pass


def ranks_row(pods: list[dict[str, str]]) -> Row:
    shown = "; ".join(
        f"index {p.get('index')}: RANK {p.get('rank')} on {p.get('node')} (host {p.get('host')})"
        for p in sorted(pods, key=lambda p: p.get("index", ""))
    )
    nodes = {p.get("node") for p in pods}
    if sorted(p.get("index") for p in pods) != [str(i) for i in range(PODS)]:
        return different(
            "probe ranks",
            ranks_assumption(),
            shown,
            "the pods' completion indexes are wrong: is the cluster older than Kubernetes 1.24 (Indexed Jobs)?",
        )
    note = "" if len(nodes) == PODS else f" (all on one node: {', '.join(sorted(map(str, nodes)))})"
    return ok("probe ranks", ranks_assumption(), shown + note)


def mount_row(pods: list[dict[str, str]], mount: str, token: str) -> Row:
    seen = sorted(p.get("index", "?") for p in pods if p.get("marker") == token)
    shown = f"the marker index 0 wrote at {mount} is seen by index(es) {', '.join(seen) or 'none'}"
    if len(seen) == PODS:
        return ok("probe mount", mount_assumption(mount), shown)
    return different(
        "probe mount",
        mount_assumption(mount),
        shown,
        "the pods do not share the workspace: use a "
        "ReadWriteMany claim (FSx for Lustre, EFS, NFS) as backends.kubernetes.workspace_claim",
    )


def kill_row(killed: tuple[float, bool] | None) -> Row:
    if killed is None:
        return different(
            "kill timing",
            kill_assumption(),
            f"pods still there {GONE_SECONDS:.0f} s after the delete",
            "a cancelled stage's processes may keep running: look for stuck nodes or finalizers",
        )
    seconds, termed = killed
    shown = f"the pods were gone {seconds:.1f} s after the delete" + (
        " (a pod saw SIGTERM and exited)" if termed else ""
    )
    if seconds > KILL_OK_SECONDS:
        return different(
            "kill timing", kill_assumption(), shown, "cancel and resume wait that long for a stage's pods to end"
        )
    return ok("kill timing", kill_assumption(), shown)
