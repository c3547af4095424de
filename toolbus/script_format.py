"""The script file format: reading and checking a scripted conversation (SPEC K3).

:func:`load_script` turns a YAML file into a :class:`Script` of :class:`Step` s, one
kind per step (:data:`KINDS`), and raises :class:`ScriptError` naming the file and the
step when the file breaks the format. The format is documented in ``docs/scripts.md``
and summed up in :mod:`toolbus.script`; matching ``expect`` patterns lives in
:mod:`toolbus.script_match`, running the steps in :mod:`toolbus.script_runner`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

DEFAULT_TIMEOUT: Final = 5.0
"""Seconds an ``expect`` or ``expect_close`` waits unless the step says ``timeout``."""

KINDS: Final = (
    "send",
    "send_raw",
    "send_bytes_hex",
    "send_binary_hex",
    "expect",
    "expect_close",
    "disconnect",
    "resume",
    "elicit",
)
OPTIONS: Final = frozenset({"timeout", "strict", "forbid", "note"})


ELICIT_KEYS: Final = frozenset({"request", "action", "content", "result"})
"""Keys of an ``elicit`` step (SPEC M3, K3)."""
ELICIT_ACTIONS: Final = ("accept", "decline", "cancel")


class ScriptError(Exception):
    """A script file that does not follow the format (reported with file and step)."""


@dataclass(frozen=True, slots=True)
class Step:
    """One step: ``kind`` (see :data:`KINDS`), its ``value`` and options."""

    index: int
    kind: str
    value: Any
    timeout: float = DEFAULT_TIMEOUT
    strict: bool = False
    forbid: tuple[Any, ...] = ()
    note: str | None = None


@dataclass(frozen=True, slots=True)
class Script:
    """A parsed script file.

    Attributes:
        name: the ``name`` key (defaults to the file name).
        path: where it was read from.
        token: ``connect.token``: the credential of the automatic ``hello`` and of
            ``resume``; available to steps as ``${token}``.
        profile: ``connect.profile``.
        context: ``connect.context`` (object of strings).
        options: ``connect.options`` (e.g. ``{confirm_tool_calls: true}``).
        hello: ``connect.hello`` (default true): send ``hello`` right after connecting.
        steps: the steps in order.
    """

    name: str
    path: Path
    token: str | None
    profile: str | None
    context: dict[str, str]
    options: dict[str, Any]
    hello: bool
    steps: list[Step]


def load_script(path: Path | str) -> Script:
    """Read and check a script file.

    Raises:
        ScriptError: unreadable YAML or a step that breaks the format, naming the file
            and the step index (1-based).
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ScriptError(f"{path}: cannot read: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
        raise ScriptError(f"{path}: a script is a mapping with a 'steps' list")
    unknown = set(data) - {"name", "connect", "steps"}
    if unknown:
        raise ScriptError(f"{path}: unknown top-level keys {sorted(unknown)}")
    connect = data.get("connect") or {}
    if not isinstance(connect, dict) or set(connect) - {
        "token",
        "profile",
        "context",
        "options",
        "hello",
    }:
        raise ScriptError(f"{path}: 'connect' takes token, profile, context, options, hello")
    steps = [_parse_step(path, i, raw) for i, raw in enumerate(data["steps"], start=1)]
    return Script(
        name=str(data.get("name") or path.stem),
        path=path,
        token=connect.get("token"),
        profile=connect.get("profile"),
        context=dict(connect.get("context") or {}),
        options=dict(connect.get("options") or {}),
        hello=bool(connect.get("hello", True)),
        steps=steps,
    )


def _parse_step(path: Path, index: int, raw: Any) -> Step:
    where = f"{path}: step {index}"
    if not isinstance(raw, dict):
        raise ScriptError(f"{where}: a step is a mapping")
    kinds = [k for k in raw if k in KINDS]
    if len(kinds) != 1:
        raise ScriptError(f"{where}: exactly one of {', '.join(KINDS)} (got {sorted(raw)})")
    unknown = set(raw) - OPTIONS - set(KINDS)
    if unknown:
        raise ScriptError(f"{where}: unknown keys {sorted(unknown)} (options: {sorted(OPTIONS)})")
    kind = kinds[0]
    value = raw[kind]
    checks: dict[str, Callable[[Any], bool]] = {
        "send": lambda v: isinstance(v, dict),
        "send_raw": lambda v: isinstance(v, str),
        "send_bytes_hex": _is_hex,
        "send_binary_hex": _is_hex,
        "expect": lambda v: isinstance(v, dict),
        "expect_close": lambda v: v is True or isinstance(v, dict),
        "disconnect": lambda v: v is True,
        "resume": lambda v: v is True or isinstance(v, dict),
        "elicit": _is_elicit,
    }
    if not checks[kind](value):
        raise ScriptError(f"{where}: bad value for {kind!r}: {value!r}")
    forbid = raw.get("forbid") or []
    if not isinstance(forbid, list):
        raise ScriptError(f"{where}: 'forbid' is a list of patterns")
    return Step(
        index=index,
        kind=kind,
        value=value,
        timeout=float(raw.get("timeout", DEFAULT_TIMEOUT)),
        strict=bool(raw.get("strict", False)),
        forbid=tuple(forbid),
        note=raw.get("note"),
    )


def _is_elicit(value: Any) -> bool:
    """``{request?: pattern, action: accept|decline|cancel, content?: object (accept
    only), result?: pattern}``."""
    return (
        isinstance(value, dict)
        and set(value) <= ELICIT_KEYS
        and value.get("action") in ELICIT_ACTIONS
        and isinstance(value.get("request", {}), dict)
        and isinstance(value.get("result", {}), dict)
        and (
            "content" not in value
            or (value["action"] == "accept" and isinstance(value["content"], dict))
        )
    )


def _is_hex(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return True
