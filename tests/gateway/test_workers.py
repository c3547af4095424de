"""Worker lanes on their own (SPEC E3): caps, waiting, and a slot held until the handler
really returns."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gateway.workers import Lane, LaneStats, NoThread
from protocol.errors import ErrorCode
from tests.support import WAIT

ALICE = (None, "alice")
BOB = (None, "bob")


async def test_e3_a_capped_session_does_not_hold_up_others() -> None:
    """SPEC E3: a waiter blocked by its own session's cap does not block another session;
    it gets the first slot its session frees."""
    lane = Lane("calls", 4, 1, 4, None)
    first = await lane.acquire("s1", ALICE, "t", None)
    waiting = asyncio.ensure_future(lane.acquire("s1", ALICE, "t", None))
    await asyncio.sleep(0)  # let it queue: it cannot be granted (cap 1)
    assert lane.stats().waiting == 1
    other = await lane.acquire("s2", BOB, "t", None)  # not behind s1's waiter
    assert (lane.held_by_session("s1"), lane.held_by_session("s2")) == (1, 1)
    lane.cancel(first)
    async with asyncio.timeout(WAIT):
        second = await waiting
    assert second.session_id == "s1"
    lane.cancel(second)
    lane.cancel(other)
    assert lane.stats() == LaneStats(busy=0, overdue=0, waiting=0, sessions=0, users=0, threads=0)


async def test_e3_wait_past_the_deadline_is_busy_and_leaves_nothing() -> None:
    """SPEC E3: a wait past its deadline raises ``NoThread`` (code ``busy``) with the
    counts; a cancelled wait leaves neither a waiter nor a slot behind."""
    lane = Lane("calls", 2, 2, 1, None)
    held = await lane.acquire("s1", ALICE, "t", None)
    loop = asyncio.get_running_loop()
    with pytest.raises(NoThread) as caught:
        await lane.acquire("s2", ALICE, "t", loop.time() + 0.01)
    assert caught.value.code is ErrorCode.BUSY
    assert caught.value.message == (
        "no worker thread became free in time: this session holds 0 of 2, "
        "its user 1 of 1, the calls lane 1 of 2"
    )
    waiting = asyncio.ensure_future(lane.acquire("s2", ALICE, "t", None))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    lane.cancel(held)
    assert (lane.stats().busy, lane.stats().waiting, lane.stats().users) == (0, 0, 0)


async def test_e3_slot_is_held_until_the_handler_returns() -> None:
    """SPEC E3: cancelling the caller (a timeout) marks the slot overdue; it stays held
    until the function returns in its thread, and only then is it free again."""
    lane = Lane("jobs", 1, 1, 1, None)
    running, release = threading.Event(), threading.Event()

    def handler() -> str:
        running.set()
        release.wait(WAIT)
        return "late"

    try:
        slot = await lane.acquire("s1", ALICE, "t", None)
        future = lane.start(slot, handler)
        async with asyncio.timeout(WAIT):
            assert await asyncio.to_thread(running.wait, WAIT)
        future.cancel()
        await asyncio.sleep(0)
        assert (lane.stats().busy, lane.stats().overdue) == (1, 1)
        assert lane.held_by_user(None, "alice") == 1
        release.set()
        async with asyncio.timeout(WAIT):
            while lane.stats().busy:
                await lane.changed()
        assert lane.held_by_user(None, "alice") == 0
        assert lane.stats().threads == 1
    finally:
        release.set()
        lane.close()


async def test_e3_a_change_right_after_asking_is_not_lost() -> None:
    """A waiter for the lane's next change sees one that happens after it asked and
    before its first step ran (a slot freed by a handler thread's return, as after a
    check of the counts): `changed()` takes its event when called. The suite's waits on
    lane counts (`tests/gateway/fair_tools.py` `until`) hung on exactly this under load."""
    lane = Lane("calls", 2, 2, 2, None)
    slot = await lane.acquire("s1", ALICE, "t", None)
    waiter = asyncio.ensure_future(lane.changed())  # asked; its first step not run yet
    lane.cancel(slot)  # the change, before the waiter ran
    async with asyncio.timeout(WAIT):
        assert await waiter is True
