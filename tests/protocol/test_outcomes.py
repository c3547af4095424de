"""One outcome vocabulary (SPEC I11): every way a call ends is a ``CallOutcome``."""

from __future__ import annotations

from catalog.visibility import Denial
from protocol.errors import ErrorCode
from protocol.outcomes import CallOutcome

#: The ErrorCode members that end an invoke (after the ``# call outcomes`` line).
CALL_CODES = list(ErrorCode)[list(ErrorCode).index(ErrorCode.UNKNOWN_TOOL) :]


def test_every_call_error_code_is_an_outcome() -> None:
    """SPEC I11: a call.error code that ends a call is audited under the same string."""
    assert [CallOutcome(code.value).value for code in CALL_CODES] == [c.value for c in CALL_CODES]
    assert len(CALL_CODES) == 15


def test_every_denial_is_an_outcome() -> None:
    """SPEC I2, I11: the catalog's denials are outcomes and call.error codes, one spelling."""
    assert [CallOutcome(d.value) for d in Denial] == [
        CallOutcome.DENIED_CAPABILITY,
        CallOutcome.DENIED_DANGEROUS,
        CallOutcome.DENIED_SCOPE,
    ]
    assert all(ErrorCode(d.value).value == d.value for d in Denial)


def test_outcomes_beyond_error_codes() -> None:
    """SPEC I11, A5, I9, I14: only success, dispatch, promotion, a declined approval and
    an interrupted job are outcomes without a call.error code."""
    codes = {code.value for code in ErrorCode}
    assert sorted(o.value for o in CallOutcome if o.value not in codes) == [
        "approval_timeout",
        "dispatched",
        "interrupted",
        "ok",
        "promoted",
        "rejected_by_user",
    ]
