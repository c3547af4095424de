"""A handler's typed failure: end the call with a chosen error code (SPEC I8, M2, M3).

A handler that raises any other exception ends its call with ``handler_error`` and the
text ``"<ExceptionType>: <message>"``. A handler that knows better raises
:class:`ToolFailure`: the call ends with ``code`` and exactly ``message`` (a mounted MCP
tool's ``isError`` text, SPEC M3; a server that is down, ``unavailable``, SPEC M2).
For a job the same code and message become ``job.failed.error``.
"""

from __future__ import annotations

from protocol.errors import ErrorCode
from protocol.outcomes import CallOutcome


class ToolFailure(Exception):
    """Raised by a handler to end its call with a typed error (SPEC I8, M2, M3).

    Args:
        code: the wire code, e.g. ``ErrorCode.UNAVAILABLE`` or ``ErrorCode.HANDLER_ERROR``.
        message: the text for the client and the model; never a secret. A lone
            surrogate in it is sent escaped (:func:`sendable`).
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, sendable(message)

    @property
    def outcome(self) -> CallOutcome:
        """The audit outcome (SPEC I11): the code's own, else ``handler_error``."""
        try:
            return CallOutcome(self.code.value)
        except ValueError:
            return CallOutcome.HANDLER_ERROR


def describe(exc: BaseException) -> str:
    """``"<ExceptionType>: <message>"`` for a handler's exception; never raises (SPEC
    I16): an exception whose ``__str__`` raises is named by its type alone, and the text
    is :func:`sendable`."""
    try:
        text = str(exc)
    except Exception:
        text = "(its message could not be read)"
    return sendable(f"{type(exc).__name__}: {text}")


def sendable(text: str) -> str:
    """``text`` with each lone surrogate (a file name decoded with ``surrogateescape``,
    say) written as its ``\\udcXX`` escape: JSON cannot carry one, and an error message
    must still reach the client (SPEC I16). Other text is returned as it is."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text
