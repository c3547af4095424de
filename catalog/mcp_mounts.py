"""The ``mcp_servers`` key of a tools file: MCP servers mounted as tool sources (SPEC M1).

Sans-I/O like the rest of :mod:`catalog`: this module parses and checks the YAML and
turns one MCP ``tools/list`` entry into a tool definition mapping; connecting to the
servers is :mod:`gateway.mcp`'s job. A tools file may hold, beside ``tools``::

    mcp_servers:
      - name: everything                 # ^[A-Za-z0-9_-]{1,32}$, unique in the catalog
        command: node                    # stdio: command, args, env, cwd
        args: [server/index.js, stdio]
        env: {API_KEY: "${EVERYTHING_KEY}"}   # ${VAR} is read from toolbus's environment
        cwd: servers                     # relative to the tools file
      - name: remote
        url: http://127.0.0.1:3001/mcp   # Streamable HTTP
        headers: {Authorization: "Bearer ${REMOTE_TOKEN}"}
        prefix: remote_                  # tool name prefix; default "<name>_"
        capability: remote               # default: the server's name
        include: ["get-*"]               # fnmatch patterns of MCP tool names; default all
        exclude: [get-env]
        defaults: {timeout: 20}          # overrides for every tool of this server
        tools:                           # per MCP tool name (before the prefix)
          trigger-long-running-operation: {mode: async, dispatch_message: "On it."}
        sampling: my_llm:sample          # optional: answers sampling/createMessage

``${VAR}`` references are only resolved when connecting (:func:`expand_env`), so the
secrets never enter the catalog, its exports or a log line.
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from catalog.errors import LoadIssue, unknown_key
from catalog.handlers import HANDLER_PATH
from catalog.tooldefs import TOOL_NAME, from_mcp_tool

SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

OVERRIDE_KEYS = frozenset(
    {
        "requires_approval",
        "dangerous",
        "mode",
        "timeout",
        "long_running",
        "promote_after",
        "dispatch_message",
        "idempotent",
        "read_only",
        "sensitive",
        "category",
        "description",
        "visibility",
    }
)
"""Tool definition keys a server's ``defaults`` or ``tools.<name>`` may set (SPEC M1)."""


@dataclass(frozen=True, slots=True)
class MountSpec:
    """One mounted MCP server as configured (SPEC M1).

    Attributes:
        name: the server's id in the catalog, logs and ``toolbus check``.
        source: the tools file it was declared in.
        command: stdio transport: the executable; ``None`` for HTTP.
        args: stdio arguments.
        env: stdio extra environment (values may hold ``${VAR}`` references).
        cwd: stdio working folder (absolute), or ``None`` for toolbus's own.
        url: Streamable HTTP endpoint; ``None`` for stdio.
        headers: HTTP headers (values may hold ``${VAR}`` references).
        prefix: prepended to every MCP tool name to make the toolbus name.
        capability: the capability a profile must grant (SPEC C2).
        include: fnmatch patterns of MCP tool names to mount; ``()`` = all.
        exclude: fnmatch patterns of MCP tool names to leave out (wins over include).
        defaults: overrides applied to every tool of the server.
        overrides: MCP tool name -> overrides (win over ``defaults`` and annotations).
        connect_timeout: seconds allowed for connecting and listing tools.
        health_interval: seconds between liveness probes of a connected server.
        backoff_initial: first reconnect delay in seconds (doubles up to ``backoff_max``).
        backoff_max: longest reconnect delay in seconds.
        sampling: ``"module:function"`` answering the server's ``sampling/createMessage``
            (SPEC M3): called with the request's params as a JSON object, returns a
            ``CreateMessageResult`` object (sync or async). ``None``: refused.
    """

    name: str
    source: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    prefix: str = ""
    capability: str = ""
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}))
    connect_timeout: float = 10.0
    health_interval: float = 15.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    sampling: str | None = None

    @property
    def transport(self) -> str:
        """``"stdio"`` or ``"http"``."""
        return "stdio" if self.command is not None else "http"

    def wanted(self, mcp_name: str) -> bool:
        """Whether the MCP tool ``mcp_name`` passes ``include`` and ``exclude``."""
        if any(fnmatch.fnmatchcase(mcp_name, p) for p in self.exclude):
            return False
        return not self.include or any(fnmatch.fnmatchcase(mcp_name, p) for p in self.include)


class _Bad(ValueError):
    pass


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _Bad(f"{what}: must be a list of non-empty strings")
    return tuple(value)


def _string_map(value: Any, what: str) -> Mapping[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _Bad(f"{what}: must map names to strings")
    return MappingProxyType(dict(value))


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Bad(f"{what}: must be a number of seconds")
    if value <= 0:
        raise _Bad(f"{what}: must be positive")
    return float(value)


def _overrides(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Bad(f"{what}: must be a mapping of tool keys")
    for key in value:
        if str(key) not in OVERRIDE_KEYS:
            raise _Bad(f"{what}: " + unknown_key(str(key), OVERRIDE_KEYS))
    return MappingProxyType(dict(value))


def _per_tool(value: Any) -> Mapping[str, Mapping[str, Any]]:
    if not isinstance(value, Mapping):
        raise _Bad("tools: must map MCP tool names to overrides")
    return MappingProxyType({str(k): _overrides(v, f"tools.{k}") for k, v in value.items()})


_SCALARS: dict[str, Any] = {
    "command": lambda v: _text(v, "command"),
    "args": lambda v: _strings(v, "args"),
    "env": lambda v: _string_map(v, "env"),
    "url": lambda v: _url(v),
    "headers": lambda v: _string_map(v, "headers"),
    "prefix": lambda v: _prefix(v),
    "capability": lambda v: _text(v, "capability"),
    "include": lambda v: _strings(v, "include"),
    "exclude": lambda v: _strings(v, "exclude"),
    "defaults": lambda v: _overrides(v, "defaults"),
    "tools": _per_tool,
    "connect_timeout": lambda v: _seconds(v, "connect_timeout"),
    "health_interval": lambda v: _seconds(v, "health_interval"),
    "backoff_initial": lambda v: _seconds(v, "backoff_initial"),
    "backoff_max": lambda v: _seconds(v, "backoff_max"),
    "sampling": lambda v: _sampler(v),
}
"""Key -> parser for one ``mcp_servers`` entry (besides ``name`` and ``cwd``)."""

_FIELD = {"tools": "overrides"}


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Bad(f"{what}: must be a non-empty string")
    return value


def _sampler(value: Any) -> str:
    path = _text(value, "sampling")
    if not HANDLER_PATH.match(path):
        raise _Bad(f"sampling: {path!r} is not a 'module:function' path")
    return path


def _prefix(value: Any) -> str:
    if not isinstance(value, str):
        raise _Bad("prefix: must be a string ('' mounts the tools under their own names)")
    return value


def _url(value: Any) -> str:
    url = _text(value, "url")
    if not url.startswith(("http://", "https://")):
        raise _Bad("url: must be an http:// or https:// URL (Streamable HTTP)")
    return url


def parse_mounts(raw: Any, source: str) -> tuple[list[MountSpec], list[LoadIssue]]:
    """Parse a tools file's ``mcp_servers`` list (SPEC M1).

    Args:
        raw: the YAML value of ``mcp_servers``.
        source: the file, for issues and to resolve a relative ``cwd``.

    Returns:
        The valid servers and an issue per problem (``mcp:NAME`` as the "tool").
    """
    if not isinstance(raw, list):
        return [], [LoadIssue(source, None, "mcp_servers: must be a list of servers")]
    specs: list[MountSpec] = []
    issues: list[LoadIssue] = []
    for index, entry in enumerate(raw):
        spec, problems = _parse_one(entry, source, index)
        who = f"mcp:{spec.name}" if spec is not None else f"mcp_servers[{index}]"
        issues.extend(LoadIssue(source, who, p) for p in problems)
        if spec is not None and not problems:
            specs.append(spec)
    return specs, issues


def _parse_one(entry: Any, source: str, index: int) -> tuple[MountSpec | None, list[str]]:
    if not isinstance(entry, Mapping):
        return None, ["must be a mapping with name and command or url"]
    name = entry.get("name")
    if not isinstance(name, str) or not SERVER_NAME.match(name):
        return None, [f"name: {name!r} must match {SERVER_NAME.pattern}"]
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in entry.items():
        key = str(key)
        if key in ("name", "cwd"):
            continue
        parser = _SCALARS.get(key)
        if parser is None:
            problems.append(unknown_key(key, {"name", "cwd", *_SCALARS}))
            continue
        try:
            values[_FIELD.get(key, key)] = parser(value)
        except _Bad as exc:
            problems.append(str(exc))
    if ("command" in values) == ("url" in values):
        problems.append("exactly one of command (stdio) or url (Streamable HTTP) is required")
    stdio_only = {"args", "env"} & set(values) | ({"cwd"} & set(map(str, entry)))
    if "url" in values and stdio_only:
        problems.append(f"{', '.join(sorted(stdio_only))}: only for stdio servers (command)")
    if "command" in values and "headers" in values:
        problems.append("headers: only for Streamable HTTP servers (url)")
    cwd = entry.get("cwd")
    if cwd is not None:
        if not isinstance(cwd, str) or not cwd:
            problems.append("cwd: must be a folder path")
        else:
            values["cwd"] = str((Path(source).parent / cwd).resolve())
    values.setdefault("prefix", f"{name}_")
    values.setdefault("capability", name)
    if not re.fullmatch(r"[A-Za-z0-9_-]*", values["prefix"]):
        problems.append("prefix: may only hold letters, digits, _ and -")
    return MountSpec(name=name, source=source, **values), problems


class UnsetVariable(KeyError):
    """A ``${VAR}`` of a mount's ``env`` or ``headers`` names a variable that is not set
    (SPEC M1). ``str()`` is the plain one-line message (a bare ``KeyError`` would quote
    it); :attr:`var` is the variable's name."""

    def __init__(self, var: str) -> None:
        super().__init__(var)
        self.var = var

    def __str__(self) -> str:
        return f"environment variable {self.var} is not set"


def expand_env(value: str, environ: Mapping[str, str] | None = None) -> str:
    """Replace each ``${VAR}`` in ``value`` with the environment variable (SPEC M1).

    Raises:
        UnsetVariable: (a ``KeyError``) naming the first variable that is not set (its
            name only; values are secrets and never appear in messages).
    """
    env = os.environ if environ is None else environ

    def one(match: re.Match[str]) -> str:
        var = match.group(1)
        if var not in env:
            raise UnsetVariable(var)
        return env[var]

    return _ENV_REF.sub(one, value)


def tool_definition(spec: MountSpec, entry: Mapping[str, Any]) -> dict[str, Any]:
    """The toolbus definition mapping of one MCP ``tools/list`` entry (SPEC M1).

    Defaults come from the annotations (:func:`catalog.tooldefs.from_mcp_tool`):
    ``destructiveHint: true`` (and not read-only) makes the tool ``dangerous`` and
    ``requires_approval``; ``readOnlyHint`` -> ``read_only``; ``idempotentHint`` ->
    ``idempotent`` (a job cut off by a restart is re-run, SPEC J5). Then the server's
    ``defaults``, then the tool's own overrides, win.

    Returns:
        A mapping for :func:`catalog.tooldefs.parse_tool` (no ``handler``), named
        ``prefix + MCP name``; the name may still be invalid (then parsing says why).
    """
    definition = from_mcp_tool(entry, capability=spec.capability)
    mcp_name = str(entry.get("name"))
    definition["name"] = spec.prefix + mcp_name
    if definition.get("dangerous"):
        definition["requires_approval"] = True
    definition.update(spec.defaults)
    definition.update(spec.overrides.get(mcp_name, {}))
    if definition.get("dangerous") and definition.get("read_only"):
        definition.pop("read_only")
    return definition


def valid_name(spec: MountSpec, mcp_name: str) -> bool:
    """Whether ``prefix + mcp_name`` is a legal toolbus tool name (SPEC C4 names)."""
    return bool(TOOL_NAME.match(spec.prefix + mcp_name))
