"""Exceptions of the toolbus client library (SPEC K1).

Every exception the client raises on purpose derives from :class:`ToolbusClientError`,
whose ``code`` is the wire :class:`~protocol.errors.ErrorCode` it mirrors (``None`` when
the failure never reached the wire, such as a local timeout). Split by where the
failure came from::

    ToolbusClientError                 root; .code (ErrorCode | None), .message
    ├── CallFailed                     an invoke ended with ``call.error`` (SPEC I1-I14)
    │   ├── UnknownTool                unknown_tool: .suggestions, .guidance (I1, C3)
    │   ├── DeniedCapability           denied_capability (I2)
    │   ├── DeniedDangerous            denied_dangerous (I2)
    │   ├── DeniedScope                denied_scope (I2)
    │   ├── WrongRoute                 wrong_route: a client-mode tool (I3)
    │   ├── InvalidParams              invalid_params: .violations (I4)
    │   ├── DeniedByHook               denied_by_hook: .reason_code (I6)
    │   ├── Timeout                    timeout: the tool ran too long (I8)
    │   ├── HandlerError               handler_error (I8)
    │   ├── Cancelled                  cancelled (I8)
    │   ├── StaleCatalog               stale_catalog: .catalog_version (I13)
    │   ├── Unavailable                unavailable: e.g. a mounted MCP server is down (M2)
    │   └── Busy                       busy: no worker thread free for this session/user (E3)
    ├── RequestRefused                 the server answered ``error`` (E1, E2, I12, J3, A3)
    ├── RequestTimeout                 no answer within the caller's timeout (also a TimeoutError)
    ├── ConnectFailed                  the first connection or hello did not succeed
    ├── SessionClosed                  the session is over: .close_code, .reason
    └── UsageError                     the library was called wrongly

A declined approval is not an exception: the call returns its result with
``declined`` true (SPEC A5).
"""

from __future__ import annotations

from typing import Final

from protocol import messages as m
from protocol.errors import ErrorCode


class ToolbusClientError(Exception):
    """Root of every exception the client raises on purpose.

    Attributes:
        code: the wire error code this mirrors, or ``None`` for a local failure.
        message: a human-readable explanation.
    """

    code: ErrorCode | None = None

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class CallFailed(ToolbusClientError):
    """An ``invoke`` ended with ``call.error`` (SPEC I12: its one terminal reply).

    Attributes:
        call_id: the call's id.
        tool: the tool name as invoked.
        event: the ``call.error`` message itself.
    """

    def __init__(self, event: m.CallError) -> None:
        super().__init__(event.message, event.code)
        self.code = event.code
        self.event = event
        self.call_id = event.call_id
        self.tool = event.tool

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!s}, {self.message!r}, call_id={self.call_id!r})"


class UnknownTool(CallFailed):
    """No such tool in this session's catalog (SPEC I1, C3).

    Attributes:
        suggestions: "did you mean" names (possibly empty).
        guidance: configured text for names models tend to invent, or ``None``.
    """

    def __init__(self, event: m.CallError) -> None:
        super().__init__(event)
        self.suggestions: list[str] = list(event.suggestions or [])
        self.guidance = event.guidance


class DeniedCapability(CallFailed):
    """The profile lacks the tool's capability (SPEC I2)."""


class DeniedDangerous(CallFailed):
    """A dangerous tool without the profile's opt-in (SPEC I2)."""


class DeniedScope(CallFailed):
    """The session context does not meet the tool's conditions (SPEC I2)."""


class WrongRoute(CallFailed):
    """A ``client``-mode tool was invoked on the server (SPEC I3)."""


class InvalidParams(CallFailed):
    """Parameters failed the tool's JSON Schema (SPEC I4).

    Attributes:
        violations: every violation with its RFC 6901 pointer into the params.
    """

    SHOWN: Final = 3
    """Violations named in ``str(exc)``; the rest are counted ("and N more")."""

    def __init__(self, event: m.CallError) -> None:
        super().__init__(event)
        self.violations: list[m.Violation] = list(event.violations or [])

    def __str__(self) -> str:
        """The server's message, then the first :attr:`SHOWN` violations (pointer: what).

        E.g. ``2 parameter problem(s): /value: "x" is not of type "number"; /to_unit:
        'to_unit' is a required property``.
        """
        named = [f"{v.pointer or '/'}: {v.message}" for v in self.violations[: self.SHOWN]]
        more = len(self.violations) - len(named)
        if more:
            named.append(f"and {more} more")
        return f"{self.message}: {'; '.join(named)}" if named else self.message


class DeniedByHook(CallFailed):
    """A pre-execute hook denied the call (SPEC I6).

    Attributes:
        reason_code: the hook's stable reason code, or ``None``.
    """

    def __init__(self, event: m.CallError) -> None:
        super().__init__(event)
        self.reason_code = event.reason_code


class Timeout(CallFailed):
    """The tool ran past its timeout on the server (SPEC I8)."""


class HandlerError(CallFailed):
    """The tool's handler raised on the server (SPEC I8)."""


class Cancelled(CallFailed):
    """The call was cancelled (``call.cancel`` or the end of the session, SPEC I8)."""


class StaleCatalog(CallFailed):
    """The invoke named a catalog version that is no longer current (SPEC I13).

    Attributes:
        catalog_version: the current version; the new catalog is pushed too.
    """

    def __init__(self, event: m.CallError) -> None:
        super().__init__(event)
        self.catalog_version = event.catalog_version


class Unavailable(CallFailed):
    """``unavailable``: what the call needs is down for now, e.g. a mounted MCP server
    being reconnected (SPEC M2); the same call may succeed later."""


class Busy(CallFailed):
    """``busy``: the session's or user's share of worker threads stayed full (SPEC E3);
    the handler never ran, so the same call may be retried."""


CALL_ERRORS: Final[dict[ErrorCode, type[CallFailed]]] = {
    ErrorCode.UNKNOWN_TOOL: UnknownTool,
    ErrorCode.DENIED_CAPABILITY: DeniedCapability,
    ErrorCode.DENIED_DANGEROUS: DeniedDangerous,
    ErrorCode.DENIED_SCOPE: DeniedScope,
    ErrorCode.WRONG_ROUTE: WrongRoute,
    ErrorCode.INVALID_PARAMS: InvalidParams,
    ErrorCode.DENIED_BY_HOOK: DeniedByHook,
    ErrorCode.TIMEOUT: Timeout,
    ErrorCode.HANDLER_ERROR: HandlerError,
    ErrorCode.CANCELLED: Cancelled,
    ErrorCode.STALE_CATALOG: StaleCatalog,
    ErrorCode.UNAVAILABLE: Unavailable,
    ErrorCode.BUSY: Busy,
}
"""``call.error`` code -> exception class; other codes raise plain :class:`CallFailed`."""


def call_error(event: m.CallError) -> CallFailed:
    """Return the typed exception for a ``call.error`` event (one table, no if-chain)."""
    return CALL_ERRORS.get(event.code, CallFailed)(event)


class RequestRefused(ToolbusClientError):
    """The server answered a request with ``error`` (e.g. ``duplicate_call``,
    ``rate_limited``, ``unknown_job``, ``job_finished``, ``unknown_grant``).

    Attributes:
        event: the ``error`` message.
        details: its ``details`` object, or ``None``.
    """

    def __init__(self, event: m.Error) -> None:
        super().__init__(event.message, event.code)
        self.code = event.code
        self.event = event
        self.details = event.details


class RequestTimeout(ToolbusClientError, TimeoutError):
    """No answer arrived within the timeout the caller chose (``code`` is ``None``)."""


class ConnectFailed(ToolbusClientError):
    """The first connection could not be opened or its ``hello`` was refused (SPEC S1, S2)."""


class SessionClosed(ToolbusClientError):
    """The client stopped for good: closed by the caller, ended by the server, or out of
    reconnect attempts. Pending calls and requests fail with it.

    Attributes:
        close_code: the WebSocket close code that ended it, or ``None``.
        reason: the close reason text.
    """

    def __init__(self, message: str, close_code: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.close_code = close_code
        self.reason = reason


class UsageError(ToolbusClientError):
    """The client library was used wrongly (a bug in the caller)."""
