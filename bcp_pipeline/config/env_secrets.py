"""A credential written into a stage's `env:` is refused at load: such a value travels in clear in the run state
(its --set overrides), each job's spec, `status --json`, `plan` and the BCP job definition (`--env-var`), where
redaction (redact.py) reaches only the kept commands and the report. Each backend has a way that keeps the value
out of all of them, which the message names."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from bcp_pipeline.config.model import StageConfig
from bcp_pipeline.config.resources import RESOURCE_TYPES
from bcp_pipeline.config.typed import Where
from bcp_pipeline.errors import ConfigError
from bcp_pipeline.redact import KNOWN_SECRET_VARIABLES, MIN_SECRET_LENGTH, REDACTED, SECRET_NAME

_SECRET_NAME = re.compile(rf"^{SECRET_NAME}$")
# `$HF_TOKEN` or `${HF_TOKEN}`: a reference the job's shell expands, no credential in itself.
_SHELL_REFERENCE = re.compile(r"^\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})$")
# Where a backend takes a credential instead, one that none of the run's records holds: asked of its section's
# fields, so that no backend is named here (config/resources.py names them).
BY_SECRETS = (
    "pass it as one of the backend's secrets instead: `{backend}: {secrets: [NAME:KEY:{var}]}` (a secret "
    "the service keeps: docs/backends/{backend}.md)"
)
BY_SETUP = (
    "have the job read it from a file only you can read instead, e.g. `{backend}: {setup: ['export "
    "{var}=$(cat ~/.{var})']}`"
)
INHERITED = "export {var} in the shell that runs bcp-pipeline instead: {backend} jobs inherit its environment"


def _way(backend: str, var: str) -> str:
    names = {f.name for f in dataclasses.fields(RESOURCE_TYPES[backend])}  # type: ignore[arg-type]  # dataclasses all
    way = BY_SECRETS if "secrets" in names else BY_SETUP if "setup" in names else INHERITED
    return way.replace("{var}", var).replace("{backend}", backend)


def refuse_secret_env(stage: StageConfig, body: Any, where: Where) -> None:
    """Refuse, at its line (or --set), an `env:` value of a stage's backend section named like a credential."""
    for backend in RESOURCE_TYPES:
        for var, value in stage.resources(backend).env.items():
            if not (var in KNOWN_SECRET_VARIABLES or _SECRET_NAME.match(var)):
                continue
            if len(value) < MIN_SECRET_LENGTH or _SHELL_REFERENCE.match(value):
                continue  # `USE_TOKEN: "1"`, `TOKENIZERS_PARALLELISM: "false"`, `$HF_TOKEN`: no credential
            at = _where_env(body, backend, where)
            way = _way(backend, var)
            message = (
                f"{backend}.env.{var} looks like a credential (its value is not shown): a value in `env:` is "
                f"kept in clear in the run state, the jobs' specs, `status --json` and `plan`; {way}"
            )
            # A --set is named by its text (Where.file): the value goes out of that too.
            raise ConfigError(
                message, file=at.file.replace(value, REDACTED) if at.file else None, line=at.line, key=at.key or None
            )


def _where_env(body: Any, backend: str, where: Where) -> Where:
    """The `env:` line (or --set) of the stage's backend section; the stage's where it came from `defaults:`."""
    section = body.get(backend) if isinstance(body, dict) else None
    if not isinstance(section, dict):
        return where
    at = where.child(backend, body)
    return at.child("env", section) if "env" in section else at
