"""How a call ends: the one outcome vocabulary (SPEC I1-I16, I11).

:class:`CallOutcome` names every way an ``invoke`` can end, as the audit record, the
metrics and the store name it. It is the single source of these strings: the
``call.error`` codes that end a call (:class:`protocol.errors.ErrorCode`, from
``unknown_tool`` on) and the catalog's access denials
(:class:`catalog.visibility.Denial`) take their values from it, so the three can never
spell one outcome two ways.
"""

from __future__ import annotations

from enum import StrEnum


class CallOutcome(StrEnum):
    """How an invocation ended (SPEC I11); an error outcome's value is its wire code."""

    OK = "ok"
    DISPATCHED = "dispatched"
    PROMOTED = "promoted"
    UNKNOWN_TOOL = "unknown_tool"
    DENIED_CAPABILITY = "denied_capability"
    DENIED_DANGEROUS = "denied_dangerous"
    DENIED_SCOPE = "denied_scope"
    WRONG_ROUTE = "wrong_route"
    INVALID_PARAMS = "invalid_params"
    DENIED_BY_HOOK = "denied_by_hook"
    REJECTED_BY_USER = "rejected_by_user"
    APPROVAL_TIMEOUT = "approval_timeout"
    TIMEOUT = "timeout"
    HANDLER_ERROR = "handler_error"
    UNAVAILABLE = "unavailable"
    CANCELLED = "cancelled"
    STALE_CATALOG = "stale_catalog"
    BUSY = "busy"
    INTERRUPTED = "interrupted"
    CREDENTIAL_EXPIRED = "credential_expired"
    CREDENTIAL_REVOKED = "credential_revoked"
