"""Tool catalog: definitions, profiles, visibility, parameter validation, exports.

Sans-I/O apart from reading its own files: imports no ``gateway``, asyncio, sockets or
clock. Modules, one concept each:

- :mod:`catalog.model`: the records (:class:`ToolDef`, :class:`Profile`, :class:`Catalog`).
- :mod:`catalog.loader`: YAML files -> :class:`Catalog`, every problem reported (SPEC C1, C2).
- :mod:`catalog.tooldefs`, :mod:`catalog.profiles`, :mod:`catalog.handlers`,
  :mod:`catalog.yamlio`: the loader's parts.
- :mod:`catalog.visibility`: the one access check (SPEC C2, C3, I2).
- :mod:`catalog.params`: argument validation with JSON pointers (SPEC I4).
- :mod:`catalog.exports`: wire shape, version hash, model-facing formats, suggestions
  (SPEC C3, C4, I1).
"""

from __future__ import annotations

from catalog.errors import CatalogError, LoadIssue
from catalog.exports import (
    EXPORTERS,
    catalog_version,
    suggest,
    to_anthropic,
    to_mcp,
    to_openai_chat,
    to_openai_realtime,
    tool_info,
)
from catalog.loader import load_catalog, load_tool_dicts
from catalog.model import Catalog, Mode, Profile, ToolDef, Visibility
from catalog.params import ParamValidator, Violation, validators_for
from catalog.tooldefs import from_mcp_tool
from catalog.visibility import Denial, Scope, check_access, visible_tools

__all__ = [
    "EXPORTERS",
    "Catalog",
    "CatalogError",
    "Denial",
    "LoadIssue",
    "Mode",
    "ParamValidator",
    "Profile",
    "Scope",
    "ToolDef",
    "Violation",
    "Visibility",
    "catalog_version",
    "check_access",
    "from_mcp_tool",
    "load_catalog",
    "load_tool_dicts",
    "suggest",
    "to_anthropic",
    "to_mcp",
    "to_openai_chat",
    "to_openai_realtime",
    "tool_info",
    "validators_for",
    "visible_tools",
]
