"""Backends by name: the one place that turns a backend's name into its class.

The names are config.resources.BACKENDS' keys (the one table of them); a backend NAME lives in the folder
backends/NAME/, whose backend.py names its contract.Backend class as `BACKEND`. Nothing else imports a backend's
folder (detach/ excepted: it is BCP's by nature), and nothing else asks which backend it has: what differs is
asked of the class through the contract's hooks.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bcp_pipeline.backends.contract import Backend, JobRequest
from bcp_pipeline.config.model import Config, PipelineConfig
from bcp_pipeline.config.resources import BACKENDS
from bcp_pipeline.errors import ConfigError


def backend_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def backend_class(name: str) -> type[Backend]:
    """The Backend class of `name`, imported on first use (a backend's client libraries load only with it)."""
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    cls: type[Backend] = importlib.import_module(f"{__package__}.{name}.backend").BACKEND
    assert cls.name == name, f"backends/{name}/backend.py names the backend {cls.name!r}"
    return cls


def detachable_backends() -> tuple[str, ...]:
    """The backends whose runs `run --detach` can hand to a job of the service (Backend.detachable)."""
    return tuple(name for name in BACKENDS if backend_class(name).detachable)


def make_backend(name: str, config: Config, pipeline: PipelineConfig, run_dir: Path) -> Backend:
    """The backend `name`, bound to one run's folder (logs, local job records)."""
    return backend_class(name).for_run(config, pipeline, run_dir)


def check_backend_ready(name: str, config: Config, pipeline: PipelineConfig | None = None) -> None:
    """What a backend needs before the first submission, checked before a run is recorded (Backend.check_ready)."""
    backend_class(name).check_ready(config, pipeline)


def check_backend_limits(
    name: str, config: Config, pipeline: PipelineConfig, requests: Sequence[JobRequest], *, detach: bool = False
) -> None:
    """The service's own limits against the jobs this invocation may submit (Backend.check_limits)."""
    backend_class(name).check_limits(config, pipeline, requests, detach=detach)


def describe_backend_limits(
    name: str, config: Config, pipeline: PipelineConfig, requests: Sequence[JobRequest], *, detach: bool = False
) -> Any:
    """`plan`'s view of the same check (Backend.describe_limits); None for a backend with no such limits."""
    return backend_class(name).describe_limits(config, pipeline, requests, detach=detach)
