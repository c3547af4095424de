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
from contextlib import asynccontextmanager, contextmanager
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


@asynccontextmanager
async def _waited(bound: _Bound) -> AsyncIterator[None]:
    await bound.acquire()
    try:
        yield
    finally:
        bound.release()


@contextmanager
def _taken(bound: _Bound) -> Iterator[None]:
    bound.take()
    try:
        yield
    finally:
        bound.release()


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
    async def hold(self, session: Session) -> AsyncIterator[None]:
        """Wait for a slot of ``session``, of its user and of the server; hold all three
        while the context is open."""
        # SPEC J1, E3: the session's bound, then its user's (so a user with many
        # sessions cannot take every slot), then the server's.
        config = self._config
        user = (session.tenant, session.user)
        with (
            _entry(self._per_session, session.id, config.max_per_session) as mine,
            _entry(self._per_user, user, config.max_per_user) as users,
        ):
            async with _waited(mine), _waited(users), _waited(self._global):
                yield

    @contextmanager
    def take(self, session: Session) -> Iterator[None]:
        """Take a slot of ``session``, of its user and of the server at once, even past
        their bounds, and hold them while the context is open (SPEC I14, J1: a promoted
        call's handler, which runs already)."""
        config = self._config
        user = (session.tenant, session.user)
        with (
            _entry(self._per_session, session.id, config.max_per_session) as mine,
            _entry(self._per_user, user, config.max_per_user) as users,
            _taken(mine),
            _taken(users),
            _taken(self._global),
        ):
            yield

    def tracked(self) -> dict[str, int]:
        """Entries held now (case F33): session and user job bounds."""
        return {
            "job_session_bounds": len(self._per_session),
            "job_user_bounds": len(self._per_user),
        }
