"""The approval registry on its own (SPEC A2-A4; cases F01, F03)."""

from __future__ import annotations

import asyncio
import time

import pytest

import gateway.approvals as approvals_module
from gateway.approvals import Approvals
from protocol.messages import Decision, NotAcceptedReason, Resolution, ResolutionReason
from tests.support import MS, WAIT


def registry(timeout: float = 300.0) -> Approvals:
    return Approvals(timeout, time.time)


async def test_a3_first_settlement_wins() -> None:
    """SPEC A3: a second settle changes nothing and says so."""
    reg = registry()
    approval = reg.open("s1", "alice", "c1", "t", {})
    assert reg.settle(approval.approval_id, Resolution.ALLOWED, ResolutionReason.USER, always=True)
    assert not reg.settle(approval.approval_id, Resolution.DENIED, ResolutionReason.TIMEOUT)
    assert approval.outcome is not None
    assert (approval.outcome.resolution, approval.outcome.reason, approval.outcome.always) == (
        Resolution.ALLOWED,
        ResolutionReason.USER,
        True,
    )
    assert approval.timer is not None
    assert approval.timer.cancelled()
    assert await approval.wait() is approval.outcome


async def test_a4_timeout_denies_on_its_own_clock_and_late_confirm_is_expired() -> None:
    """SPEC A4: the approval timeout denies with reason timeout; a confirm after it is expired."""
    reg = registry(timeout=10 * MS)
    approval = reg.open("s1", "alice", "c1", "t", {})
    async with asyncio.timeout(WAIT):
        outcome = await approval.wait()
    assert (outcome.resolution, outcome.reason) == (Resolution.DENIED, ResolutionReason.TIMEOUT)
    assert reg.pending == {}
    assert (
        reg.confirm("s1", "alice", approval.approval_id, Decision.ALLOW)
        is NotAcceptedReason.EXPIRED
    )


async def test_case_f01_waiters_that_give_up_decide_nothing() -> None:
    """Case F01: waiters that time out or are cancelled leave the approval pending."""
    reg = registry()
    approval = reg.open("s1", "alice", "c1", "t", {})
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(approval.wait(), 5 * MS)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(approval.decided.wait(), 5 * MS)
    assert approval.approval_id in reg.pending
    assert approval.outcome is None
    assert reg.confirm("s1", "alice", approval.approval_id, Decision.ALLOW) is None
    async with asyncio.timeout(WAIT):
        assert (await approval.wait()).resolution is Resolution.ALLOWED


async def test_a3_refusal_reasons() -> None:
    """SPEC A3, A7: unknown (never issued, or another session's or user's: F26),
    already_decided: no change."""
    reg = registry()
    approval = reg.open("s1", "alice", "c1", "t", {})
    aid = approval.approval_id
    assert reg.confirm("s1", "alice", "ap_nope", Decision.ALLOW) is NotAcceptedReason.UNKNOWN
    assert reg.confirm("s2", "alice", aid, Decision.ALLOW) is NotAcceptedReason.UNKNOWN
    assert reg.confirm("s1", "bob", aid, Decision.ALLOW) is NotAcceptedReason.UNKNOWN
    assert aid in reg.pending
    assert approval.outcome is None
    assert reg.confirm("s1", "alice", aid, Decision.DENY) is None
    assert reg.confirm("s1", "alice", aid, Decision.ALLOW) is NotAcceptedReason.ALREADY_DECIDED
    assert reg.confirm("s2", "bob", aid, Decision.ALLOW) is NotAcceptedReason.UNKNOWN
    assert approval.outcome is not None
    assert approval.outcome.resolution is Resolution.DENIED


async def test_a4_settle_session_denies_only_that_session() -> None:
    """SPEC A4: the end of a session denies its approvals (disconnected) and no one else's."""
    reg = registry()
    mine = [reg.open("s1", "alice", f"c{i}", "t", {}) for i in range(3)]
    other = reg.open("s2", "alice", "c9", "t", {})
    reg.settle_session("s1", ResolutionReason.DISCONNECTED)
    assert list(reg.pending) == [other.approval_id]
    assert all(
        a.outcome is not None and a.outcome.reason is ResolutionReason.DISCONNECTED for a in mine
    )


async def test_a2_ids_distinct_and_at_least_128_bits() -> None:
    """SPEC A2: ids are distinct and carry 192 random bits (32 base64url characters)."""
    reg = registry()
    ids = {reg.open("s1", "alice", f"c{i}", "t", {}).approval_id for i in range(500)}
    assert len(ids) == 500
    assert all(i.startswith("ap_") and len(i) == 35 for i in ids)
    reg.settle_session("s1", ResolutionReason.DISCONNECTED)


async def test_a3_settled_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC A4 (no leaks): only the newest SETTLED_MEMORY decisions are remembered."""
    monkeypatch.setattr(approvals_module, "SETTLED_MEMORY", 2)
    reg = registry()
    ids = [reg.open("s1", "alice", f"c{i}", "t", {}).approval_id for i in range(3)]
    for aid in ids:
        reg.settle(aid, Resolution.DENIED, ResolutionReason.USER)
    assert [reg.confirm("s1", "alice", aid, Decision.ALLOW) for aid in ids] == [
        NotAcceptedReason.UNKNOWN,
        NotAcceptedReason.ALREADY_DECIDED,
        NotAcceptedReason.ALREADY_DECIDED,
    ]
    assert reg.pending == {}


async def test_a4_n3_a_routed_decision_is_judged_by_when_it_was_received() -> None:
    """SPEC A4, N3: a decision routed from another node carries the time that node
    received it (``at``). One received before ``expires_at`` counts though it is
    applied after (the registry's clock has passed the deadline, its timer has not
    fired); one received at or after it is ``expired`` and denies ``timeout``, though
    the registry's clock has not reached the deadline. Before, the applying node
    judged by its own clock at the time it applied the decision."""
    now = [1000.0]
    reg = Approvals(300.0, lambda: now[0])
    timely = reg.open("s1", "alice", "c1", "t", {})
    late = reg.open("s1", "alice", "c2", "t", {})
    now[0] = timely.expires_at + 5.0
    assert reg.confirm("s1", "alice", timely.approval_id, Decision.ALLOW, at=1200.0) is None
    assert timely.outcome is not None
    assert (timely.outcome.resolution, timely.outcome.reason) == (
        Resolution.ALLOWED,
        ResolutionReason.USER,
    )
    now[0] = 1100.0
    reason = reg.confirm("s1", "alice", late.approval_id, Decision.ALLOW, at=late.expires_at)
    assert reason is NotAcceptedReason.EXPIRED
    assert late.outcome is not None
    assert (late.outcome.resolution, late.outcome.reason) == (
        Resolution.DENIED,
        ResolutionReason.TIMEOUT,
    )
