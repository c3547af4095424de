"""Running one handler: on the loop when async, in a worker thread when plain (SPEC S3, I8)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any

from gateway.context import ToolContext
from gateway.watchdog import track
from gateway.workers import Lane, Waiter


class Start:
    """The ``on_start`` of :func:`run_handler` for a handler that may change hands
    before it starts (SPEC I14, J6, I8).

    A sync call still running at ``promote_after`` becomes a job, and its plain handler
    may still wait for a worker thread then. Until the handler starts, neither the call
    nor the job may be reported as started: the start calls :attr:`then`, which is the
    call's own start (:meth:`begin`) at first; the job runner points it at the job's
    when it adopts a handler that has not started, so the job turns ``running`` only
    then.

    Attributes:
        then: what the start does now (an ``on_start``: it may return an awaitable, and
            raising stops the handler from starting); ``None``: :meth:`begin`.
        started: ``True`` once the start was reached.
        returned: for a handler that may be promoted, done once it really returned (the
            ``returned`` of :func:`run_handler`): the job that adopts it holds its slots
            until then (SPEC J1, I14); ``None`` otherwise.
    """

    __slots__ = ("returned", "started", "then")

    def __init__(self, then: Callable[[], Awaitable[None] | None] | None = None) -> None:
        self.then = then
        self.started = False
        self.returned: asyncio.Future[None] | None = None

    def __call__(self) -> Awaitable[None] | None:
        self.started = True
        then = self.then
        return self.begin() if then is None else then()

    def begin(self) -> Awaitable[None] | None:
        """The start of the handler's first owner, while :attr:`then` is ``None`` (a
        subclass's, :class:`gateway.call_start.CallStart`; here nothing). Not a bound
        method kept in :attr:`then`: that would make each start a reference cycle, left
        to the garbage collector."""
        return None


async def run_handler(
    func: Callable[..., Any],
    params: dict[str, Any],
    ctx: ToolContext,
    lane: Lane,
    limit: float | None = None,
    *,
    wait: float | None = None,
    on_start: Callable[[], Awaitable[None] | None] | None = None,
    waiter: Waiter | None = None,
    returned: asyncio.Future[None] | None = None,
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
        waiter: told when a plain handler has to wait for a slot, before the wait
            (:meth:`Lane.acquire <gateway.workers.Lane.acquire>`; SPEC J6: a sync call
            records then that it has not started). Not told when a slot is free at once,
            nor for a coroutine function.
        returned: set once the handler really returned: a plain one when its thread
            did, even after a cancel or the timeout (the thread runs on, SPEC E3); at
            once otherwise (a coroutine, a handler that never started). A job holds its
            slots until then (SPEC J1, :class:`gateway.job_slots.Claim`).

    SPEC A7: ``ctx.recheck()`` runs right before the handler starts, after every wait
    (on the loop, once a slot is held; again after ``on_start``'s awaitable); the
    :class:`gateway.authority.Lapse` it raises propagates and the handler never runs.
    """
    loop = asyncio.get_running_loop()
    in_thread = False
    try:
        if _is_async(func):
            ctx.recheck()
            if on_start is not None:
                await _started(on_start, ctx)
            coro = func(params, ctx)
            with track(coro, ctx.tool, ctx.session_id, ctx.call_id):
                if limit is None:
                    return await coro
                return await _limited(coro, loop.time() + limit)
        slot = await lane.acquire(
            ctx.session_id,
            (ctx.tenant, ctx.user),
            ctx.tool,
            None if wait is None else loop.time() + wait,
            waiter,
        )
        try:
            ctx.recheck()
            if on_start is not None:
                await _started(on_start, ctx)
        except BaseException:
            lane.cancel(slot)
            raise
        thread = lane.start(slot, functools.partial(func, params, ctx), returned)
        in_thread = True
        async with asyncio.timeout(limit):
            return await thread
    except (asyncio.CancelledError, TimeoutError):
        ctx.cancelled.set()
        raise
    finally:
        if returned is not None and not in_thread and not returned.done():
            returned.set_result(None)


async def _limited(coro: Coroutine[Any, Any, Any], deadline: float) -> Any:
    """Await ``coro`` (not started yet) until ``deadline`` (event-loop time, in seconds),
    else :class:`TimeoutError` (SPEC I8).

    Its first step runs at once, with no timer: a handler that answers without
    suspending (most quick tools) costs no timer handle, heap push and cancel, about
    11 us a call on the bench machine (issue 13). A handler that suspends goes on
    under ``asyncio.timeout_at(deadline)``, in this same task, so its limit still counts
    from its start: a first step that outlasted it ends in :class:`TimeoutError` at that
    first suspension. The step runs in the caller's task: a handler sees the same
    ``current_task()`` and context variables as when awaited directly.
    """
    if not isinstance(coro, types.CoroutineType):  # an awaitable of another kind
        async with asyncio.timeout_at(deadline):
            return await coro
    try:
        waiting = coro.send(None)
    except StopIteration as done:
        return done.value
    async with asyncio.timeout_at(deadline):
        return await _resume(coro, waiting)


@types.coroutine
def _resume(coro: Coroutine[Any, Any, Any], waiting: Any) -> Generator[Any, Any, Any]:
    """Go on driving ``coro`` after a first step of its own yielded ``waiting``.

    Each value ``coro`` yields (a future it awaits, or ``None`` for a bare yield) goes
    to the task unchanged, and what the task sends or throws back goes to ``coro``, as
    ``await`` does; the value ``coro`` returns is returned. A cancellation thrown in
    reaches ``coro`` (SPEC I8: never swallowed)."""
    while True:
        try:
            sent = yield waiting
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            try:
                waiting = coro.throw(exc)
            except StopIteration as done:
                return done.value
        else:
            try:
                waiting = coro.send(sent)
            except StopIteration as done:
                return done.value


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
