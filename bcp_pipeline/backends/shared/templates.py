"""Job scripts kept as `.sh` files beside the module that renders them, so that shellcheck can read them
(tests/backends/test_job_scripts.py) and the module holds Python only.

A template file is a header, a blank line, then the body:
- the header is `#` lines that are never rendered: what the script is, its tokens, and the shellcheck directives
  that hold for the whole file (a fragment uses variables its job script sets);
- the body is the shell text, with `@NAME@` tokens that `fill` replaces. A body line that is a shellcheck
  directive (`# shellcheck disable=SC2012  # why`) is for shellcheck only and is dropped too;
- a `one_line` template is a program run as `bash -c TEXT`, written one statement a line for reading: its lines
  are joined by single spaces, so a line ends where a command does (after `;`, `&`, `do`, `then`, `{` ...).

The file's last newline is the file's, not the script's.
"""

from __future__ import annotations

import re
from importlib import resources

TOKEN = re.compile(r"@([A-Z][A-Z0-9_]*)@")
DIRECTIVE = re.compile(r"^\s*# shellcheck ")


def load(package: str, name: str, *, one_line: bool = False) -> str:
    """The body of the template `name` in `package`'s folder (see the module's docstring)."""
    text = resources.files(package).joinpath(name).read_text(encoding="utf-8")
    header, blank, body = text.partition("\n\n")
    assert blank and all(line.startswith("#") for line in header.splitlines()), f"{name}: no header, then a blank line"
    lines = [line for line in body.removesuffix("\n").split("\n") if not DIRECTIVE.match(line)]
    if not one_line:
        return "\n".join(lines)
    assert not any(line.lstrip().startswith("#") for line in lines), f"{name}: a comment inside a one-line program"
    return " ".join(lines)


def fill(template: str, **values: str) -> str:
    """`template` with each `@NAME@` replaced by values[NAME], in one pass (a value is never scanned for tokens).
    A token alone on its line whose value is empty takes the line with it. Every token needs a value, and every
    value a token: a typo fails here, not in a job."""
    used = set(TOKEN.findall(template))
    assert used == set(values), f"tokens {sorted(used)}, values {sorted(values)}"
    for name, value in values.items():
        if not value:
            template = re.sub(rf"(?m)^@{name}@\n", "", template)
    return TOKEN.sub(lambda match: values[match.group(1)], template)
