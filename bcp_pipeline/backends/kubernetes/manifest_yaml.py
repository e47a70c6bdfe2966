"""Manifests as `plan` prints them and `run` records them: YAML documents, readable as a kubectl user writes them."""

from __future__ import annotations

from typing import Any

import yaml


class _NoAliasDumper(yaml.SafeDumper):
    """Writes a value shared by two places (one labels dict in metadata and selector) out twice: `&id001`/`*id001`
    anchors are valid YAML but unreadable in `plan`, and kubectl users never write them."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def printable(objects: list[dict[str, Any]]) -> str:
    """The manifests as YAML documents, exactly as submitted (key order kept, no anchors)."""
    return yaml.dump_all(objects, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, width=120)
