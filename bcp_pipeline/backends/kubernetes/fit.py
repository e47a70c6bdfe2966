"""Whether each stage's pods fit a node: every pod template's requests (cpu, memory, nvidia.com/gpu, EFA) against
the allocatable of the nodes its nodeSelector matches, read from the cluster's nodes (`check`'s "fits a node" rows).
A pod that fits no node stays Pending for ever, so this is said before a run rather than after a queue wait.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from bcp_pipeline.backends.checks import CheckInput, Row, different, ok, unchecked
from bcp_pipeline.backends.kubernetes.client import api_error


def pod_specs(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod specs a rendered manifest creates: a Job's template, or each PyTorchJob replica spec's."""
    spec = manifest.get("spec") or {}
    if "template" in spec:
        return [spec["template"]["spec"]]
    return [r["template"]["spec"] for r in (spec.get("pytorchReplicaSpecs") or {}).values()]


def pod_requests(pod: dict[str, Any]) -> dict[str, Decimal]:
    """The pod's summed container requests, as the scheduler adds them (init containers aside)."""
    from kubernetes.utils.quantity import parse_quantity

    total: dict[str, Decimal] = {}
    for container in pod.get("containers") or []:
        for name, amount in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] = total.get(name, Decimal(0)) + parse_quantity(amount)
    return total


def fit_rows(ctx: CheckInput, api: Any) -> list[Row]:
    from kubernetes import client
    from kubernetes.utils.quantity import parse_quantity

    wanted = [
        (s.request.label, pod) for s in ctx.submissions() for obj in s.payload["manifests"] for pod in pod_specs(obj)
    ]
    if not wanted:
        return []
    try:
        nodes = client.CoreV1Api(api).list_node().items
    except Exception as exc:  # noqa: BLE001
        return [
            unchecked(
                "fits a node",
                "each stage's pod requests fit a node its nodeSelector matches",
                str(api_error("list nodes", exc)),
            )
        ]
    rows, seen = [], set()
    for label, pod in wanted:
        requests, selector = pod_requests(pod), pod.get("nodeSelector") or {}
        key = (label, tuple(sorted(requests.items())), tuple(sorted(selector.items())))
        if key in seen:  # a PyTorchJob's Master and Worker ask alike
            continue
        seen.add(key)
        asked = ", ".join(f"{name} {show(amount)}" for name, amount in sorted(requests.items()))
        where = f" labelled {', '.join(f'{k}={v}' for k, v in selector.items())}" if selector else ""
        # A pod with no requests still needs a node its selector matches.
        assumes = (
            f"{label}: a node{where} has allocatable {asked} (a pod's requests)"
            if requests
            else f"{label}: a node{where} takes its pods (no requests)"
        )
        matched = [n for n in nodes if all((n.metadata.labels or {}).get(k) == v for k, v in selector.items())]
        allocatable = [
            {name: parse_quantity(n.status.allocatable.get(name, "0")) for name in requests}
            for n in matched
            if n.status.allocatable is not None
        ]
        fitting = [a for a in allocatable if all(a[name] >= amount for name, amount in requests.items())]
        largest = ", ".join(
            f"{name} {show(max((a[name] for a in allocatable), default=Decimal(0)))}" for name in sorted(requests)
        )
        showed = f"{len(fitting)} of {len(matched)} matching node(s) fit" + (
            f"; largest allocatable {largest}" if requests else ""
        )
        if not matched:
            rows.append(
                different(
                    "fits a node",
                    assumes,
                    f"no node{where} (of {len(nodes)})",
                    "fix the stage's kubernetes.node_selector or add such a node group",
                )
            )
        elif not fitting:
            rows.append(
                different(
                    "fits a node",
                    assumes,
                    showed,
                    "its pods would stay Pending: lower the stage's kubernetes cpu/memory/gpus or add larger nodes",
                )
            )
        else:
            rows.append(ok("fits a node", assumes, showed))
    return rows


def show(amount: Decimal) -> str:
    """A quantity as people write it: whole numbers plain, memory in Gi/Mi where it divides."""
    for unit, size in (("Gi", 2**30), ("Mi", 2**20)):
        if amount >= size and amount % size == 0:
            return f"{amount // size}{unit}"
    return f"{amount.normalize():f}"
