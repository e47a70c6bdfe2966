"""Kueue, the gang admission a stage's job may go through (`kubernetes.queue`; docs/backends/kubernetes.md, "Gang
admission through Kueue"): its label, the check of a queue's name, and what a suspended job waits for, read from the
Workload Kueue made of it."""

from __future__ import annotations

import re
from typing import Any

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.kubernetes.client import api_error
from bcp_pipeline.config.resources import KubernetesResources
from bcp_pipeline.errors import SubmissionError

# Kueue's label naming the LocalQueue a job waits in (kubernetes.queue); on the job only, never on its pods (Kueue's
# pod integration would take a labelled pod for a plain pod of its own).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
KUEUE_VERSIONS = ("v1beta2", "v1beta1")  # Kueue's Workload API: v1beta2 from Kueue 0.15 on, v1beta1 before


def check_queue(request: JobRequest) -> None:
    """A Kueue queue is named by `kubernetes.queue` (a LocalQueue's name: a DNS label), which also creates the job
    suspended; the queue-name label given through `labels` would leave the job unsuspended where Kueue's webhook is
    not installed, its pods started before any admission, so it is refused with the key to use instead."""
    res: KubernetesResources = request.resources("kubernetes")
    if QUEUE_LABEL in res.labels:
        raise SubmissionError(
            f"{request.label}: kubernetes.labels sets {QUEUE_LABEL}: name the Kueue LocalQueue with "
            f"kubernetes.queue: {res.labels[QUEUE_LABEL]} instead (it also creates the job suspended "
            "until Kueue admits it)"
        )
    if res.queue is not None and not (len(res.queue) <= 63 and DNS_LABEL.match(res.queue)):
        raise SubmissionError(
            f"{request.label}: kubernetes.queue {res.queue!r} is not a Kueue LocalQueue name (a DNS "
            "label: at most 63 of a-z, 0-9 and -, starting and ending alphanumeric)"
        )


def kueue_wait(queue: str | None, suspended: bool, workload_message: str | None = None) -> tuple[str, str] | None:
    """PENDING/KUEUE and its reason where a job in a Kueue `queue` is `suspended` (not admitted, or admitted and
    then evicted); None elsewhere. `workload_message`: Kueue's own reason, from its Workload's conditions."""
    if not (queue and suspended):
        return None
    reason = f"waiting for Kueue admission in queue {queue}"
    return "PENDING/KUEUE", f"{reason}: {workload_message}" if workload_message else reason


def workload_message(workload: dict[str, Any]) -> str | None:
    """What Kueue says of a Workload it has not admitted: its QuotaReserved condition's message when False ("couldn't
    assign flavors to pod set main: insufficient unused quota for cpu in flavor default, 2 more needed"; "LocalQueue
    q doesn't exist"), or an Evicted condition's when True; None when it says nothing (yet)."""
    conditions = {c.get("type"): c for c in workload.get("status", {}).get("conditions", [])}
    evicted = conditions.get("Evicted")
    if evicted and evicted.get("status") == "True" and evicted.get("message"):
        return f"evicted: {evicted['message']}"
    reserved = conditions.get("QuotaReserved")
    if reserved and reserved.get("status") == "False" and reserved.get("message"):
        return reserved["message"]
    return None


def workload_messages(api: Any, namespace: str, owners: set[str]) -> dict[str, str]:
    """Kueue's reason for each job of `owners` (suspended in a queue) that it has not admitted, from the
    Workload it made for it (owned by the job): one list of the namespace's Workloads a poll, and only while
    a job waits. Best effort: a cluster without Kueue's API (404) or an identity that may not read Workloads
    (403) only leaves the reason at the queue's name."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    if not owners:
        return {}
    for version in KUEUE_VERSIONS:
        try:
            workloads = client.CustomObjectsApi(api).list_namespaced_custom_object(
                "kueue.x-k8s.io", version, namespace, "workloads"
            )["items"]
        except ApiException as exc:
            if exc.status == 404:
                continue
            if exc.status == 403:
                return {}
            raise api_error("list workloads", exc) from None
        except Exception as exc:  # noqa: BLE001
            raise api_error("list workloads", exc) from None
        return {
            owner["name"]: message
            for workload in workloads
            for owner in workload["metadata"].get("ownerReferences", [])
            if owner.get("name") in owners and (message := workload_message(workload))
        }
    return {}


def suspended_in_a_queue(jobs: list[Any], pytorchjobs: list[dict[str, Any]]) -> set[str]:
    """The names of the jobs (batch/v1 Job objects, PyTorchJob dicts) that wait suspended in a Kueue queue."""
    return {job.metadata.name for job in jobs if job.spec.suspend and QUEUE_LABEL in (job.metadata.labels or {})} | {
        obj["metadata"]["name"]
        for obj in pytorchjobs
        if obj["spec"].get("runPolicy", {}).get("suspend") and QUEUE_LABEL in obj["metadata"].get("labels", {})
    }
