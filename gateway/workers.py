"""Worker threads for plain handlers, shared fairly (SPEC E3, S3, J6).

A plain (non-``async``) handler runs in a worker thread so it never blocks the event
loop (SPEC S3). Threads come in two :class:`Lane` s with threads of their own:
``calls`` for sync calls and ``jobs`` for job handlers, so a quick call never queues
behind long jobs (case F30).

Within a lane a handler first takes a *slot*, and only then a thread. The slot is
held from the moment the handler starts until it really returns, not until its
timeout: a Python thread cannot be interrupted, so a handler past its timeout still
holds its thread and keeps counting against its session and its user (case F22).
Each session and each principal (tenant, user) may hold at most a configured number
of slots per lane; the rest of the lane stays free for everyone else.

A caller whose caps (or the whole lane) are full waits, first come first served among
the waiters allowed to go, until its deadline; past it :class:`NoThread` (wire code
``busy``: the handler never started). Counts for a session or user that holds nothing
are deleted, so nothing per session outlives its work (case F33).

Threads are daemon threads: a handler still running when the process exits after a
drain (SPEC S4) dies with it rather than completing a side effect after its job was
reported interrupted (SPEC J6).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from gateway.failures import ToolFailure
from gateway.metrics import Metrics
from protocol.errors import ErrorCode

logger = logging.getLogger("gateway.workers")

K = TypeVar("K")
UserKey = tuple[str | None, str]
"""A principal: (tenant, user)."""


class Waiter(Protocol):
    """Told when a caller of :meth:`Lane.acquire` has to wait for a slot (SPEC J6)."""

    def waiting(self) -> None:
        """No slot was free: the caller waits from now on. Called on the loop, once,
        before the wait begins, and never when a slot was free at once; raising ends
        the acquire with that exception, holding nothing."""


class NoThread(ToolFailure):
    """No worker slot became free for this session or user before the deadline (SPEC E3).

    The handler never started; the call ends ``call.error`` code ``busy`` (a job,
    which waits without a deadline, never sees it).
    """

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.BUSY, message)


@dataclass(slots=True, eq=False)
class Slot:
    """One worker thread held by one handler, from its start until it really returns.

    Attributes:
        session_id: the session the handler runs for.
        user: its principal, (tenant, user).
        tool: the tool's name.
        started: ``time.monotonic()`` when the slot was taken, in seconds.
        overdue: its caller stopped waiting (timeout or cancel) while the handler runs on.
    """

    session_id: str
    user: UserKey
    tool: str
    started: float = field(default_factory=time.monotonic)
    overdue: bool = False


@dataclass(frozen=True, slots=True)
class LaneStats:
    """Counts of one lane at one moment (metrics and tests, SPEC E3).

    Attributes:
        busy: slots held (handlers running in a thread).
        overdue: of those, handlers whose caller already stopped waiting.
        waiting: callers waiting for a slot.
        sessions: sessions holding at least one slot.
        users: principals holding at least one slot.
        threads: threads started so far (never more than the lane's size).
    """

    busy: int
    overdue: int
    waiting: int
    sessions: int
    users: int
    threads: int


class _Threads:
    """Daemon threads pulling work from one queue; started on demand up to ``size``."""

    def __init__(self, name: str, size: int) -> None:
        self._name = name
        self._size = size
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    @property
    def count(self) -> int:
        return len(self._threads)

    def submit(self, work: Callable[[], None], busy: int) -> None:
        """Queue ``work``; start a thread while fewer than ``busy`` exist, so every held
        slot has a thread and no work item waits behind another."""
        self._work.put(work)
        if len(self._threads) < min(busy, self._size):
            thread = threading.Thread(
                target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _run(self) -> None:
        while True:
            work = self._work.get()
            if work is None:
                return
            work()

    def close(self) -> None:
        """Let every thread exit once its current handler returns (does not wait)."""
        for _ in self._threads:
            self._work.put(None)


class Lane:
    """A bounded set of worker threads with per-session and per-user caps (SPEC E3).

    Args:
        name: ``calls`` or ``jobs`` (thread names and metric labels).
        size: threads in the lane.
        per_session: slots one session may hold at once.
        per_user: slots one principal (tenant, user) may hold at once.
        metrics: the server's metrics, or ``None``.
    """

    def __init__(
        self, name: str, size: int, per_session: int, per_user: int, metrics: Metrics | None
    ) -> None:
        self.name = name
        self.size = size
        self.per_session = per_session
        self.per_user = per_user
        # labels() re-validates on every call; the children are resolved once.
        self._gauges = (
            (
                metrics.worker_threads.labels(name, "busy"),
                metrics.worker_threads.labels(name, "overdue"),
            )
            if metrics is not None
            else None
        )
        self._threads = _Threads(f"toolbus-{name}", size)
        self._busy: set[Slot] = set()
        self._by_session: dict[str, int] = {}
        self._by_user: dict[UserKey, int] = {}
        self._waiters: deque[tuple[Slot, asyncio.Future[None]]] = deque()
        self._changed: asyncio.Event | None = None

    # -- accounting ------------------------------------------------------------------------

    def held_by_session(self, session_id: str) -> int:
        """Slots the session holds now (running or overdue handlers)."""
        return self._by_session.get(session_id, 0)

    def held_by_user(self, tenant: str | None, user: str) -> int:
        """Slots the principal holds now, over all its sessions."""
        return self._by_user.get((tenant, user), 0)

    def stats(self) -> LaneStats:
        """The lane's counts now."""
        return LaneStats(
            busy=len(self._busy),
            overdue=sum(1 for slot in self._busy if slot.overdue),
            waiting=len(self._waiters),
            sessions=len(self._by_session),
            users=len(self._by_user),
            threads=self._threads.count,
        )

    def _fits(self, slot: Slot) -> bool:
        return (
            len(self._busy) < self.size
            and self._by_session.get(slot.session_id, 0) < self.per_session
            and self._by_user.get(slot.user, 0) < self.per_user
        )

    def _take(self, slot: Slot) -> None:
        self._busy.add(slot)
        self._by_session[slot.session_id] = self._by_session.get(slot.session_id, 0) + 1
        self._by_user[slot.user] = self._by_user.get(slot.user, 0) + 1
        self._changed_now()

    def _release(self, slot: Slot) -> None:
        if slot not in self._busy:
            return
        self._busy.discard(slot)
        _decrement(self._by_session, slot.session_id)
        _decrement(self._by_user, slot.user)
        if slot.overdue:
            logger.info(
                "tool %s returned %.1f s after its caller stopped waiting; thread freed",
                slot.tool,
                time.monotonic() - slot.started,
            )
        self._grant()
        self._changed_now()

    def _grant(self) -> None:
        """Give freed slots to waiters, in order, skipping those whose caps are full."""
        for entry in list(self._waiters):
            slot, future = entry
            if future.done():
                self._waiters.remove(entry)
            elif self._fits(slot):
                self._waiters.remove(entry)
                self._take(slot)
                future.set_result(None)

    def _changed_now(self) -> None:
        if self._gauges is not None:
            busy, overdue = self._gauges
            busy.set(len(self._busy))
            overdue.set(sum(1 for slot in self._busy if slot.overdue))
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def changed(self) -> Coroutine[Any, Any, bool]:
        """An awaitable that returns at the lane's next change of counts (slot taken or
        freed) after this call. The event is taken here, not when the awaitable first
        runs: a change between a check of the counts and that first step is not lost."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed.wait()

    def live(self) -> int:
        """Slots held by handlers whose caller still waits for them (not overdue)."""
        return sum(1 for slot in self._busy if not slot.overdue)

    async def wait_live(self, deadline: float) -> int:
        """Wait until no handler whose caller still waits holds a slot, or ``deadline``
        (event-loop time) passes; returns how many such handlers still run (SPEC J6)."""
        loop = asyncio.get_running_loop()
        while True:
            live = self.live()
            remaining = deadline - loop.time()
            if not live or remaining <= 0:
                return live
            try:
                async with asyncio.timeout(remaining):
                    await self.changed()
            except TimeoutError:
                pass

    # -- running ---------------------------------------------------------------------------

    async def acquire(
        self,
        session_id: str,
        user: UserKey,
        tool: str,
        deadline: float | None,
        waiter: Waiter | None = None,
    ) -> Slot:
        """Take a slot, waiting until ``deadline`` (event-loop time; ``None``: no limit).

        ``waiter`` is told (:meth:`Waiter.waiting`) when no slot is free and the wait
        begins: a sync call records then that its handler has not started (SPEC J6). A
        slot free at once costs it nothing.

        Raises:
            NoThread: the deadline passed with the session's, the user's or the lane's
                slots all held.
        """
        slot = Slot(session_id, user, tool)
        if self._fits(slot):
            self._take(slot)
            return slot
        if waiter is not None:
            waiter.waiting()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (slot, future)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout_at(deadline):
                await asyncio.shield(future)
        except TimeoutError:
            if not future.done():
                future.cancel()
                raise NoThread(self._why(slot)) from None
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release(slot)  # granted in the same tick the caller was cancelled
            future.cancel()
            raise
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)
        return slot

    def _why(self, slot: Slot) -> str:
        tenant, user = slot.user
        return (
            f"no worker thread became free in time: this session holds "
            f"{self.held_by_session(slot.session_id)} of {self.per_session}, its user "
            f"{self.held_by_user(tenant, user)} of {self.per_user}, the {self.name} lane "
            f"{len(self._busy)} of {self.size}"
        )

    def start(
        self, slot: Slot, func: Callable[[], Any], returned: asyncio.Future[None] | None = None
    ) -> asyncio.Future[Any]:
        """Run ``func()`` in a thread under ``slot``; the slot is freed when it returns.

        ``returned``, when given, is set (on the loop) once ``func`` really returned, also
        after the returned future was cancelled (SPEC E3, J1: a job's slots are held until
        then, :class:`gateway.job_slots.Claim`).

        Returns:
            A future of ``func``'s value or exception. Cancelling it (a timeout) marks the
            slot overdue; the thread runs on and the slot stays held until ``func``
            really returns (SPEC E3).
        """
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Any] = loop.create_future()

        def finish(ok: bool, value: Any) -> None:
            self._release(slot)
            if returned is not None and not returned.done():
                returned.set_result(None)
            if result.done():
                return
            if ok:
                result.set_result(value)
            else:
                result.set_exception(value)

        def work() -> None:
            ok, value = True, None
            try:
                value = func()
            except BaseException as exc:  # handed to the awaiting caller
                ok, value = False, exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
                loop.call_soon_threadsafe(finish, ok, value)

        def abandoned(future: asyncio.Future[Any]) -> None:
            if future.cancelled() and slot in self._busy:
                slot.overdue = True
                self._changed_now()

        result.add_done_callback(abandoned)
        self._threads.submit(work, len(self._busy))
        return result

    def cancel(self, slot: Slot) -> None:
        """Give back a slot whose handler never started (a gate refused it, SPEC A7)."""
        self._release(slot)

    def close(self) -> None:
        """Let the threads exit once their handlers return (daemon threads; no wait)."""
        self._threads.close()


def _decrement(table: dict[K, int], key: K) -> None:
    """One less for ``key``; the entry goes at zero, so idle keys cost nothing (F33)."""
    left = table[key] - 1
    if left:
        table[key] = left
    else:
        del table[key]


class Workers:
    """The two lanes of worker threads (SPEC E3): ``calls`` and ``jobs``.

    Args:
        calls: the sync-call lane.
        jobs: the job lane.
    """

    def __init__(self, calls: Lane, jobs: Lane) -> None:
        self.calls = calls
        self.jobs = jobs

    async def wait_live(self, deadline: float) -> int:
        """Wait, until ``deadline`` (event-loop time), for every handler whose caller still
        waits on it; returns how many still run then (SPEC J6 drain)."""
        left = await self.calls.wait_live(deadline)
        return left + await self.jobs.wait_live(deadline)

    def close(self) -> None:
        self.calls.close()
        self.jobs.close()
