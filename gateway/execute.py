"""Running one handler: on the loop when async, in a worker thread when plain (SPEC S3, I8)."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.context import ToolContext
from gateway.watchdog import track
from gateway.workers import Lane


async def run_handler(
    func: Callable[..., Any],
    params: dict[str, Any],
    ctx: ToolContext,
    lane: Lane,
    limit: float | None = None,
    *,
    wait: float | None = None,
    on_start: Callable[[], Awaitable[None] | None] | None = None,
) -> Any:
    """Call ``func(params, ctx)`` without ever blocking the event loop (SPEC S3, E3).

    A coroutine function is awaited on the loop (tracked by the watchdog, so a handler
    that blocks the loop is named, SPEC E3). A plain function first takes a slot in
    ``lane`` (waiting at most ``wait`` seconds, ``None`` = no limit, else
    :class:`gateway.workers.NoThread`), then runs in one of its threads; the slot stays
    held until the function really returns, even past ``limit`` (SPEC E3).

    When the caller is cancelled or ``limit`` passes, ``ctx.cancelled`` is set so a
    threaded handler can stop early (a thread cannot be interrupted); its late return
    value is dropped. :class:`asyncio.CancelledError` propagates (SPEC I8: never
    swallowed); the timeout raises :class:`TimeoutError`.

    Args:
        func: the handler.
        params: its validated arguments.
        ctx: its context.
        lane: the worker lane for a plain handler.
        limit: seconds the handler may run once started (its timeout); ``None``: none.
        wait: seconds a plain handler may wait for a slot; ``None`` for no limit.
        on_start: called on the loop right before the handler starts (a job turns
            ``running`` only then, SPEC J6); raising stops the handler from starting.
            It may return an awaitable (the start's share of a group commit), awaited
            before the handler starts; raising from it stops the start too.

    SPEC A7: ``ctx.recheck()`` runs right before the handler starts, after every wait
    (on the loop, once a slot is held; again after ``on_start``'s awaitable); the
    :class:`gateway.authority.Lapse` it raises propagates and the handler never runs.
    """
    loop = asyncio.get_running_loop()
    try:
        if _is_async(func):
            ctx.recheck()
            if on_start is not None:
                await _started(on_start, ctx)
            coro = func(params, ctx)
            with track(coro, ctx.tool, ctx.session_id, ctx.call_id):
                async with asyncio.timeout(limit):
                    return await coro
        slot = await lane.acquire(
            ctx.session_id,
            (ctx.tenant, ctx.user),
            ctx.tool,
            None if wait is None else loop.time() + wait,
        )
        try:
            ctx.recheck()
            if on_start is not None:
                await _started(on_start, ctx)
        except BaseException:
            lane.cancel(slot)
            raise
        async with asyncio.timeout(limit):
            return await lane.start(slot, functools.partial(func, params, ctx))
    except (asyncio.CancelledError, TimeoutError):
        ctx.cancelled.set()
        raise


async def _started(on_start: Callable[[], Awaitable[None] | None], ctx: ToolContext) -> None:
    """``on_start()``, and when it returned an awaitable, that awaited and the A7
    re-check made again (the await was a wait)."""
    pending = on_start()
    if pending is not None:
        await pending
        ctx.recheck()


@functools.lru_cache(maxsize=4096)
def _is_async(func: Callable[..., Any]) -> bool:
    """``inspect.iscoroutinefunction``, cached: it is slow and asked on every call."""
    return inspect.iscoroutinefunction(func)


def as_object(value: Any) -> dict[str, Any]:
    """A handler's value as a JSON object: objects pass, others become ``{"value": v}`` (I8)."""
    if isinstance(value, dict):
        return value
    return {"value": value}
