"""Load YAML keeping the line of every mapping key and value, so config errors can name file:line; refusing what
YAML allows but no pipelines.yaml needs: aliases that expand past MAX_EXPANDED_VALUES values, a recursive alias,
and a file that is not UTF-8 text."""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any

import yaml

from bcp_pipeline.errors import ConfigError

# Values a document may hold with its aliases expanded: the bundled pipelines.yaml, with its nine pipelines, holds
# 2,608. PyYAML builds an alias once and shares it, but whatever walks the loaded values (the loader's checks, an
# error message showing one) visits each use: nine anchors of nine aliases each are 9^9 values, and `plan` ran for
# minutes and 6 GB on such a file (issue 50, a "billion laughs").
MAX_EXPANDED_VALUES = 100_000
BYTE_ORDER_MARKS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


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


class ExpansionError(yaml.composer.ComposerError):
    """Aliases that expand past MAX_EXPANDED_VALUES, or that refer to the value they are in."""


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts the values of the document as its aliases expand them, and refuses past the bound
    while composing, before anything is built or walked."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._expanded = 0  # values of the document so far, each alias counted as the values it stands for
        self._sizes: dict[int, int] = {}  # id(node) -> its values, aliases expanded (a composed node never changes)
        self._open: set[str] = set()  # anchors of the nodes being composed: an alias to one is recursive

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise ExpansionError(
                    None,
                    None,
                    f"the alias *{event.anchor} is inside the value it names (a "
                    "recursive alias): no pipelines.yaml value holds itself",
                    event.start_mark,
                )
            node = super().compose_node(parent, index)
            self._count(_expanded_size(node, self._sizes), f"*{event.anchor}", event.start_mark)
            return node
        if event.anchor is not None:
            self._open.add(event.anchor)
        node = super().compose_node(parent, index)
        self._open.discard(event.anchor)
        self._count(1, None, event.start_mark)
        return node

    def _count(self, values: int, alias: str | None, mark: Any) -> None:
        self._expanded += values
        if self._expanded > MAX_EXPANDED_VALUES:
            what = f"the alias {alias} stands for {values:,} values, and " if alias else ""
            raise ExpansionError(
                None,
                None,
                f"{what}the document holds more than {MAX_EXPANDED_VALUES:,} values with "
                'its aliases expanded (a YAML "billion laughs"?): write the values out, or alias '
                "less",
                mark,
            )


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """The values `node` stands for with the aliases in it expanded (memoised: each distinct node is counted once)."""
    if id(node) not in sizes:
        if isinstance(node, yaml.SequenceNode):
            sizes[id(node)] = 1 + sum(_expanded_size(child, sizes) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            sizes[id(node)] = 1 + sum(_expanded_size(k, sizes) + _expanded_size(v, sizes) for k, v in node.value)
        else:
            sizes[id(node)] = 1
    return sizes[id(node)]


class _LineLoader(BoundedLoader):
    """SafeLoader that builds LineDict/LineList; also rejects duplicate keys (a silent override otherwise)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> LineDict:
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
                        None,
                        None,
                        f"duplicate key {key!r} (first on line {mapping.key_lines[key]})",
                        key_node.start_mark,
                    )
                explicit_keys.add(key)
            mapping[key] = self.construct_object(value_node, deep=True)
            mapping.key_lines[key] = key_node.start_mark.line + 1
        return mapping

    def construct_sequence(self, node: yaml.SequenceNode, deep: bool = False) -> LineList:
        items = LineList(self.construct_object(child, deep=True) for child in node.value)
        items.line = node.start_mark.line + 1
        items.item_lines = [child.start_mark.line + 1 for child in node.value]
        return items


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _LineLoader.construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _LineLoader.construct_sequence)


def load_yaml_with_lines(path: Path) -> Any:
    """Parse `path`; a syntax error is raised as yaml.YAMLError carrying its mark (the caller adds the file), a file
    that is not UTF-8 text as a ConfigError naming it and the byte offset."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bom = next((name for mark, name in BYTE_ORDER_MARKS if data.startswith(mark)), None)
        raise ConfigError(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}"
            + (f" (it starts with a {bom} byte order mark: it is {bom} text)" if bom else "")
            + "; save it as UTF-8",
            file=str(path),
        ) from None
    try:
        return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - _LineLoader derives from SafeLoader
    except yaml.reader.ReaderError as exc:  # a control character (a binary file?): YAML reads printable text only
        offset = len(text[: exc.position].encode("utf-8"))
        raise ConfigError(
            f"not a text file: character 0x{exc.character:02x} at byte offset {offset} ({exc.reason})", file=str(path)
        ) from None


def line_of(container: Any, key: Any) -> int | None:
    """Line of `key` in a LineDict / index in a LineList, else the container's own line, else None."""
    if isinstance(container, LineDict):
        return container.line_of(key)
    if isinstance(container, LineList) and isinstance(key, int):
        return container.line_of(key)
    return getattr(container, "line", None)
