"""Pre- and post-execute hooks (SPEC I6, I10).

A pre-execute hook sees a :class:`CallInfo` and returns ``None`` (allow) or a
:class:`Deny` with a human reason and a stable ``reason_code``; hooks run in
registration order and the first deny ends the call. A post-execute hook sees the call
and the result object and returns ``None`` to keep it or a new object to replace it
(e.g. redaction); a replaced result says so on the wire (``replaced: true``). Hooks may
be plain functions or coroutine functions; configure them as ``module:function``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from catalog.handlers import ImportFailed, import_guarded
from catalog.model import ToolDef


@dataclass(frozen=True, slots=True)
class CallInfo:
    """What a hook knows about a call (SPEC I5 identity, never the model's claims)."""

    session_id: str
    user: str
    profile: str
    call_id: str
    tool: ToolDef
    params: Mapping[str, Any]
    context: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Deny:
    """A pre-execute hook's refusal (SPEC I6)."""

    reason: str
    reason_code: str


PreHook = Callable[[CallInfo], "Deny | Awaitable[Deny | None] | None"]
PostHook = Callable[
    [CallInfo, dict[str, Any]], "dict[str, Any] | Awaitable[dict[str, Any] | None] | None"
]


def resolve(path: str) -> Callable[..., Any]:
    """Import a ``module:function`` path.

    Raises:
        ValueError: the path is malformed, or the module or attribute is missing.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"hook {path!r} is not 'module:function'")
    try:
        # Guarded: a hook module raising SystemExit at import is a load error (SPEC O5).
        target = getattr(import_guarded(module_name), attr)
    except (ImportFailed, AttributeError) as exc:
        raise ValueError(f"hook {path!r} cannot be imported: {exc}") from exc
    if not callable(target):
        raise ValueError(f"hook {path!r} is not callable")
    return target  # type: ignore[no-any-return]


async def run_pre(
    hooks: Sequence[PreHook], call: CallInfo, waits: Callable[[], None] | None = None
) -> Deny | None:
    """Run pre-execute hooks in order; return the first deny, or ``None`` (SPEC I6).

    A hook is a plain function or a coroutine function; what it returns is awaited when
    it is awaitable (``None``, the common answer, is not asked: the ``Awaitable`` ABC
    check is slow, and this runs on every call). ``waits`` is called once, before the
    first such await: the call may wait there, and its handler has not started (SPEC
    J6, :meth:`gateway.execution.Execution.prepare`)."""
    for hook in hooks:
        verdict = hook(call)
        if verdict is not None and inspect.isawaitable(verdict):
            if waits is not None:
                waits()
                waits = None
            verdict = await verdict
        if isinstance(verdict, Deny):
            return verdict
    return None


async def run_post(
    hooks: Sequence[PostHook], call: CallInfo, result: dict[str, Any]
) -> tuple[dict[str, Any], bool]:
    """Run post-execute hooks in order (SPEC I10).

    Returns:
        ``(result, replaced)``: the final object and whether any hook replaced it.
    """
    replaced = False
    for hook in hooks:
        new = hook(call, result)
        if new is not None and inspect.isawaitable(new):
            new = await new
        if new is not None:
            if not isinstance(new, dict):
                raise TypeError(f"post hook {hook!r} returned {type(new).__name__}, not dict")
            result, replaced = new, True
    return result, replaced
