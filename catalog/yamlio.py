"""Reading catalog YAML strictly: safe types only, duplicate keys refused (SPEC C1).

PyYAML's safe loader keeps the last of two equal mapping keys without a word; in a tool
definition that silently drops half of what someone wrote, so a duplicate key is an
error here.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml


class YamlError(ValueError):
    """A file could not be read or parsed; the message says where."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys in a mapping."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            # A YAML list or mapping as a key (``{[a]: 1}``): a load issue, not a
            # TypeError out of `check` or the hot-reload watcher (SPEC C1, O5).
            line = key_node.start_mark.line + 1
            raise YamlError(f"line {line}: a {type(key).__name__} cannot be a mapping key")
        if key in seen:
            line = key_node.start_mark.line + 1
            raise YamlError(f"line {line}: duplicate key {key!r}")
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def read_yaml(path: Path) -> Any:
    """Parse one YAML file.

    Args:
        path: the file to read (UTF-8).

    Returns:
        The document (``None`` for an empty file).

    Raises:
        YamlError: unreadable file, invalid YAML, or a duplicate mapping key.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise YamlError(f"cannot read file: {exc}") from exc
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: safe types only
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = "; ".join(part for part in (exc.context, exc.problem) if part)
        raise YamlError(f"invalid YAML: {where}{what}") from exc
    except yaml.YAMLError as exc:
        raise YamlError(f"invalid YAML: {exc}".replace("\n", " ")) from exc
