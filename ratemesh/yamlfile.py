"""The one way a configuration or scenario file is read: YAML, with every failure a
`ConfigError` that names the file and says what is wrong with it.

A file is refused, never half-read, when it cannot be read (missing, no permission, a
directory), is larger than `YAML_BYTES_MAX`, is not UTF-8 (the byte offset is named), is not
valid YAML (line and column), nests deeper than `YAML_DEPTH_MAX`, or expands to more than
`YAML_NODES_MAX` values (both counting what aliases expand to: a "billion laughs" file of a
few lines is a tree of billions of values to anything that walks it). Depth is checked on
the event stream, which PyYAML parses without recursion, before anything recursive
(composing, constructing, our own validators) sees the document.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ratemesh.errors import ConfigError, RatemeshError

__all__ = ["YAML_BYTES_MAX", "YAML_DEPTH_MAX", "YAML_NODES_MAX", "load_yaml"]

# A config or scenario file is a few KiB; a larger one is a mistake (or a log file).
YAML_BYTES_MAX = 4 * 1024 * 1024
# Our deepest legitimate shape (a tenant's defaults' children) is under 10 levels.
YAML_DEPTH_MAX = 64
# Values in the document as its readers see it, aliases expanded: 4 MiB of plain YAML holds
# well under a million; past that, only aliases of aliases get there.
YAML_NODES_MAX = 1_000_000

_OS_PROBLEMS: tuple[tuple[type[OSError], str], ...] = (
    (FileNotFoundError, "no such file"),
    (IsADirectoryError, "is a directory, not a file"),
    (PermissionError, "permission denied"),
)


def load_yaml(
    path: str | Path, *, field: str = "config", error: type[RatemeshError] = ConfigError
) -> Any:
    """Read `path` and return its one YAML document (None for an empty file).

    Raises `error(field, ...)` (a `ConfigError` unless a family derived from it is given)
    whose message names the file; `field` says which setting named it (`policies.file`)."""
    p = Path(path)
    try:
        return _load(p, field)
    except ConfigError as exc:
        if error is ConfigError:
            raise
        raise error(exc.field, exc.problem) from exc.__cause__


def _load(p: Path, field: str) -> Any:
    text = _read_text(p, field)
    _check_events(text, p, field)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_node_depth(node, p, field)
        _check_expanded_size(node, p, field)
        return loader.construct_document(node)
    except ConfigError:
        raise
    except yaml.YAMLError as exc:
        raise ConfigError(field, f"{p} is not valid YAML: {_where(exc)}") from exc
    except RecursionError:  # not reachable past the checks above; kept as the last guard
        raise ConfigError(field, _too_deep(p)) from None
    except ValueError as exc:  # e.g. a timestamp-shaped value that is no date: 2024-13-45
        raise ConfigError(field, f"{p} is not valid YAML: {exc}") from exc
    finally:
        loader.dispose()


def _read_text(p: Path, field: str) -> str:
    try:
        with p.open("rb") as f:
            raw = f.read(YAML_BYTES_MAX + 1)
    except OSError as exc:
        problem = next((text for kind, text in _OS_PROBLEMS if isinstance(exc, kind)), None)
        raise ConfigError(field, f"cannot read {p}: {problem or exc.strerror or exc}") from exc
    if len(raw) > YAML_BYTES_MAX:
        raise ConfigError(field, f"{p} is larger than {YAML_BYTES_MAX} bytes (4 MiB)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            field, f"{p} is not UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start}"
        ) from None


def _check_events(text: str, p: Path, field: str) -> None:
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > YAML_DEPTH_MAX:
                    line = event.start_mark.line + 1 if event.start_mark else 0
                    raise ConfigError(field, f"{_too_deep(p)} (line {line})")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError as exc:
        raise ConfigError(field, f"{p} is not valid YAML: {_where(exc)}") from exc


def _check_node_depth(root: yaml.Node, p: Path, field: str) -> None:
    """Depth as constructed: an alias can nest a whole anchored tree (or itself) again.
    Iterative; a node is revisited only at a greater depth, so the walk is bounded by
    YAML_DEPTH_MAX times the number of nodes."""
    deepest: dict[int, int] = {}
    stack: list[tuple[yaml.Node, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, yaml.CollectionNode):
            continue
        depth += 1
        if depth > YAML_DEPTH_MAX:
            raise ConfigError(field, f"{_too_deep(p)} (line {node.start_mark.line + 1})")
        if deepest.get(id(node), 0) >= depth:
            continue
        deepest[id(node)] = depth
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth) for child in node.value)
        else:
            for key, value in node.value:
                stack.extend(((key, depth), (value, depth)))


def _check_expanded_size(root: yaml.Node, p: Path, field: str) -> None:
    """How many values the document has with every alias expanded, counted on the node
    graph (each node once, bottom up; aliases make it a DAG, and the depth check has
    already refused cycles deeper than YAML_DEPTH_MAX), without expanding anything."""
    size: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in size:
            continue
        children = _children(node)
        if not done:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in size)
            continue
        total = 1 + sum(size.get(id(c), 0) for c in children)
        if total > YAML_NODES_MAX:
            raise ConfigError(
                field,
                f"{p} expands to more than {YAML_NODES_MAX} values through its aliases "
                f"(line {node.start_mark.line + 1})",
            )
        size[id(node)] = total


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _too_deep(p: Path) -> str:
    return f"{p} nests deeper than {YAML_DEPTH_MAX} levels"


def _where(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = exc.problem or exc.context or "syntax error"
        return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    return str(exc)
