"""Build typed dataclasses from YAML mappings: keys map 1:1 to fields, errors name file:line and key.

Supported field types: str, int, float, bool, Literal[...], Duration, list[T], dict[str, T], nested dataclasses
and `T | None`. A field's `metadata={"doc": ...}` is its one-line description (shown by `list --keys`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, NewType, Union, get_args, get_origin, get_type_hints

import yaml

from bcp_pipeline.config.durations import parse_duration
from bcp_pipeline.config.yaml_lines import line_of
from bcp_pipeline.errors import ConfigError

Duration = NewType("Duration", str)
"""A duration string validated like ngc's (`10h`, `5D`, `1h30m`); kept as written, seconds via parse_duration."""


@dataclasses.dataclass(frozen=True)
class Where:
    """Where a value came from, for error messages: a file and line, or a --set override."""

    file: str
    key: str = ""
    line: int | None = None

    def child(self, key: str | int, container: Any) -> Where:
        name = f"{self.key}[{key}]" if isinstance(key, int) else (f"{self.key}.{key}" if self.key else str(key))
        origin = getattr(container, "key_origins", {}).get(key)
        if origin is not None:  # the value came from a --set override, not from the file
            return Where(origin, name, None)
        line = line_of(container, key)
        return Where(self.file, name, line if line is not None else self.line)

    def error(self, message: str) -> ConfigError:
        return ConfigError(message, file=self.file, line=self.line, key=self.key or None)


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if tp is Duration:
        return "duration (e.g. 10h, 5D, 1h30m)"
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp) if a is not type(None))
    if origin is list:
        return f"list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return f"mapping of {_type_name(get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def convert(tp: Any, value: Any, where: Where) -> Any:
    """Check `value` against annotation `tp`, converting nested mappings to dataclasses."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        if value is None and len(options) < len(get_args(tp)):
            return None
        errors = []
        for option in options:
            try:
                return convert(option, value, where)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0] if len(errors) == 1 else where.error(f"expected {_type_name(tp)}, got {shown(value)}")
    if tp is Duration:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise where.error(f"expected a duration such as 10h, 5D or 1h30m, got {shown(value)}")
        try:
            parse_duration(value)
        except ValueError as exc:
            raise where.error(str(exc)) from None
        return Duration(str(value))
    if origin is Literal:
        if value not in get_args(tp):
            raise where.error(f"{value!r} is not one of {', '.join(repr(a) for a in get_args(tp))}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise where.error(f"expected a list, got {shown(value)}")
        return [convert(get_args(tp)[0], item, where.child(i, value)) for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise where.error(f"expected a mapping, got {shown(value)}")
        value_type = get_args(tp)[1]
        return {str(k): convert(value_type, v, where.child(k, value)) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build(tp, value, where)
    return _scalar(tp, value, where)


SHOWN_CHARS = 200  # of a value shown in an error: its start, then "..."


def shown(value: Any) -> str:
    """A value as YAML read it, in YAML's own flow style (as it could be written in the file or a --set), after
    what kind of value that is: `a mapping {a: 1}`, `a list [1, 2]`, `text 'two'`; never a Python repr. Only its
    first SHOWN_CHARS characters are rendered: a value that aliases expand a billion times is never walked whole."""
    kind = (
        "a mapping"
        if isinstance(value, dict)
        else "a list"
        if isinstance(value, list)
        else "nothing"
        if value is None
        else "true/false"
        if isinstance(value, bool)
        else "a number"
        if isinstance(value, (int, float))
        else "text"
    )
    budget = [SHOWN_CHARS]  # values left to render: each renders as at least one character
    text = yaml.safe_dump(_plain(value, budget), default_flow_style=True, width=1 << 20).strip()
    text = text.removesuffix("...").strip()  # the document-end marker YAML adds after a lone scalar
    return f"{kind} {text}" if len(text) <= SHOWN_CHARS and budget[0] >= 0 else f"{kind} {text[:SHOWN_CHARS]}..."


def _plain(value: Any, budget: list[int]) -> Any:
    """The start of `value`, its first `budget[0]` values (budget[0] ends below 0 when some were left out), with
    YAML's line-keeping dicts and lists as plain ones, which safe_dump represents."""
    budget[0] -= 1
    if isinstance(value, dict):
        plain = {}
        for key, item in value.items():
            if budget[0] <= 0:
                budget[0] = -1
                break
            plain[_plain(key, budget)] = _plain(item, budget)
        return plain
    if isinstance(value, list):
        items = []
        for item in value:
            if budget[0] <= 0:
                budget[0] = -1
                break
            items.append(_plain(item, budget))
        return items
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        budget[0] = -1
        return value[: SHOWN_CHARS + 1]
    return value


def _scalar(tp: Any, value: Any, where: Where) -> Any:
    if tp is str:
        # Numbers are accepted where text is expected (args like `--chunks 1`), booleans are not: `yes` is a trap.
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise where.error(f"expected text, got {shown(value)}")
        return str(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise where.error(f"expected true or false, got {shown(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise where.error(f"expected an integer, got {shown(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise where.error(f"expected a number, got {shown(value)}")
        return float(value)
    if tp is typing.Any:
        return value
    raise TypeError(f"unsupported field type {tp!r} at {where.key}")  # a programming error, not user input


def build(cls: type, raw: Any, where: Where, **extra: Any) -> Any:
    """Build dataclass `cls` from mapping `raw`; `extra` supplies fields that are not read from YAML."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise where.error(f"expected a mapping with keys {', '.join(field_names(cls))}, got {shown(raw)}")
    hints = get_type_hints(cls, include_extras=False)
    valid = field_names(cls)
    unknown = [k for k in raw if k not in valid]
    if unknown:
        key = unknown[0]
        raise where.child(key, raw).error(f"unknown key {key!r}; valid keys: {', '.join(valid)}")
    values: dict[str, Any] = dict(extra)
    for field in dataclasses.fields(cls):
        if field.name in raw:
            values[field.name] = convert(hints[field.name], raw[field.name], where.child(field.name, raw))
        elif (
            field.name not in values
            and field.default is dataclasses.MISSING
            and field.default_factory is dataclasses.MISSING
        ):
            raise where.error(f"missing required key {field.name!r}")
    return cls(**values)


def field_names(cls: type) -> list[str]:
    """The YAML keys of `cls`: its init fields that are not filled in by the loader (metadata internal=True)."""
    return [f.name for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")]
