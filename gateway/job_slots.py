"""The job bounds: per session, per user and server-wide (SPEC J1, E3, case F33).

A job waits for a slot of its session, then one of its user (so a user with many
sessions cannot take every slot), then one of the server, before its handler starts.
A session's or user's entry exists only while some job of theirs holds or awaits it,
so ended sessions leave nothing behind (case F33).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from gateway.config import JobsConfig
from gateway.session import Session


@dataclass(slots=True)
class _Bound:
    """One session's or user's job bound (SPEC J1, E3), alive only while some job of theirs
    holds or awaits it."""

    semaphore: asyncio.Semaphore
    holders: int = 0


@asynccontextmanager
async def _slot(table: dict[Any, _Bound], key: Any, limit: int) -> AsyncIterator[None]:
    """Hold one of ``key``'s job slots in ``table`` (SPEC J1, E3). The entry is deleted
    when no job of ``key`` holds or awaits it, so ended sessions leave nothing (F33)."""
    entry = table.get(key)
    if entry is None:
        entry = table[key] = _Bound(asyncio.Semaphore(limit))
    entry.holders += 1
    try:
        async with entry.semaphore:
            yield
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
        self._global = asyncio.Semaphore(config.max_concurrent)
        self._per_session: dict[str, _Bound] = {}
        self._per_user: dict[tuple[str | None, str], _Bound] = {}

    @asynccontextmanager
    async def hold(self, session: Session) -> AsyncIterator[None]:
        """Wait for a slot of ``session``, of its user and of the server; hold all three
        while the context is open."""
        # SPEC J1, E3: the session's bound, then its user's (so a user with many
        # sessions cannot take every slot), then the server's.
        user = (session.tenant, session.user)
        async with (
            _slot(self._per_session, session.id, self._config.max_per_session),
            _slot(self._per_user, user, self._config.max_per_user),
            self._global,
        ):
            yield

    def tracked(self) -> dict[str, int]:
        """Entries held now (case F33): session and user job bounds."""
        return {
            "job_session_bounds": len(self._per_session),
            "job_user_bounds": len(self._per_user),
        }
