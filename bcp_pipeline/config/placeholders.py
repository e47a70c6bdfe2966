"""`${name}` placeholders in pipelines.yaml: the built-in ones, substitution, and whole numbers made of them."""

from __future__ import annotations

import re

PLACEHOLDER = re.compile(r"\$\{([a-z_][a-z0-9_]*)\}")
BUILTIN_PLACEHOLDERS = ("workspace", "results", "code", "run_id", "stage", "python")


def substitute(text: str, values: dict[str, str]) -> str:
    """Replace lower-case `${name}` placeholders; upper-case `${NAME}` is left for the job's shell."""
    return PLACEHOLDER.sub(lambda m: values[m.group(1)] if m.group(1) in values else m.group(0), text)


def resolve_int(text: str, variables: dict[str, str]) -> int:
    """`"42"` or `"${files}"` -> 42; ValueError naming the text otherwise."""
    resolved = substitute(text, dict(variables))
    try:
        return int(resolved)
    except ValueError:
        shown = f" (it is {resolved!r})" if resolved != text else ""
        raise ValueError(f"{text!r} is not a whole number{shown}") from None
