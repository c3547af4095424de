"""Error vocabulary of protocol v1: wire error codes, close codes and the exception tree.

Every failure that reaches a peer is one of two things: an ``error`` message carrying an
:class:`ErrorCode` (the connection stays usable), or a WebSocket close with a
:class:`CloseCode` (the stream itself is unusable). :data:`ERROR_DISPOSITION` is the one
table that says which (SPEC E1).

Exception tree, split by blame as h11 does::

    ToolbusError                      root of everything this project raises
    ├── ProtocolError                 the peer broke the protocol; carries code + close
    │   ├── DecodeError               bytes that are not one valid client message
    │   └── StateError                a valid message that is illegal in this state
    ├── UsageError                    we (the caller of this library) misused an API
    └── InternalError                 a fault of ours; the connection closes 1011
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

from protocol.outcomes import CallOutcome


class ErrorCode(StrEnum):
    """Wire error codes, carried by ``error.code`` and ``call.error.code``.

    Codes below the ``# call outcomes`` line answer a request or a frame; codes after it
    end an ``invoke`` (SPEC I1-I14) and double as audit outcomes (SPEC I11).
    """

    # Frame and message decoding (SPEC E1).
    BINARY_FRAME = "binary_frame"
    INVALID_UTF8 = "invalid_utf8"
    MALFORMED_JSON = "malformed_json"
    NAN_NOT_ALLOWED = "nan_not_allowed"
    DUPLICATE_KEY = "duplicate_key"
    TOO_DEEP = "too_deep"
    TOO_LARGE = "too_large"
    NOT_AN_OBJECT = "not_an_object"
    MISSING_TYPE = "missing_type"
    UNKNOWN_TYPE = "unknown_type"
    MISSING_FIELD = "missing_field"
    EXTRA_FIELD = "extra_field"
    WRONG_TYPE = "wrong_type"
    INVALID_VALUE = "invalid_value"
    # Session state (SPEC S1).
    HELLO_REQUIRED = "hello_required"
    HELLO_TIMEOUT = "hello_timeout"
    UNEXPECTED_MESSAGE = "unexpected_message"
    UNSUPPORTED_VERSION = "unsupported_version"
    # Auth (SPEC S2).
    AUTH_FAILED = "auth_failed"
    PROFILE_DENIED = "profile_denied"
    PRINCIPAL_MISMATCH = "principal_mismatch"
    """SPEC S6: an ``auth.refresh`` credential names another tenant or user."""
    # Limits (SPEC E2).
    RATE_LIMITED = "rate_limited"
    TOO_MANY_INFLIGHT = "too_many_inflight"
    TOO_MANY_SESSIONS = "too_many_sessions"
    TOO_MANY_PENDING_APPROVALS = "too_many_pending_approvals"
    # Requests about calls, jobs and grants.
    CONTEXT_TOO_LARGE = "context_too_large"
    DUPLICATE_CALL = "duplicate_call"
    CALL_ID_CONFLICT = "call_id_conflict"
    """SPEC I15: the principal used this ``call_id`` before for another tool or other
    parameters; nothing runs (the first call's record stays as it was)."""
    UNKNOWN_CALL = "unknown_call"
    UNKNOWN_JOB = "unknown_job"
    JOB_FINISHED = "job_finished"
    UNKNOWN_GRANT = "unknown_grant"
    INTERNAL = "internal"
    # call outcomes (SPEC I1-I14); their values come from the one outcome vocabulary,
    # protocol.outcomes.CallOutcome (this docstring is in schema/, so the note is here).
    UNKNOWN_TOOL = CallOutcome.UNKNOWN_TOOL.value
    DENIED_CAPABILITY = CallOutcome.DENIED_CAPABILITY.value
    DENIED_DANGEROUS = CallOutcome.DENIED_DANGEROUS.value
    DENIED_SCOPE = CallOutcome.DENIED_SCOPE.value
    WRONG_ROUTE = CallOutcome.WRONG_ROUTE.value
    INVALID_PARAMS = CallOutcome.INVALID_PARAMS.value
    DENIED_BY_HOOK = CallOutcome.DENIED_BY_HOOK.value
    TIMEOUT = CallOutcome.TIMEOUT.value
    HANDLER_ERROR = CallOutcome.HANDLER_ERROR.value
    UNAVAILABLE = CallOutcome.UNAVAILABLE.value
    """SPEC M2, D6: what the call needs is down for now (a mounted MCP server that is
    not connected, a store that cannot commit, a session change: ``grants.revoke``,
    ``context.update``, ``auth.refresh``, ``bye`` or ``job.cancel``, that the store can
    make durable neither by a commit nor in its journal); retrying later may succeed."""
    CANCELLED = CallOutcome.CANCELLED.value
    STALE_CATALOG = CallOutcome.STALE_CATALOG.value
    BUSY = CallOutcome.BUSY.value
    """SPEC E3: no worker thread became free for this session or user in time (its share
    is held, maybe by handlers past their timeout); the handler never started."""
    CREDENTIAL_EXPIRED = CallOutcome.CREDENTIAL_EXPIRED.value
    """SPEC S6, A7: the session's credential expired before the handler could start."""
    CREDENTIAL_REVOKED = CallOutcome.CREDENTIAL_REVOKED.value
    """SPEC S6, A7: the session's credential was revoked before the handler could start."""


class CloseCode(IntEnum):
    """WebSocket close codes: RFC 6455 section 7.4.1 names, then toolbus's 4000-4999 range."""

    NORMAL_CLOSURE = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    UNSUPPORTED_DATA = 1003
    INVALID_FRAME_PAYLOAD_DATA = 1007
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    SERVICE_RESTART = 1012
    TRY_AGAIN_LATER = 1013
    # Application codes (RFC 6455 section 7.4.2: 4000-4999 are private use).
    SESSION_REPLACED = 4000
    """SPEC D4: a resume on another socket took this session over."""
    SESSION_ENDED = 4001
    """The client said ``bye``; the session is over and cannot be resumed."""
    AUTH_FAILED = 4003
    """SPEC S2: credentials missing or refused, or the profile is not granted."""
    CREDENTIAL_EXPIRED = 4004
    """SPEC S6: the credential's lifetime (JWT ``exp``) ended and no refresh came."""
    CREDENTIAL_REVOKED = 4005
    """SPEC S6: the credential was revoked (its token left the token file)."""


#: One table from a protocol error to its disposition on the wire (SPEC E1): ``None``
#: means "answer with an ``error`` message and keep the connection"; a close code means
#: the stream is unusable (or the peer is hostile) and the connection closes with it.
ERROR_DISPOSITION: dict[ErrorCode, CloseCode | None] = {
    ErrorCode.BINARY_FRAME: None,
    ErrorCode.INVALID_UTF8: CloseCode.INVALID_FRAME_PAYLOAD_DATA,
    ErrorCode.MALFORMED_JSON: None,
    ErrorCode.NAN_NOT_ALLOWED: None,
    ErrorCode.DUPLICATE_KEY: None,
    ErrorCode.TOO_DEEP: None,
    ErrorCode.TOO_LARGE: CloseCode.MESSAGE_TOO_BIG,
    ErrorCode.NOT_AN_OBJECT: None,
    ErrorCode.MISSING_TYPE: None,
    ErrorCode.UNKNOWN_TYPE: None,
    ErrorCode.MISSING_FIELD: None,
    ErrorCode.EXTRA_FIELD: None,
    ErrorCode.WRONG_TYPE: None,
    ErrorCode.INVALID_VALUE: None,
    ErrorCode.HELLO_REQUIRED: CloseCode.POLICY_VIOLATION,
    ErrorCode.HELLO_TIMEOUT: CloseCode.POLICY_VIOLATION,
    ErrorCode.UNEXPECTED_MESSAGE: None,
    ErrorCode.UNSUPPORTED_VERSION: CloseCode.POLICY_VIOLATION,
    ErrorCode.AUTH_FAILED: CloseCode.AUTH_FAILED,
    ErrorCode.PROFILE_DENIED: CloseCode.AUTH_FAILED,
    ErrorCode.TOO_MANY_SESSIONS: CloseCode.TRY_AGAIN_LATER,
    ErrorCode.CONTEXT_TOO_LARGE: None,
    ErrorCode.UNAVAILABLE: None,
    ErrorCode.INTERNAL: CloseCode.INTERNAL_ERROR,
}


def close_for(code: ErrorCode) -> CloseCode | None:
    """Return the close code an error forces, or ``None`` to keep the connection (SPEC E1)."""
    return ERROR_DISPOSITION.get(code)


class ToolbusError(Exception):
    """Root of every exception toolbus raises on purpose."""


class ProtocolError(ToolbusError):
    """The peer broke protocol v1.

    Attributes:
        code: the wire error code.
        message: a human-readable explanation, safe to send to the peer.
        request_id: the offending request's ``id`` when it could be read, else ``None``.
        close: the close code this forces, or ``None`` to answer with an ``error`` message.
    """

    def __init__(self, code: ErrorCode, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id

    @property
    def close(self) -> CloseCode | None:
        return close_for(self.code)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ProtocolError)
            and type(other) is type(self)
            and (self.code, self.message, self.request_id)
            == (other.code, other.message, other.request_id)
        )

    def __hash__(self) -> int:
        return hash((type(self), self.code, self.message, self.request_id))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code.value!r}, {self.message!r}, {self.request_id!r})"


class DecodeError(ProtocolError):
    """Bytes that are not one valid client message (SPEC E1)."""


class StateError(ProtocolError):
    """A well-formed message that is not legal in the connection's current state (SPEC S1)."""


class UsageError(ToolbusError):
    """This library was called wrongly (a bug in the caller, not the peer)."""


class InternalError(ToolbusError):
    """A fault of ours; the connection closes with 1011 and the traceback is logged."""


#: Close reasons travel in a control frame whose payload is at most 125 bytes, two of
#: which are the code (RFC 6455 section 5.5); keep reasons well under that.
MAX_CLOSE_REASON_BYTES = 123


def close_reason(text: str) -> str:
    """Truncate ``text`` so its UTF-8 encoding fits a close frame (RFC 6455 section 5.5).

    Args:
        text: any reason text.

    Returns:
        ``text`` cut to at most :data:`MAX_CLOSE_REASON_BYTES` bytes, never splitting a
        UTF-8 sequence.
    """
    raw = text.encode()
    if len(raw) <= MAX_CLOSE_REASON_BYTES:
        return text
    return raw[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")
