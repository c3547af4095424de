"""The I15 ledger row rides the tick's group commit (SPEC I15, D1, D6).

A real :class:`SqliteStore` and a real :class:`Outbox`; what is durable is read through
a second SQLite connection, which sees committed rows only.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from gateway.outbox import Outbox
from gateway.store import SqliteStore, StoreUnavailable
from gateway.store_rows import LedgerRow
from tests.support import WAIT


def _row(call_id: str) -> LedgerRow:
    return LedgerRow("", "ann", call_id, "charge", "0" * 64, "running", None, time.time())


def _durable(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute("SELECT call_id FROM call_ledger")}


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Poll the outbox's state (its retry timer fires on its own; nothing to await)."""
    async with asyncio.timeout(WAIT):
        while not condition():  # noqa: ASYNC110 - outbox state, no event to await
            await asyncio.sleep(0.005)


class CountingStore:
    """A store that counts its commits and refuses them while :attr:`failing` is set."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.commits = 0
        self.failing = False

    def commit(self) -> None:
        if self.failing:
            raise StoreUnavailable("test: commit refused")
        self.commits += 1
        self.inner.commit()

    def journal(self) -> bool:
        """Never: these tests count the commits of a store without a journal (as
        PostgreSQL's); the journal's flushes are tested in test_d1_journaled_flush.py."""
        return False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


async def test_i15_rows_staged_in_one_tick_are_durable_before_their_waiters_go_on(
    tmp_path: Path,
) -> None:
    """SPEC I15: the first writer of a tick commits at once; the later ones wait for the
    tick's one group commit, and none is told "durable" before its row is committed."""
    path = tmp_path / "t.db"
    store = CountingStore(SqliteStore(path))
    outbox = Outbox(store)  # type: ignore[arg-type]
    try:
        store.stage_ledger(_row("c1"))
        first = outbox.durable()
        assert first.done()
        assert first.result() is True
        assert _durable(path) == {"c1"}
        store.stage_ledger(_row("c2"))
        second = outbox.durable()
        store.stage_ledger(_row("c3"))
        third = outbox.durable()
        assert not second.done()
        assert not third.done()
        assert _durable(path) == {"c1"}  # their handlers may not start yet
        assert (await second, await third) == (True, True)
        assert _durable(path) == {"c1", "c2", "c3"}
        assert store.commits == 2
        store.stage_ledger(_row("c4"))
        fourth = outbox.durable()  # a new tick: the first writer commits at once again
        assert fourth.done()
        assert fourth.result() is True
        assert _durable(path) == {"c1", "c2", "c3", "c4"}
    finally:
        outbox.close()
        store.inner.close()


async def test_i15_a_failed_group_commit_tells_every_waiter(tmp_path: Path) -> None:
    """SPEC I15, D6: when the tick's commit fails, each waiting call is told "not
    durable" (its handler must not start) and its row stays staged: the outbox's retry
    commits it. A closed outbox answers "not durable" at once."""
    path = tmp_path / "t.db"
    store = CountingStore(SqliteStore(path))
    outbox = Outbox(store)  # type: ignore[arg-type]
    try:
        store.stage_ledger(_row("c1"))
        assert outbox.durable().result() is True
        store.stage_ledger(_row("c2"))
        waiting = outbox.durable()
        store.failing = True
        assert await waiting is False
        assert _durable(path) == {"c1"}
        store.failing = False
        await wait_until(lambda: outbox.failing_since is None, "the retry's commit")
        assert _durable(path) == {"c1", "c2"}
        outbox.close()
        after = outbox.durable()
        assert after.done()
        assert after.result() is False
    finally:
        store.inner.close()


async def test_i15_a_writer_not_at_once_always_joins_the_group_commit(tmp_path: Path) -> None:
    """SPEC I15: `durable(at_once=False)` (a session without ungated `tool_start`) waits
    for the flush even as the tick's first writer; its row is durable when told so."""
    path = tmp_path / "t.db"
    store = CountingStore(SqliteStore(path))
    outbox = Outbox(store)  # type: ignore[arg-type]
    try:
        store.stage_ledger(_row("c1"))
        first = outbox.durable(at_once=False)
        assert not first.done()
        assert _durable(path) == set()
        assert await first is True
        assert _durable(path) == {"c1"}
        assert store.commits == 1
    finally:
        outbox.close()
        store.inner.close()
