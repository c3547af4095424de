"""Hooks, audit redaction and handler execution on their own (SPEC I6, I8, I10, I11)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from catalog.model import Mode, ToolDef
from gateway.audit import MASK, redact
from gateway.context import Cancellation, ToolContext
from gateway.execute import _limited, as_object, run_handler
from gateway.hooks import CallInfo, Deny, resolve, run_post, run_pre
from gateway.workers import Lane
from tests.support import WAIT

TOOL = ToolDef(
    name="t", description="d", parameters={"type": "object"}, capability="c", mode=Mode.SYNC
)
INFO = CallInfo("s1", "alice", "demo", "c1", TOOL, {}, {})


def ctx() -> ToolContext:
    return ToolContext("s1", "alice", "demo", {}, "c1", "t", Path("."))


async def test_i6_run_pre_in_order_first_deny_wins() -> None:
    """SPEC I6: hooks run in order, async ones awaited; the first deny stops the rest."""
    seen: list[str] = []

    def allow(info: CallInfo) -> None:
        seen.append("allow")

    async def deny(info: CallInfo) -> Deny:
        seen.append("deny")
        return Deny("no", "code_1")

    def never(info: CallInfo) -> None:
        seen.append("never")

    assert await run_pre([allow, deny, never], INFO) == Deny("no", "code_1")
    assert seen == ["allow", "deny"]
    assert await run_pre([allow], INFO) is None


async def test_i10_run_post_keep_replace_and_refuse_non_objects() -> None:
    """SPEC I10: None keeps, an object replaces (flagged), anything else is a TypeError."""
    assert await run_post([lambda i, r: None], INFO, {"a": 1}) == ({"a": 1}, False)

    async def redact_hook(info: CallInfo, result: dict[str, Any]) -> dict[str, Any]:
        return {"a": MASK}

    assert await run_post([redact_hook, lambda i, r: None], INFO, {"a": 1}) == ({"a": MASK}, True)
    with pytest.raises(TypeError, match="returned list, not dict"):
        await run_post([lambda i, r: [1]], INFO, {"a": 1})  # type: ignore[list-item,return-value]


def test_i6_resolve_reports_bad_paths() -> None:
    """SPEC I6: a hook path is module:function and must import to a callable."""
    assert resolve("tests.gateway.tools_for_tests:first_hook").__name__ == "first_hook"
    for path, text in [
        ("nocolon", "not 'module:function'"),
        ("no_such_mod_x:f", "cannot be imported"),
        ("tests.gateway.tools_for_tests:nope", "cannot be imported"),
        ("tests.gateway.tools_for_tests:TOOLS_YAML", "not callable"),
    ]:
        with pytest.raises(ValueError, match=text):
            resolve(path)


def test_i11_redact_masks_then_truncates() -> None:
    """SPEC I11: sensitive keys are masked before the JSON is cut to the byte limit."""
    assert redact({"a": 1, "pw": "secret"}, ("pw",), 100) == {"a": 1, "pw": MASK}
    cut = redact({"pw": "secret", "b": "x" * 50}, ("pw",), 20)
    assert cut == '{"pw":"***","b":"xxx...'
    assert "secret" not in cut
    assert redact({"a": 1}, (), 7) == {"a": 1}  # exactly at the limit: kept whole

    assert redact({"a": 1}, (), 6) == '{"a":1...'


def test_i8_non_objects_are_wrapped() -> None:
    """SPEC I8: objects pass through; any other value becomes {"value": v}."""
    assert as_object({"a": 1}) == {"a": 1}
    assert [as_object(v) for v in (1, "s", None, [1])] == [
        {"value": 1},
        {"value": "s"},
        {"value": None},
        {"value": [1]},
    ]


def test_i8_ctx_cancelled_is_an_event_made_on_first_use() -> None:
    """SPEC I8, issue 13: `ctx.cancelled` is a `threading.Event` whose condition is made
    only when first set, cleared or waited on; a thread waiting on it wakes when it is
    set (whichever of the two comes first)."""
    cancelled = ctx().cancelled
    assert isinstance(cancelled, Cancellation)
    assert isinstance(cancelled, threading.Event)
    assert cancelled.is_set() is False
    assert cancelled.wait(0) is False
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(cancelled.wait(WAIT)))
    waiter.start()
    cancelled.set()
    waiter.join(WAIT)
    assert woke == [True]
    assert cancelled.is_set() is True
    cancelled.clear()
    assert cancelled.is_set() is False


async def test_i8_cancelling_a_handler_sets_ctx_cancelled_and_propagates() -> None:
    """SPEC I8: cancellation sets ctx.cancelled and is never swallowed (coroutine and thread)."""
    started = asyncio.Event()

    async def coro(params: dict[str, Any], c: ToolContext) -> None:
        started.set()
        await asyncio.Event().wait()

    pool = Lane("calls", 1, 1, 1, None)
    try:
        c1 = ctx()
        task = asyncio.ensure_future(run_handler(coro, {}, c1, pool))
        async with asyncio.timeout(WAIT):
            await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert c1.cancelled.is_set()

        in_thread, release = threading.Event(), threading.Event()

        def plain(params: dict[str, Any], c: ToolContext) -> str:
            in_thread.set()
            release.wait(WAIT)
            return "late"

        c2 = ctx()
        task = asyncio.ensure_future(run_handler(plain, {}, c2, pool))
        async with asyncio.timeout(WAIT):
            assert await asyncio.to_thread(in_thread.wait, WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert c2.cancelled.is_set()
        release.set()
    finally:
        pool.close()


async def test_i8_a_handler_that_answers_at_once_arms_no_timer() -> None:
    """SPEC I8 (issue 13): a handler that returns without suspending runs under its limit
    with no timer handle scheduled, and its value comes back."""

    async def quick(params: dict[str, Any], c: ToolContext) -> dict[str, Any]:
        return {"echo": params["x"], "task": asyncio.current_task()}

    loop = asyncio.get_running_loop()
    pool = Lane("calls", 1, 1, 1, None)
    try:
        scheduled = len(loop._scheduled)  # type: ignore[attr-defined]
        value = await run_handler(quick, {"x": 7}, ctx(), pool, 5.0)
        assert len(loop._scheduled) == scheduled  # type: ignore[attr-defined]
        assert value == {"echo": 7, "task": asyncio.current_task()}
    finally:
        pool.close()


async def test_i8_a_handler_that_suspends_still_times_out_and_answers() -> None:
    """SPEC I8: after its first step a suspending handler goes on under its limit: past
    it, TimeoutError and ctx.cancelled; within it, the value, with every await's result
    and exception passed through (the eager first step changes nothing it sees)."""
    pool = Lane("calls", 1, 1, 1, None)
    seen: list[Any] = []

    async def slow(params: dict[str, Any], c: ToolContext) -> None:
        await asyncio.Event().wait()

    async def chatty(params: dict[str, Any], c: ToolContext) -> str:
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.set_result, "first")
        seen.append(await fut)
        await asyncio.sleep(0)  # a bare yield
        failing = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(failing.set_exception, KeyError("k"))
        try:
            await failing
        except KeyError as exc:
            seen.append(repr(exc))
        return "done"

    try:
        c1 = ctx()
        with pytest.raises(TimeoutError):
            await run_handler(slow, {}, c1, pool, 0.05)
        assert c1.cancelled.is_set()
        assert await run_handler(chatty, {}, ctx(), pool, WAIT) == "done"
        assert seen == ["first", "KeyError('k')"]
    finally:
        pool.close()


async def test_i8_an_awaitable_that_is_no_coroutine_still_runs_under_its_limit() -> None:
    """SPEC I8: the eager first step is for coroutines; any other awaitable (a future) is
    awaited under the limit as it is, answering or timing out."""
    loop = asyncio.get_running_loop()
    answered = loop.create_future()
    loop.call_soon(answered.set_result, {"ok": True})
    assert await _limited(answered, loop.time() + WAIT) == {"ok": True}
    with pytest.raises(TimeoutError):
        await _limited(loop.create_future(), loop.time() + 0.01)


async def test_i8_a_handler_past_its_limit_at_its_first_await_times_out() -> None:
    """SPEC I8 (found in review): the limit counts from the handler's start, so a handler
    whose first step (synchronous work) outlasted it ends in TimeoutError at its first
    suspension, however short; one that finishes without suspending keeps its value
    (nothing could interrupt it)."""

    async def slow_then_yield(params: dict[str, Any], c: ToolContext) -> str:
        time.sleep(0.06)  # noqa: ASYNC251 -- the blocking first step under test
        await asyncio.sleep(0)
        return "value"

    async def slow_only(params: dict[str, Any], c: ToolContext) -> str:
        time.sleep(0.06)  # noqa: ASYNC251 -- the blocking first step under test
        return "value"

    pool = Lane("calls", 1, 1, 1, None)
    try:
        with pytest.raises(TimeoutError):
            await run_handler(slow_then_yield, {}, ctx(), pool, 0.03)
        assert await run_handler(slow_only, {}, ctx(), pool, 0.03) == "value"
    finally:
        pool.close()
