"""Secret values out of text that is kept or shown (submitted command lines, the run report). Pure but for the
environment read by `secret_values`.

Rendering never puts a secret into a command line (BCP takes `--secret NAME`, the API key reaches ngc only through
its environment), so this is the second line of defence: a value a user put in a stage's `env:` under a secret-like
name, or the value of a secret variable of this process that shows up anywhere, is replaced.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"
# Variables that hold credentials for the services this tool talks to, whatever their value looks like.
KNOWN_SECRET_VARIABLES = ("NGC_CLI_API_KEY", "NGC_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY")
# An environment variable whose name says it is a credential (`MY_API_KEY`, `GITHUB_TOKEN`, `DB_PASSWORD`). Upper
# case only, as environment variables are named: `max_tokens=8` or a hydra `tokenizer.model=...` is no secret.
SECRET_NAME = r"[A-Z_][A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)[A-Z0-9_]*"
_ASSIGNMENT = re.compile(rf"\b({SECRET_NAME})=('[^']*'|\"[^\"]*\"|[^\s;&|]+)")
MIN_SECRET_LENGTH = 8  # shorter values ("1", "yes") would redact ordinary words


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of this process's secret-looking variables, longest first (so a prefix never hides a longer one)."""
    environ = os.environ if environ is None else environ
    name = re.compile(rf"^{SECRET_NAME}$")
    values = {
        value
        for key, value in environ.items()
        if (key in KNOWN_SECRET_VARIABLES or name.match(key)) and len(value) >= MIN_SECRET_LENGTH
    }
    return sorted(values, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every `SECRET_NAME=value` assignment's value and every one of `secrets` replaced by REDACTED."""
    for value in secrets:
        if value:
            text = text.replace(value, REDACTED)
    return _ASSIGNMENT.sub(lambda m: f"{m.group(1)}={REDACTED}", text)
