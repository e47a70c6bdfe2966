"""The stage programs' interpreter, as a check asks it: a one-line program that prints its version and which of
the stage programs' pinned packages it cannot import (stages/requirements.txt), run here or on a compute node."""

from __future__ import annotations

from pathlib import Path

MIN_STAGE_PYTHON = (3, 10)  # docs/CONVENTIONS.md: the stage programs run on the NeMo container's 3.10
PROBE = (
    "import importlib.util, json, sys; "
    "print(json.dumps({'version': list(sys.version_info[:3]), "
    "'missing': [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]}))"
)


def module_names(stages_dir: Path) -> list[str]:
    """Import names of stages/requirements.txt's packages (their distribution names, lower case, `-` -> `_`), each
    once (a package may be pinned per Python version on two lines)."""
    try:
        lines = (stages_dir / "requirements.txt").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    names = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            name = line
            for sep in "=<>!~[; ":
                name = name.split(sep, 1)[0]
            names.append(name.lower().replace("-", "_"))
    return list(dict.fromkeys(names))
