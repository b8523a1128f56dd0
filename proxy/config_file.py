"""The YAML config file read with bounds: its size, nesting and alias-expanded values, and never read as empty."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.events import CollectionEndEvent, CollectionStartEvent, Event, NodeEvent
from yaml.nodes import MappingNode, Node, SequenceNode

# Configs are small: the example with every key and its comments is 10 KB, the deploy ones 1 KB. 256 KiB is 25
# examples, and PyYAML parses that much real config (model entries) in about a second; 1 MiB took 5 s. Anything
# larger is a mistake (a log, a binary written over the config) and is refused from its head, never read whole.
MAX_BYTES = 256 * 1024
# Settings nest four deep (compaction.summarizer.upstream.base_url). The bound keeps every recursive walk of the
# tree (the composer, interpolate_env, pydantic) far from Python's recursion limit, aliases included.
MAX_DEPTH = 64
# Values (scalars and collections) with aliases expanded: four times what MAX_BYTES of model entries holds (~10
# bytes a value), so a file is refused for it only when its aliases multiply it ("billion laughs").
MAX_VALUES = 100_000


class ConfigError(Exception):
    """A config file that cannot be used; the message names every offending dotted path."""


def read_head(path: Path) -> bytes:
    """The file's first MAX_BYTES + 1 bytes: enough to tell it is too large without reading it all."""
    with path.open("rb") as file:
        return file.read(MAX_BYTES + 1)


def read_tree(path: Path) -> dict[str, Any]:
    """The file's top-level mapping as parsed (before ${ENV} interpolation and defaults), or a ConfigError."""
    try:
        data = read_head(path)
    except OSError as error:
        raise ConfigError(f"cannot read config {path}: {error.strerror}") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(f"config {path} is larger than {MAX_BYTES // 1024} KiB: is it the config file?")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"config {path} is not UTF-8 text: {error.reason} at byte {error.start}") from None
    tree = _parse(text, f"config {path}")
    if tree is None:
        # An editor's non-atomic save passes through this state; applied, it would drop keys and upstream alike.
        raise ConfigError(f"config {path} is empty (nothing but whitespace, comments or null), so it says nothing: "
                          "to run on every default on purpose, write `{}` in it")
    if not isinstance(tree, dict):
        raise ConfigError(f"config {path} must be a mapping at the top level")
    return tree


def _parse(text: str, what: str) -> Any:
    try:
        loader = _BoundedLoader(text, what)  # which refuses a control character already
        try:
            root = loader.get_single_node()
            if root is None:
                return None
            _check_expanded(root, what)
            return loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as error:
        # Not str(error): it quotes the offending line, which may hold a key.
        mark = error.problem_mark or error.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        context = f"{error.context}: " if error.context else ""
        raise ConfigError(f"{what} is not valid YAML: {context}{error.problem or 'cannot be parsed'}{where}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{what} is not valid YAML: {error}") from None
    except ValueError as error:  # a date that does not exist, an integer of more digits than Python converts
        raise ConfigError(f"{what}: a value cannot be read: {error}") from None


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader (yaml.safe_load's: libyaml's is 25 times faster but draws the line between valid and
    not elsewhere, both ways, and a file must load as it did before) counting the events its composer takes.
    The composer recurses once per level, so a file is refused at the level past MAX_DEPTH, before the recursion
    goes deeper, and at the value past MAX_VALUES, before it holds more."""

    def __init__(self, text: str, what: str) -> None:
        super().__init__(text)
        self._what = what
        self._depth = self._values = 0

    def get_event(self) -> Event:
        event: Event = super().get_event()  # type: ignore[no-untyped-call]  # the stub leaves it untyped
        if isinstance(event, NodeEvent):
            self._values += 1
            if self._values > MAX_VALUES:
                raise ConfigError(f"{self._what} has more than {MAX_VALUES:,} values")
        if isinstance(event, CollectionStartEvent):
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise ConfigError(f"{self._what} is nested deeper than {MAX_DEPTH} levels")
        elif isinstance(event, CollectionEndEvent):
            self._depth -= 1
        return event


def _check_expanded(root: Node, what: str) -> None:
    """Values and nesting as every alias expanded would have them (what the tree's walkers will see), counted once
    per node: an alias bomb is refused without being expanded, and an alias inside its own anchor as well."""
    measured: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth) of the node expanded
    open_nodes: set[int] = set()  # the node being walked and its ancestors
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        children = _children(node)
        if children_done:
            values = 1 + sum(measured[id(child)][0] for child in children)
            nested = isinstance(node, MappingNode | SequenceNode)
            depth = 1 + max((measured[id(child)][1] for child in children), default=0) if nested else 0
            if values > MAX_VALUES:
                raise ConfigError(f"{what} has more than {MAX_VALUES:,} values once its aliases are expanded")
            if depth > MAX_DEPTH:
                raise ConfigError(f"{what} is nested deeper than {MAX_DEPTH} levels once its aliases are expanded")
            measured[id(node)] = (values, depth)
            open_nodes.discard(id(node))
        elif id(node) in open_nodes:
            raise ConfigError(f"{what} has an alias that refers to itself (inside its own anchor)")
        elif id(node) not in measured:
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in children)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []
