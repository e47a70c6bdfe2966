"""The official Kubernetes client as the backend and its check use it: an API client from the kubeconfig, objects
created (or dry-run), and the API's errors as BackendCallError."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bcp_pipeline.config.resources import KubernetesOptions
from bcp_pipeline.errors import BackendCallError, ConfigError, SubmissionError

HINT = (
    "the Kubernetes API answers at the kubeconfig's server (backends.kubernetes.kubeconfig/context, else "
    "$KUBECONFIG or ~/.kube/config): `kubectl get nodes` shows whether this machine reaches it"
)


def api_client(options: KubernetesOptions, config_dir: Path) -> Any:
    """An ApiClient from the kubeconfig (options.kubeconfig relative to the config file; else $KUBECONFIG or
    ~/.kube/config) and its context, as kubectl picks them."""
    try:
        from kubernetes import config
    except ImportError:
        raise ConfigError(
            "the kubernetes backend needs the `kubernetes` package: pip install 'kubernetes==35.0.0' "
            "(scripts/setup installs it)"
        ) from None
    path = (
        (config_dir / options.kubeconfig)
        if options.kubeconfig
        else Path(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]).expanduser()
    )
    if not path.is_file():
        raise ConfigError(
            f"no kubeconfig at {path}: set backends.kubernetes.kubeconfig (or $KUBECONFIG) to the "
            "cluster's kubeconfig (`aws eks update-kubeconfig` writes one for EKS)"
        )
    try:
        return config.new_client_from_config(config_file=str(path), context=options.context)
    except Exception as exc:  # noqa: BLE001 - a bad kubeconfig raises ConfigException, ValueError, ...
        raise ConfigError(
            f"{path}: cannot use this kubeconfig{f' (context {options.context!r})' if options.context else ''}: {exc}"
        ) from None


def create_object(api: Any, obj: dict[str, Any], *, dry_run: bool = False) -> None:
    """POST one manifest to its collection; raises BackendCallError with the apiserver's message. A dry run is
    also strict: a field the API's schema (a CRD's, for a PyTorchJob) does not know is refused, not dropped."""
    from kubernetes import client

    namespace, kind = obj["metadata"]["namespace"], obj["kind"]
    extra = {"dry_run": "All", "field_validation": "Strict"} if dry_run else {}
    try:
        if kind == "Service":
            client.CoreV1Api(api).create_namespaced_service(namespace, obj, **extra)
        elif kind == "Job":
            client.BatchV1Api(api).create_namespaced_job(namespace, obj, **extra)
        elif kind == "PyTorchJob":
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                "kubeflow.org", "v1", namespace, "pytorchjobs", obj, **extra
            )
        else:
            raise SubmissionError(f"cannot create a {kind}: the backend renders only Service, Job and PyTorchJob")
    except SubmissionError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise api_error(f"create {kind} {obj['metadata']['name']}", exc) from None


def api_error(what: str, exc: Exception) -> BackendCallError:
    """An API failure as one readable error: the apiserver's reason and message, not the client's dump."""
    import json

    body = getattr(exc, "body", None)
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if body:
        try:
            parsed = json.loads(body)
            message = f"{parsed.get('reason', '')}: {parsed.get('message', '')}"
        except (ValueError, AttributeError):
            pass
    status = getattr(exc, "status", None)
    return BackendCallError(
        f"Kubernetes API, {what}: {message}; {HINT}",
        http_status=status if isinstance(status, int) and status else None,
        unreachable=not isinstance(status, int) or not status,
    )
