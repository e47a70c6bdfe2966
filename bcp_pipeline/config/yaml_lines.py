"""Load YAML keeping the line of every mapping key and value, so config errors can name file:line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class LineDict(dict):
    """A dict from YAML that remembers where it and each of its keys were written (1-based lines)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.line = getattr(args[0], "line", 0) if args else 0
        self.key_lines: dict[str, int] = dict(getattr(args[0], "key_lines", {})) if args else {}

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


class LineList(list):
    """A list from YAML with the line it started on and the line of each item."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.line = 0
        self.item_lines: list[int] = []

    def line_of(self, index: int) -> int:
        return self.item_lines[index] if index < len(self.item_lines) else self.line


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that builds LineDict/LineList; also rejects duplicate keys (a silent override otherwise)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> LineDict:  # type: ignore[override]
        explicit_count = sum(1 for key_node, _ in node.value if key_node.tag != "tag:yaml.org,2002:merge")
        self.flatten_mapping(node)  # puts the pairs of `<<: *anchor` merges first; explicit keys then override them
        merged_count = len(node.value) - explicit_count
        mapping = LineDict()
        mapping.line = node.start_mark.line + 1
        mapping.key_lines = {}
        explicit_keys: set = set()
        for index, (key_node, value_node) in enumerate(node.value):
            key = self.construct_object(key_node, deep=True)
            if index >= merged_count:
                if key in explicit_keys:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first on line {mapping.key_lines[key]})",
                        key_node.start_mark)
                explicit_keys.add(key)
            mapping[key] = self.construct_object(value_node, deep=True)
            mapping.key_lines[key] = key_node.start_mark.line + 1
        return mapping

    def construct_sequence(self, node: yaml.SequenceNode, deep: bool = False) -> LineList:  # type: ignore[override]
        items = LineList(self.construct_object(child, deep=True) for child in node.value)
        items.line = node.start_mark.line + 1
        items.item_lines = [child.start_mark.line + 1 for child in node.value]
        return items


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _LineLoader.construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _LineLoader.construct_sequence)


def load_yaml_with_lines(path: Path) -> Any:
    """Parse `path`; a syntax error is raised as yaml.YAMLError carrying its mark (the caller adds the file)."""
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=_LineLoader)  # noqa: S506 - _LineLoader derives from SafeLoader


def line_of(container: Any, key: Any) -> int | None:
    """Line of `key` in a LineDict / index in a LineList, else the container's own line, else None."""
    if isinstance(container, LineDict):
        return container.line_of(key)
    if isinstance(container, LineList) and isinstance(key, int):
        return container.line_of(key)
    return getattr(container, "line", None)
