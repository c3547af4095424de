"""Background tasks that cannot vanish: a set that keeps a reference to each one.

The event loop keeps only weak references to tasks. A task created with
``loop.create_task(...)`` whose result nobody keeps can be garbage-collected before it
finishes, so whatever it was to do (e.g. the reply to a ``job.cancel``, SPEC J3) is lost
without a trace. Every fire-and-forget task in ``gateway/`` goes through
:meth:`TaskSet.spawn`, which holds the task until it is done and logs any exception it
ends with. ``tests/gateway/test_background_tasks.py`` walks the source and fails on a
``create_task``/``ensure_future`` whose result is thrown away.

:func:`periodic` is the one shape of a maintenance loop (store purge, catalog hot
reload): a failing round is logged with its traceback and retried with backoff, so one
exception never stops the loop for good, silently.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

logger = logging.getLogger("gateway.tasks")


class TaskSet:
    """Strong references to running background tasks, dropped as each one ends."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        """Run ``coro`` as a task on the running loop and keep it until it ends.

        Returns:
            The task (awaiting or cancelling it is allowed, keeping it is not needed).
        """
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("background task %s failed", task.get_name(), exc_info=task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def cancel_all(self) -> None:
        """Cancel every task still running and wait for them to end."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


MAX_BACKOFF = 60.0
"""Longest wait, in seconds, between two failing rounds of a :func:`periodic` loop."""


async def periodic(
    name: str,
    interval: float,
    step: Callable[[], Awaitable[Any] | Any],
    *,
    max_backoff: float = MAX_BACKOFF,
) -> None:
    """Run ``step`` every ``interval`` seconds until cancelled, surviving its failures.

    A round that raises is logged at ERROR with the traceback and the count of failures
    in a row; the wait before the next round doubles from ``interval`` up to
    ``max(interval, max_backoff)``. The first round that succeeds again logs a WARNING
    and restores ``interval``.

    Args:
        name: what the loop does, for the log (e.g. ``"store purge"``).
        interval: seconds between rounds; > 0.
        step: a plain or coroutine function taking no arguments.
        max_backoff: the longest wait after failures, in seconds.
    """
    delay, failures = interval, 0
    while True:
        await asyncio.sleep(delay)
        try:
            outcome = step()
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:
            failures += 1
            delay = min(max(interval, max_backoff), delay * 2)
            logger.exception("%s failed (%d in a row); next try in %.1f s", name, failures, delay)
            continue
        if failures:
            logger.warning("%s works again after %d failed rounds", name, failures)
        delay, failures = interval, 0
