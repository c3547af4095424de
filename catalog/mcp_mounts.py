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
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    Field,
    Strict,
    StringConstraints,
    ValidationError,
    WrapValidator,
    field_validator,
)

from catalog.errors import LoadIssue, unknown_key
from catalog.handlers import HANDLER_PATH
from catalog.shapes import (
    NON_EMPTY,
    Names,
    OptionalText,
    Shape,
    in_document_order,
    problems,
    refuse,
    says,
)
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


def _override_message(value: Any, handler: Callable[[Any], Any]) -> Any:
    try:
        return handler(value)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        if not first["loc"]:
            raise refuse("must be a mapping of tool keys") from None
        raise refuse(unknown_key(str(first["loc"][0]), OVERRIDE_KEYS)) from None


class OverridesShape(Shape):
    """``defaults`` or ``tools.<name>``: tool definition keys, checked once the tool is
    known (:func:`tool_definition`, then :func:`catalog.tooldefs.parse_tool`)."""

    requires_approval: Any = None
    dangerous: Any = None
    mode: Any = None
    timeout: Any = None
    long_running: Any = None
    promote_after: Any = None
    dispatch_message: Any = None
    idempotent: Any = None
    read_only: Any = None
    sensitive: Any = None
    category: Any = None
    description: Any = None
    visibility: Any = None


Overrides = Annotated[OverridesShape, WrapValidator(_override_message)]


def _per_tool(value: Any, handler: Callable[[Any], Any]) -> Any:
    """Name the MCP tool in a bad override: ``tools.NAME: ...``."""
    if not isinstance(value, Mapping):
        raise refuse("must map MCP tool names to overrides")
    try:
        return handler({str(k): v for k, v in value.items()})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise refuse(f"tools.{first['loc'][0]}: {first['msg']}", whole=True) from None


def _http_url(value: Any) -> str:
    if isinstance(value, str) and value.strip():
        return "must be an http:// or https:// URL (Streamable HTTP)"
    return NON_EMPTY


def _is_handler_path(path: str) -> str:
    if not HANDLER_PATH.match(path):
        raise refuse(f"{path!r} is not a 'module:function' path")
    return path


StringMap = Annotated[
    dict[Annotated[str, Strict()], Annotated[str, Strict()]],
    Strict(),
    says("must map names to strings"),
]
Interval = Annotated[
    float,
    Field(strict=True, allow_inf_nan=False, gt=0),
    says("must be a number of seconds", greater_than="must be positive"),
]


class MountShape(Shape):
    """One ``mcp_servers`` entry as written (SPEC M1); :class:`MountSpec` documents each
    key. Which keys go together (stdio or HTTP) is :func:`_combination`'s check."""

    name: Annotated[str, StringConstraints(strict=True, pattern=SERVER_NAME.pattern)]
    command: OptionalText = None
    args: Names = []
    env: StringMap = {}
    cwd: Annotated[
        Annotated[str, StringConstraints(strict=True, min_length=1)] | None,
        says("must be a folder path"),
    ] = None
    url: Annotated[
        Annotated[str, StringConstraints(strict=True, pattern=r"^https?://")] | None,
        says(_http_url),
    ] = None
    headers: StringMap = {}
    prefix: Annotated[
        str, Strict(), says("must be a string ('' mounts the tools under their own names)")
    ] = ""
    capability: OptionalText = None
    include: Names = []
    exclude: Names = []
    defaults: Overrides = OverridesShape()
    tools: Annotated[dict[str, Overrides], WrapValidator(_per_tool)] = {}
    connect_timeout: Interval = 10.0
    health_interval: Interval = 15.0
    backoff_initial: Interval = 0.5
    backoff_max: Interval = 30.0
    sampling: Annotated[OptionalText, AfterValidator(lambda v: v and _is_handler_path(v))] = None

    @field_validator("command", "url", "capability", "sampling", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        """These keys may be left out, not written as null."""
        if value is None:
            raise refuse(NON_EMPTY)
        return value


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
    try:
        shape = MountShape.model_validate(entry)
    except ValidationError as exc:
        found = problems(exc, MountShape, not_mapping="")
        bad = {p.key for p in found}
        given = {str(key) for key in entry} - bad
        late = [p.text for p in found if p.key == "cwd"]
        texts = in_document_order([p for p in found if p.key != "cwd"], entry)
        texts += _combination(given, set(map(str, entry))) + late
        prefix = entry.get("prefix", f"{name}_") if "prefix" in given else f"{name}_"
        return MountSpec(name=name, source=source), texts + _prefix_problem(prefix)
    return _spec(shape, source, entry)


def _combination(given: set[str], written: set[str]) -> list[str]:
    """Keys that cannot go together: one transport, and each key for its own."""
    problems: list[str] = []
    if ("command" in given) == ("url" in given):
        problems.append("exactly one of command (stdio) or url (Streamable HTTP) is required")
    stdio_only = {"args", "env"} & given | ({"cwd"} & written)
    if "url" in given and stdio_only:
        problems.append(f"{', '.join(sorted(stdio_only))}: only for stdio servers (command)")
    if "command" in given and "headers" in given:
        problems.append("headers: only for Streamable HTTP servers (url)")
    return problems


def _prefix_problem(prefix: str) -> list[str]:
    if re.fullmatch(r"[A-Za-z0-9_-]*", prefix):
        return []
    return ["prefix: may only hold letters, digits, _ and -"]


def _spec(shape: MountShape, source: str, entry: Mapping[Any, Any]) -> tuple[MountSpec, list[str]]:
    given = {key for key in shape.model_fields_set if getattr(shape, key) is not None}
    prefix = shape.prefix if "prefix" in shape.model_fields_set else f"{shape.name}_"
    problems = _combination(given, set(map(str, entry))) + _prefix_problem(prefix)
    cwd = None if shape.cwd is None else str((Path(source).parent / shape.cwd).resolve())
    spec = MountSpec(
        name=shape.name,
        source=source,
        command=shape.command,
        args=tuple(shape.args),
        env=MappingProxyType(dict(shape.env)),
        cwd=cwd,
        url=shape.url,
        headers=MappingProxyType(dict(shape.headers)),
        prefix=prefix,
        capability=shape.capability or shape.name,
        include=tuple(shape.include),
        exclude=tuple(shape.exclude),
        defaults=_set(shape.defaults),
        overrides=MappingProxyType({k: _set(v) for k, v in shape.tools.items()}),
        connect_timeout=shape.connect_timeout,
        health_interval=shape.health_interval,
        backoff_initial=shape.backoff_initial,
        backoff_max=shape.backoff_max,
        sampling=shape.sampling,
    )
    return spec, problems


def _set(overrides: OverridesShape) -> Mapping[str, Any]:
    """Only the keys the file wrote: an unset key must not override an annotation."""
    return MappingProxyType({key: getattr(overrides, key) for key in overrides.model_fields_set})


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
