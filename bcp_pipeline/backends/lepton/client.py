"""NVIDIA's own client for DGX Cloud Lepton (`leptonai`, pinned in pyproject.toml's `lepton` extra): its v2
APIClient made from the options and the environment, and every call's failure turned into a BackendCallError that
carries the service's HTTP status (so 429 and 5xx are retried, 401/403/4xx are not: errors.is_transient).

The SDK is imported inside these functions: `plan` renders without it, and only this backend loads it. The token
is read from LEPTON_WORKSPACE_TOKEN (or the SDK's own `lep login` record) and never written anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from bcp_pipeline.config.resources import LeptonOptions
from bcp_pipeline.errors import BackendCallError, ConfigError

T = TypeVar("T")
INSTALL = "install NVIDIA's Lepton SDK: pip install 'bcp-pipeline[lepton]' (leptonai==0.47.1)"


def sdk_available() -> bool:
    try:
        import leptonai.api.v2.client  # noqa: F401
    except ImportError:
        return False
    return True


def api_client(options: LeptonOptions) -> Any:
    """The SDK's APIClient of the configured workspace; a ConfigError naming what is missing."""
    try:
        from leptonai.api.v2.client import APIClient
    except ImportError as exc:
        raise ConfigError(f"backend lepton: the leptonai SDK is not importable ({exc}); {INSTALL}") from None
    workspace = options.workspace_id or os.environ.get("LEPTON_WORKSPACE_ID")
    if not workspace:
        raise ConfigError(
            "backend lepton: no workspace: set backends.lepton.workspace_id or LEPTON_WORKSPACE_ID "
            "(the token goes in LEPTON_WORKSPACE_TOKEN, never in pipelines.yaml)"
        )
    try:
        return APIClient(workspace_id=workspace, url=options.url or os.environ.get("LEPTON_WORKSPACE_URL"))
    except Exception as exc:  # noqa: BLE001 - the SDK's WorkspaceConfigurationError and its record's errors
        raise ConfigError(f"backend lepton: workspace {workspace}: {exc}") from None


def call(what: str, fn: Callable[[], T]) -> T:
    """fn() through the SDK; its ClientError/ServerError (with the response), a refused connection or a timeout
    becomes a BackendCallError naming `what` and the service's answer."""
    import requests

    try:
        return fn()
    except requests.RequestException as exc:
        raise BackendCallError(
            f"Lepton API: {what}: no answer ({type(exc).__name__}: {exc})", unreachable=True
        ) from None
    except RuntimeError as exc:  # the SDK's ClientError / ServerError / LogAPIError are RuntimeErrors
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None) or getattr(exc, "status_code", None)
        text = (response.text if response is not None else str(exc)).strip()
        raise BackendCallError(
            f"Lepton API: {what}: {status or ''} {text}".replace("  ", " "), http_status=status
        ) from None


def dumped(model: Any) -> dict[str, Any]:
    """An SDK model as the JSON the service sends (by alias, without Nones): what states.py reads."""
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")
