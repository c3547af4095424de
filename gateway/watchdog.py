"""A watchdog for the event loop, from outside it (SPEC E3, case F23).

An ``async def`` handler that blocks (``time.sleep`` instead of ``await
asyncio.sleep``, a CPU-bound loop) freezes every session of the process, and nothing on
the loop can notice, because nothing on the loop runs. So the loop only *beats*: a
callback stamps ``time.monotonic()`` every ``threshold / 5`` seconds. A daemon thread
checks the stamp as often; when it is older than ``threshold``, the loop has not
turned: the thread logs one WARNING naming the tool whose handler is on the loop
thread's stack (``sys._current_frames``), with that stack, and counts the stall in
``toolbus_loop_stalls_total{tool}``. When the loop turns again, one INFO line gives the
stall's length. The stall itself cannot be undone; it is never silent.

Which tool is running is known without touching the handler: :func:`track` registers
each coroutine handler's frame while it runs, and the watchdog looks for those frames
on the blocked stack.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Coroutine
from types import FrameType
from typing import Any

from gateway.metrics import Metrics

logger = logging.getLogger("gateway.watchdog")

_RUNNING: dict[FrameType, tuple[str, str, str]] = {}
"""Frame of each coroutine handler now running -> (tool, session_id, call_id)."""


class track:
    """Mark ``coro`` (a handler's coroutine, not yet awaited) as ``tool``'s for as long as
    the block runs, so a stall inside it is blamed on that tool (SPEC E3).

    Lower-case as it is used like a function. A class rather than a ``@contextmanager``
    generator: it is entered on every call of an ``async def`` handler (issue 13)."""

    __slots__ = ("_frame", "_owner")

    def __init__(
        self, coro: Coroutine[Any, Any, Any], tool: str, session_id: str, call_id: str
    ) -> None:
        self._frame: FrameType | None = getattr(coro, "cr_frame", None)
        self._owner = (tool, session_id, call_id)

    def __enter__(self) -> None:
        if self._frame is not None:
            _RUNNING[self._frame] = self._owner

    def __exit__(self, *exc: object) -> None:
        if self._frame is not None:
            _RUNNING.pop(self._frame, None)


def blame(frame: FrameType | None) -> tuple[str, str, str] | None:
    """The innermost tracked handler on the stack ending at ``frame``, or ``None``."""
    while frame is not None:
        found = _RUNNING.get(frame)
        if found is not None:
            return found
        frame = frame.f_back
    return None


class Watchdog:
    """Watches one event loop from a daemon thread (SPEC E3).

    Args:
        threshold: seconds without a turn of the loop that count as a stall; ``0``
            disables the watchdog.
        metrics: the server's metrics (``loop_stalls``).
    """

    def __init__(self, threshold: float, metrics: Metrics) -> None:
        self.threshold = threshold
        self._metrics = metrics
        self._interval = threshold / 5
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._loop_thread = 0
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.stalls = 0
        """Stalls seen so far."""

    def start(self) -> None:
        """Start beating on the running loop and watching from a thread."""
        if self.threshold <= 0 or self._thread is not None:
            return
        self._loop_thread = threading.get_ident()
        self._loop = asyncio.get_running_loop()
        self._tick()
        self._thread = threading.Thread(target=self._watch, name="toolbus-watchdog", daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        self._beat = time.monotonic()
        self._timer = asyncio.get_running_loop().call_later(self._interval, self._tick)

    def stop(self) -> None:
        """Stop beating and watching (called on the loop)."""
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _watch(self) -> None:
        stalled_since: float | None = None
        loop = self._loop
        while not self._stop.wait(self._interval):
            if loop is None or loop.is_closed() or not loop.is_running():
                return  # the loop ended without stop(): nothing left to watch
            gap = time.monotonic() - self._beat
            if gap > self.threshold and stalled_since is None:
                stalled_since = self._beat
                self._report(gap)
            elif gap <= self.threshold and stalled_since is not None:
                logger.info(
                    "event loop turning again after a stall of about %.2f s",
                    self._beat - stalled_since,
                )
                stalled_since = None

    def _report(self, gap: float) -> None:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return
        found = blame(frame)
        tool, session_id, call_id = found if found else ("none", "", "")
        stack = "".join(traceback.format_stack(frame))
        self.stalls += 1
        self._metrics.loop_stalls.labels(tool).inc()
        logger.warning(
            "event loop blocked for %.2f s by tool %s (session %s, call %s); a handler must "
            "not block in async def (SPEC E3). Loop thread stack:\n%s",
            gap,
            tool,
            session_id or "-",
            call_id or "-",
            stack,
            extra={
                "tool": tool,
                "session_id": session_id,
                "call_id": call_id,
                "stalled_seconds": round(gap, 3),
                "stack": stack,
            },
        )
