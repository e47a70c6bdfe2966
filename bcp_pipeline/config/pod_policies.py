"""Two small parts of a stage's `kubernetes:` section (config/sections/kubernetes.py KubernetesResources): a pod
toleration and a PyTorchJob's elastic policy, typed as pipelines.yaml writes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class Toleration:
    """A pod toleration (`spec.tolerations[]`), e.g. of a GPU node group's taint."""

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


@dataclass(kw_only=True)
class ElasticPolicy:
    """A PyTorchJob's `elasticPolicy` (Kubeflow training operator v1): torchrun's elastic rendezvous, so the training
    goes on with fewer pods and restarts its ranks after one is lost, rather than the attempt ending."""

    min_replicas: int | None = None  # the fewest pods the training runs on (default: the stage's replicas)
    max_replicas: int | None = None  # the most (default: the stage's replicas, the Worker pods created)
    rdzv_backend: Literal["c10d", "etcd", "etcd-v2"] = "c10d"  # c10d: a store on the first Worker pod, nothing else
    max_restarts: int = 3  # restarts of the ranks (torchrun --max-restarts) before the job fails
