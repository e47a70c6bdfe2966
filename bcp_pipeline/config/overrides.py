"""`--set` on the command line: `STAGE.KEY=VALUE` and `vars.NAME=VALUE` on one pipeline, `backends.BACKEND.KEY=VALUE`
on the file's backend-wide options. VALUE is YAML; every value set remembers the --set that gave it, so an error
about it names the --set rather than a line of the file."""

from __future__ import annotations

from typing import Any

import yaml

from bcp_pipeline.config.resources import OPTION_TYPES
from bcp_pipeline.config.yaml_lines import BoundedLoader, ExpansionError, LineDict
from bcp_pipeline.errors import ConfigError

OPTIONS_PREFIX = "backends."  # `--set backends.bcp.driver.total_runtime=1H`: backend-wide options, not a stage


def apply_overrides(pipeline_raw: Any, overrides: list[str], file: str) -> Any:
    """Apply `--set STAGE.KEY[.KEY]=VALUE` (or `vars.NAME=VALUE`); VALUE is parsed as YAML."""
    for item in overrides:
        parts, value = _parse_override(item)
        stages = pipeline_raw.get("stages") or {}
        if parts[0] == "vars":
            container = pipeline_raw.setdefault("vars", LineDict())
            _refuse_unknown_var(container, parts, item)
        elif parts[0] in stages:
            container = stages[parts[0]]
        else:
            raise ConfigError(
                f"no stage {parts[0]!r}; stages: {', '.join(stages)} (or vars.NAME, or {OPTIONS_PREFIX}BACKEND.KEY)",
                file=f"--set {item}",
            )
        _set_at(container, parts[1:], value, item)
    return pipeline_raw


def apply_option_overrides(backends_raw: Any, overrides: list[str], file: str) -> Any:
    """Apply `--set backends.BACKEND.KEY[.KEY]=VALUE` to the file's `backends:` section (e.g. the --detach
    driver's `backends.bcp.driver.total_runtime`)."""
    if not isinstance(backends_raw, dict):
        raise ConfigError("backends: expected a mapping of backend names to options", file=file)
    for item in overrides:
        parts, value = _parse_override(item)
        if len(parts) < 3 or parts[1] not in OPTION_TYPES:
            raise ConfigError(
                f"expected backends.BACKEND.KEY=VALUE with BACKEND one of {', '.join(OPTION_TYPES)}",
                file=f"--set {item}",
            )
        section = backends_raw.get(parts[1])
        if section is None:
            section = backends_raw[parts[1]] = LineDict()
        if not isinstance(section, dict):
            raise ConfigError(f"backends.{parts[1]} is not a mapping in the file", file=f"--set {item}")
        _set_at(section, parts[2:], value, item)
    return backends_raw


def _refuse_unknown_var(variables: Any, parts: list[str], item: str) -> None:
    """A var the pipeline does not have would be set and never used: a misspelt name changes nothing, silently."""
    known = list(variables) if isinstance(variables, dict) else []
    if len(parts) != 2 or parts[1] not in known:
        raise ConfigError(
            f"the pipeline has no var {'.'.join(parts[1:])!r}; its vars: {', '.join(known) or 'none'}",
            file=f"--set {item}",
        )


def set_origins(raw: Any, prefix: str = "") -> dict[str, str]:
    """The values under `raw` that came from --set, by key path below it: {"bcp.image": "--set STAGE.bcp.image=X"}
    (for checks after loading, which know the path of what they refuse but not the mapping it was read from)."""
    if not isinstance(raw, dict):
        return {}
    found = {f"{prefix}{key}": origin for key, origin in getattr(raw, "key_origins", {}).items()}
    for key, value in raw.items():
        found |= set_origins(value, f"{prefix}{key}.")
    return found


def _parse_override(item: str) -> tuple[list[str], Any]:
    """`A.B.C=VALUE` as its key path and its YAML value; a ConfigError naming the --set when either is bad."""
    path_text, sep, value_text = item.partition("=")
    parts = [p for p in path_text.strip().split(".") if p]
    if not sep or len(parts) < 2:
        raise ConfigError(
            "expected STAGE.KEY=VALUE, vars.NAME=VALUE or backends.BACKEND.KEY=VALUE", file=f"--set {item}"
        )
    try:  # the loader of the file, whose aliases expand no further than there
        return parts, (yaml.load(value_text, Loader=BoundedLoader) if value_text.strip() else "")  # noqa: S506
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if isinstance(exc, ExpansionError):
            raise ConfigError(f"VALUE: {problem}", file=f"--set {item}") from None
        raise ConfigError(
            f"VALUE {value_text!r} is not valid YAML ({problem}); quote it for the shell and YAML, "
            "e.g. --set 'KEY=\"text: with colon\"'",
            file=f"--set {item}",
        ) from None


def _set_at(container: Any, keys: list[str], value: Any, item: str) -> None:
    """Set `value` at the key path `keys` under `container`, making mappings on the way; remembers that the value
    came from `--set item`, so an error about it names the --set, not a line of the file."""
    for part in keys[:-1]:
        nxt = container.get(part)
        if nxt is None:  # a mapping the --set made (`download.locl.replicas`): a bad key there is the --set's
            nxt = container[part] = LineDict()
            _remember_origin(container, part, item)
        if not isinstance(nxt, dict):
            raise ConfigError(f"{part!r} is not a mapping", file=f"--set {item}")
        container = nxt
    container[keys[-1]] = value
    _remember_origin(container, keys[-1], item)


def _remember_origin(container: Any, key: str, item: str) -> None:
    if not hasattr(container, "key_origins"):
        container.key_origins = {}
    container.key_origins[key] = f"--set {item}"
