"""The job bounds: per session, per user and server-wide (SPEC J1, E3, I14, case F33).

A job waits for a slot of its session, then one of its user (so a user with many
sessions cannot take every slot), then one of the server, before its handler starts.
A sync call promoted to a job (SPEC I14) takes its three slots at once instead
(:meth:`JobSlots.take`): its handler runs already and cannot be paused, so it counts
even past a bound, and the jobs after it wait ``queued`` until the count is back under
the bound. A session's or user's entry exists only while some job of theirs holds or
awaits it, so ended sessions leave nothing behind (case F33).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from gateway.config import JobsConfig
from gateway.session import Session


@dataclass(slots=True)
class _Bound:
    """At most ``limit`` slots held, waiters served in order (SPEC J1, E3); a slot taken
    at once (:meth:`take`) may go past ``limit``. A session's or user's one is alive
    only while some job of theirs holds or awaits it (``holders``)."""

    limit: int
    held: int = 0
    holders: int = 0
    _waiters: deque[asyncio.Future[None]] = field(default_factory=deque)

    async def acquire(self) -> None:
        """Wait, in order, until fewer than ``limit`` slots are held; take one."""
        if self.held < self.limit and not self._waiters:
            self.held += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.held -= 1  # granted in the tick the waiter was cancelled
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            self._grant()  # a slot given back, or a waiter gone from the head

    def take(self) -> None:
        """Take a slot now, whatever is held (SPEC I14: a handler that runs already)."""
        self.held += 1

    def release(self) -> None:
        """Give a slot back; waiters get the slots now under ``limit``, in order."""
        self.held -= 1
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self.held < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.held += 1
                waiter.set_result(None)


@contextmanager
def _entry(table: dict[Any, _Bound], key: Any, limit: int) -> Iterator[_Bound]:
    """``key``'s bound in ``table`` while the context is open; the entry is deleted when
    no job of ``key`` holds or awaits it, so ended sessions leave nothing (F33)."""
    entry = table.get(key)
    if entry is None:
        entry = table[key] = _Bound(limit)
    entry.holders += 1
    try:
        yield entry
    finally:
        entry.holders -= 1
        if not entry.holders:
            del table[key]


class JobSlots:
    """Slots of running jobs under the three bounds of ``jobs`` settings (SPEC J1, E3).

    Args:
        config: ``max_per_session``, ``max_per_user`` and ``max_concurrent``.
    """

    def __init__(self, config: JobsConfig) -> None:
        self._config = config
        self._global = _Bound(config.max_concurrent)
        self._per_session: dict[str, _Bound] = {}
        self._per_user: dict[tuple[str | None, str], _Bound] = {}

    @asynccontextmanager
    async def hold(self, session: Session) -> AsyncIterator[Claim]:
        """Wait for a slot of ``session``, of its user and of the server; hold all three
        while the context is open, and after it while its :class:`Claim` says so."""
        # SPEC J1, E3: the session's bound, then its user's (so a user with many
        # sessions cannot take every slot), then the server's.
        stack = self._entries(session)
        try:
            for bound in self._bounds(session):
                await bound.acquire()
                stack.callback(bound.release)
        except BaseException:
            stack.close()
            raise
        claim = Claim(stack)
        try:
            yield claim
        finally:
            claim.end()

    @contextmanager
    def take(self, session: Session) -> Iterator[Claim]:
        """Take a slot of ``session``, of its user and of the server at once, even past
        their bounds, and hold them while the context is open, and after it while its
        :class:`Claim` says so (SPEC I14, J1: a promoted call's handler, which runs
        already)."""
        stack = self._entries(session)
        for bound in self._bounds(session):
            bound.take()
            stack.callback(bound.release)
        claim = Claim(stack)
        try:
            yield claim
        finally:
            claim.end()

    def _entries(self, session: Session) -> ExitStack:
        """The session's and its user's bound entries, open in a new stack."""
        config = self._config
        stack = ExitStack()
        stack.enter_context(_entry(self._per_session, session.id, config.max_per_session))
        stack.enter_context(_entry(self._per_user, _user(session), config.max_per_user))
        return stack

    def _bounds(self, session: Session) -> tuple[_Bound, _Bound, _Bound]:
        """The session's, its user's and the server's bound, in the order they are taken;
        the first two exist while :meth:`_entries` holds them open."""
        return self._per_session[session.id], self._per_user[_user(session)], self._global

    def tracked(self) -> dict[str, int]:
        """Entries held now (case F33): session and user job bounds."""
        return {
            "job_session_bounds": len(self._per_session),
            "job_user_bounds": len(self._per_user),
        }


class Claim:
    """The three slots one job holds (SPEC J1, E3, I14).

    They are given back when the job's slot context ends, unless :attr:`until` is a
    future not done then: a plain handler's worker thread, which runs on after its job
    was cancelled or timed out (a thread cannot be interrupted, SPEC E3). Then they are
    given back once it is done, so the jobs after it wait ``queued`` until the handler
    really returned and the bound holds for what really runs.

    Attributes:
        until: done once the job's handler really returned; ``None``: nothing to wait
            for (a coroutine handler, or none started).
    """

    __slots__ = ("_stack", "until")

    def __init__(self, stack: ExitStack) -> None:
        self._stack = stack
        self.until: asyncio.Future[None] | None = None

    def end(self) -> None:
        """The job's slot context ended: give the slots back now, or once :attr:`until`
        is done."""
        until = self.until
        if until is None or until.done():
            self._stack.close()
        else:
            until.add_done_callback(lambda _: self._stack.close())


def _user(session: Session) -> tuple[str | None, str]:
    return (session.tenant, session.user)
