"""What a stage's `kubernetes:` section asks of its job beyond the pods (pure, used by render.py): how failed pods
are counted (an Indexed Job's backoffLimit, per index with retries_per_index) and a PyTorchJob's elastic
rendezvous (elastic_policy). Loading checks the keys together (config/validate.py _validate_kubernetes)."""

from __future__ import annotations

from typing import Any

from bcp_pipeline.config.resources import ElasticPolicy, KubernetesResources


def failure_limits(res: KubernetesResources) -> dict[str, int]:
    """An Indexed Job's limits on failed pods: `backoffLimit` alone (default 0: the first failed program fails the
    stage), or with `retries_per_index` each index's own (`backoffLimitPerIndex`: a bad shard fails its index only,
    the others going on and their outputs kept for the next attempt) and `maxFailedIndexes`. There `backoffLimit`
    is rendered only where set: the apiserver's default is then no limit across indexes, as a limit of 0 would fail
    the Job at the first failed pod, per-index retries left unused."""
    if res.retries_per_index is None:
        return {"backoffLimit": res.backoff_limit or 0}
    limits = {} if res.backoff_limit is None else {"backoffLimit": res.backoff_limit}
    limits["backoffLimitPerIndex"] = res.retries_per_index
    if res.max_failed_indexes is not None:
        limits["maxFailedIndexes"] = res.max_failed_indexes
    return limits


def elastic_policy(policy: ElasticPolicy, pods: int) -> dict[str, Any]:
    """The PyTorchJob's `elasticPolicy` (v1 CRD): unset bounds are the stage's `pods`. Not its `nProcPerNode`, which
    the operator's webhook refuses beside the spec's own `nprocPerNode` (deprecated there)."""
    return {"minReplicas": pods if policy.min_replicas is None else policy.min_replicas,
            "maxReplicas": pods if policy.max_replicas is None else policy.max_replicas,
            "rdzvBackend": policy.rdzv_backend, "maxRestarts": policy.max_restarts}
