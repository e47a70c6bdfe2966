"""Checks of a Kubernetes cluster: the API and who we are, the rights the backend needs (SelfSubjectAccessReview),
the namespace, the workspace PVC and its access mode, GPUs on the nodes, each stage's requests against the
allocatable of the nodes its nodeSelector matches (fit.py), the training operator's CRD, each Kueue LocalQueue a
stage names (`kubernetes.queue`), and every
rendered manifest of the pipeline through the apiserver's admission with a server-side dry run (nothing stored),
and a probe Job shaped as the first stage's (probe.py: RANK per pod, the mount, kill timing).
"""

from __future__ import annotations

import json
from typing import Any

from bcp_pipeline.backends.checks import CheckInput, CheckOutcome, Row, different, ok, unchecked
from bcp_pipeline.backends.kubernetes.client import api_client, api_error, create_object
from bcp_pipeline.backends.kubernetes.fit import fit_rows
from bcp_pipeline.backends.kubernetes.probe import probe_rows
from bcp_pipeline.backends.kubernetes.render import is_pytorchjob
from bcp_pipeline.config.resources import KubernetesOptions
from bcp_pipeline.errors import BackendCallError, ConfigError

# (verb, group, resource, subresource): what `run`, `logs` and `cancel` do.
RIGHTS = [
    ("create", "batch", "jobs", ""),
    ("list", "batch", "jobs", ""),
    ("delete", "batch", "jobs", ""),
    ("list", "", "pods", ""),
    ("get", "", "pods", "log"),
    ("create", "", "services", ""),
    ("delete", "", "services", ""),
    ("get", "", "secrets", ""),
]
# A stage with launcher: pytorchjob also creates, lists and deletes (cancel, a next attempt) PyTorchJobs.
PYTORCHJOB_RIGHTS = [(verb, "kubeflow.org", "pytorchjobs", "") for verb in ("create", "list", "delete")]
OPERATOR_CRD = "pytorchjobs.kubeflow.org"


def check_kubernetes(ctx: CheckInput) -> CheckOutcome:
    from kubernetes import client

    options: KubernetesOptions = ctx.config.options["kubernetes"]
    try:
        api = api_client(options, ctx.config.file.parent.resolve())
        version = client.VersionApi(api).get_code()
    except ConfigError as exc:
        return outcome(
            "unconfigured",
            [
                different(
                    "api",
                    "a kubeconfig that names a reachable cluster",
                    str(exc),
                    "fix the kubeconfig; nothing else was checked",
                )
            ],
        )
    except Exception as exc:  # noqa: BLE001
        error = api_error("version", exc)
        return outcome(
            "unreachable",
            [
                different(
                    "api",
                    "the API server answers",
                    str(error),
                    "fix the kubeconfig or the network; nothing else was checked",
                )
            ],
        )
    server = api.configuration.host
    rows = [
        ok("api", "the API server answers", f"{server}, Kubernetes {version.git_version}"),
        whoami_row(api),
        rights_row(api, options.namespace, uses_pytorchjobs(ctx)),
        namespace_row(api, options.namespace),
        claim_row(ctx, api, options),
        gpu_row(ctx, api),
        operator_row(ctx, api),
        *queue_rows(ctx, api, options),
    ]
    rows += fit_rows(ctx, api)
    rows += dry_run_rows(ctx, api)
    facts = {"server": server, "version": version.git_version}
    probed, probe_facts = probe_rows(ctx, api, options)
    rows += probed
    facts.update(probe_facts)
    return outcome(server.split("//")[-1].replace(":", "-"), [r for r in rows if r is not None], facts)


def outcome(cluster: str, rows: list[Row], facts: dict | None = None) -> CheckOutcome:
    return CheckOutcome(
        target={"cluster": cluster}, profile_parts=("kubernetes", cluster), rows=rows, facts=facts or {}
    )


def whoami_row(api: Any) -> Row:
    from kubernetes import client

    assumes = "the kubeconfig's user is known to the cluster"
    try:
        review = client.AuthenticationV1Api(api).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
        info = review.status.user_info
        return ok("who am i", assumes, f"{info.username} (groups {', '.join(info.groups or [])})")
    except Exception as exc:  # noqa: BLE001
        return unchecked("who am i", assumes, str(api_error("who am i", exc)))


def uses_pytorchjobs(ctx: CheckInput) -> bool:
    return any(is_pytorchjob(s.request) for s in ctx.submissions())


def rights_row(api: Any, namespace: str, pytorchjobs: bool = False) -> Row:
    from kubernetes import client

    assumes = (
        f"may create/list/delete jobs, list pods, read pods/log, create/delete services, read secrets"
        f"{', create/list/delete pytorchjobs' if pytorchjobs else ''} in {namespace}"
    )
    missing = []
    try:
        for verb, group, resource, sub in RIGHTS + (PYTORCHJOB_RIGHTS if pytorchjobs else []):
            review = client.AuthorizationV1Api(api).create_self_subject_access_review(
                {
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SelfSubjectAccessReview",
                    "spec": {
                        "resourceAttributes": {
                            "namespace": namespace,
                            "verb": verb,
                            "group": group,
                            "resource": resource,
                            "subresource": sub,
                        }
                    },
                }
            )
            if not review.status.allowed:
                missing.append(f"{verb} {resource}{'/' + sub if sub else ''}")
    except Exception as exc:  # noqa: BLE001
        return unchecked("rights", assumes, str(api_error("access review", exc)))
    if missing:
        return different(
            "rights",
            assumes,
            "denied: " + ", ".join(missing),
            "ask the cluster's admin for a Role with these verbs in the namespace",
        )
    return ok("rights", assumes, "all allowed")


def namespace_row(api: Any, namespace: str) -> Row:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    assumes = f"the namespace {namespace} exists (backends.kubernetes.namespace)"
    try:
        client.CoreV1Api(api).read_namespace(namespace)
    except ApiException as exc:
        if exc.status == 404:
            return different("namespace", assumes, "not found", f"kubectl create namespace {namespace}")
        if exc.status != 403:
            return unchecked("namespace", assumes, str(api_error("namespace", exc)))
    return ok("namespace", assumes, "exists")


def claim_row(ctx: CheckInput, api: Any, options: KubernetesOptions) -> Row:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    claim = options.workspace_claim
    multi = ctx.pipeline is not None and any(s.request.rank_layout("kubernetes").nodes > 1 for s in ctx.submissions())
    assumes = f"the PVC {claim} is Bound" + (" and ReadWriteMany (a stage's pods span nodes)" if multi else "")
    try:
        pvc = client.CoreV1Api(api).read_namespaced_persistent_volume_claim(claim, options.namespace)
    except ApiException as exc:
        if exc.status == 404:
            return different(
                "workspace claim",
                assumes,
                "not found",
                "create the PVC (EKS: an FSx for Lustre claim, ReadWriteMany) or set "
                "backends.kubernetes.workspace_claim",
            )
        return unchecked("workspace claim", assumes, str(api_error("read pvc", exc)))
    modes = pvc.status.access_modes or pvc.spec.access_modes or []
    showed = f"{pvc.status.phase}, {', '.join(modes) or 'no access modes'}"
    if pvc.status.phase != "Bound":
        return different("workspace claim", assumes, showed, "the claim is not bound to a volume yet")
    if multi and "ReadWriteMany" not in modes:
        return different(
            "workspace claim",
            assumes,
            showed,
            "pods on several nodes cannot all mount it: use a ReadWriteMany volume (FSx for Lustre, EFS, NFS)",
        )
    return ok("workspace claim", assumes, showed)


def gpu_row(ctx: CheckInput, api: Any) -> Row | None:
    from kubernetes import client

    wanted = max((s.request.resources("kubernetes").gpus for s in ctx.submissions()), default=0)
    assumes = f"a node has {wanted} allocatable nvidia.com/gpu (the stages' most per pod)"
    try:
        nodes = client.CoreV1Api(api).list_node().items
    except Exception as exc:  # noqa: BLE001
        return unchecked("gpus", assumes, str(api_error("list nodes", exc)))
    counts = sorted(int((n.status.allocatable or {}).get("nvidia.com/gpu", "0")) for n in nodes)
    showed = f"{len(nodes)} node(s), GPUs per node {counts or 'none'}"
    if wanted and (not counts or counts[-1] < wanted):
        return different(
            "gpus",
            assumes,
            showed,
            "no node fits the stage's pods: add a GPU node group (and the "
            "NVIDIA device plugin) or lower kubernetes.gpus",
        )
    return ok("gpus", assumes, showed)


def operator_row(ctx: CheckInput, api: Any) -> Row:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    uses = uses_pytorchjobs(ctx)
    assumes = f"the training operator's CRD {OPERATOR_CRD}" + (" (a stage sets launcher: pytorchjob)" if uses else "")
    try:
        client.ApiextensionsV1Api(api).read_custom_resource_definition(OPERATOR_CRD)
    except ApiException as exc:
        if exc.status == 404:
            if uses:
                return different(
                    "training operator",
                    assumes,
                    "not installed",
                    "install the Kubeflow training operator, or use launcher: job",
                )
            return ok("training operator", assumes, "not installed (not needed: no stage uses launcher: pytorchjob)")
        return unchecked("training operator", assumes, str(api_error("read crd", exc)))
    return ok("training operator", assumes, "installed")


def queue_rows(ctx: CheckInput, api: Any, options: KubernetesOptions) -> list[Row]:
    """Each Kueue LocalQueue the stages name, in the namespace: it exists and is Active (its ClusterQueue exists
    and is active). A missing one would leave its stages' jobs suspended for ever: Kueue admits nothing into it."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    stages: dict[str, list[str]] = {}
    for submission in ctx.submissions():
        if queue := submission.request.resources("kubernetes").queue:
            stages.setdefault(queue, []).append(submission.request.label)
    rows = []
    for queue, labels in stages.items():
        assumes = f"the Kueue LocalQueue {queue} exists in {options.namespace} and is active ({', '.join(labels)})"
        try:
            found = client.CustomObjectsApi(api).get_namespaced_custom_object(
                "kueue.x-k8s.io", "v1beta2", options.namespace, "localqueues", queue
            )
        except ApiException as exc:
            if exc.status == 404 and named_in(exc.body, queue):  # else: no such API (no Kueue)
                rows.append(
                    different(
                        "kueue queue",
                        assumes,
                        "not found",
                        f"create the LocalQueue {queue} in {options.namespace} (pointing at a "
                        "ClusterQueue), or set the stage's kubernetes.queue to one that exists",
                    )
                )
            elif exc.status == 404:
                rows.append(
                    different(
                        "kueue queue",
                        assumes,
                        "Kueue is not installed (no kueue.x-k8s.io/v1beta2 API)",
                        "install Kueue (0.15 or later), or remove kubernetes.queue",
                    )
                )
            else:
                rows.append(unchecked("kueue queue", assumes, str(api_error("read localqueue", exc))))
            continue
        active = next((c for c in found.get("status", {}).get("conditions", []) if c.get("type") == "Active"), None)
        cluster_queue = found.get("spec", {}).get("clusterQueue", "?")
        if active is None or active.get("status") != "True":
            said = active.get("message", "") if active else "no Active condition yet"
            rows.append(
                different(
                    "kueue queue",
                    assumes,
                    f"not active (ClusterQueue {cluster_queue}): {said}",
                    f"create or fix the ClusterQueue {cluster_queue} (its flavors must exist)",
                )
            )
            continue
        rows.append(ok("kueue queue", assumes, f"exists and is active (ClusterQueue {cluster_queue})"))
    return rows


def named_in(body: str | None, name: str) -> bool:
    """Whether a 404's body is the API's Status for the object `name` (the resource exists, the object does not),
    not a plain "404 page not found" (no such resource: its API is not installed)."""
    try:
        return json.loads(body or "").get("details", {}).get("name") == name
    except ValueError:
        return False


def dry_run_rows(ctx: CheckInput, api: Any) -> list[Row]:
    """Each rendered job's manifests through the apiserver's validation and admission, stored nowhere."""
    rows = []
    for submission in ctx.submissions():
        assumes = f"{submission.request.label}: the apiserver accepts its manifests (server-side dry run)"
        try:
            for obj in submission.payload["manifests"]:
                create_object(api, obj, dry_run=True)
        except BackendCallError as exc:
            rows.append(
                different(
                    "manifests",
                    assumes,
                    str(exc).split("; the Kubernetes API answers")[0],
                    "fix the stage's kubernetes: section (`plan --backend kubernetes` shows them)",
                )
            )
            continue
        rows.append(ok("manifests", assumes, "accepted"))
    return rows
