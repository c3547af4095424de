"""Support for the storage-fault tests (SPEC D6): checked peers, a flaky store, waits.

:class:`CheckedPeer` asserts, for every durable frame it receives, that the event is
already committed in the store with the same content: a frame the log does not hold
was never sent (SPEC D6). :class:`FlakyStore` is a :class:`~gateway.store.Store` that
fails commits at random at the interface seam. :func:`until` waits for a server state
(it polls a condition; it does not order events by sleeping).
"""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from gateway.server import Gateway
from gateway.store import SqliteStore, StoreUnavailable
from gateway.store_journal import SUFFIX
from tests.support import MS, WAIT, Peer, resume_fields

LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
"""
"""``python -c LOCKER DB``: holds the write lock of the SQLite file ``DB`` from another
process (prints ``locked``) until a line arrives on its stdin (SPEC D6, case F20)."""

Stored = Callable[[str, int], bytes | None]
"""``(session_id, seq)`` -> the committed event body, or ``None``."""


def stored_in(path: Path) -> Stored:
    """Read durable events: committed in the SQLite file at ``path`` (on a connection of
    its own), or in a batch entry of its journal (``<path>-intent``: a flush journaled,
    its commit still owed, SPEC D1); what a restarted server would find."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    journal = Path(str(path) + SUFFIX)

    def stored(session_id: str, seq: int) -> bytes | None:
        row = db.execute(
            "SELECT body FROM events WHERE session_id=? AND seq=?", (session_id, seq)
        ).fetchone()
        if row is not None:
            return bytes(row[0])
        return journaled_event(journal, session_id, seq)

    return stored


def journaled_event(journal: Path, session_id: str, seq: int) -> bytes | None:
    """The body of event ``seq`` of a session in the journal's batch entries, if any."""
    if not journal.exists():
        return None
    for line in journal.read_bytes().split(b"\n"):
        entry = orjson.loads(line) if line.startswith(b"{") else None
        for write in entry["writes"] if entry else ():
            if write[:3] == ["e", session_id, seq]:
                return str(write[3]).encode()
    return None


async def first_commit_fails(gw: Gateway, p: Peer) -> None:
    """Make ``gw`` commit and wait until that failed (SPEC D6). A flush journals every
    row without a commit (SPEC D1); a ``context.update`` stages the session's row, and
    the commit its flush owes (``store.settle_after`` later) fails. Its reply (not an
    event) is read here; the context does not change, so no ``catalog`` event
    follows."""
    await p.send({"type": "context.update", "id": "probe", "context": {}})
    await p.expect("context", id="probe")
    await until(lambda: gw.outbox.failing_since is not None, "a failed commit")


class CheckedPeer(Peer):
    """A :class:`Peer` that checks each durable frame is committed when it arrives."""

    def __init__(self, ws: Any, stored: Stored) -> None:
        super().__init__(ws)
        self.stored = stored
        self.events: dict[int, dict[str, Any]] = {}
        """Every durable event received, by seq (a replay must agree with it)."""
        self.hello_fields: dict[str, Any] = {}
        """The credential this peer said hello with (a resume uses it again)."""

    async def recv(self) -> dict[str, Any]:
        message = await super().recv()
        seq = message.get("seq")
        if seq is not None and message["type"] != "welcome":
            sid = self.welcome["session_id"]
            body = self.stored(sid, seq)
            assert body is not None, f"seq {seq} sent before it was committed: {message}"
            assert orjson.loads(body) == message
            known = self.events.setdefault(seq, message)
            assert known == message, f"seq {seq} received twice with other content"
        return message


@asynccontextmanager
async def checked_peer(gw: Gateway, stored: Stored, **hello: Any) -> AsyncIterator[CheckedPeer]:
    """A :class:`CheckedPeer` connected to ``gw`` that said hello."""
    async with connect(gw.url, subprotocols=["toolbus.v1"], max_size=None) as ws:  # type: ignore[list-item]
        p = CheckedPeer(ws, stored)
        p.hello_fields = {"token": hello.pop("token", "alice-token")}
        await p.hello(**p.hello_fields, **hello)
        yield p


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait until ``condition()`` holds (checked every millisecond); fail after WAIT."""
    try:
        async with asyncio.timeout(WAIT):
            while not condition():  # noqa: ASYNC110 - server state, no event to await
                await asyncio.sleep(MS)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")


async def resumes_agree(gw: Gateway, p: CheckedPeer) -> None:
    """SPEC D3, D6: a resume from every ``last_seq`` replays exactly what ``p`` received,
    which is every seq from 1 to the last, with no gap."""
    last = max(p.events)
    assert sorted(p.events) == list(range(1, last + 1)), "the log delivered has a gap"
    for after in range(last + 1):
        fields = {**p.hello_fields, **resume_fields(p, after)}
        async with checked_peer(gw, p.stored, **fields) as again:
            assert again.welcome["resumed"] is True
            assert again.welcome["last_seq"] == last
            await again.send({"type": "grants.list", "id": "barrier"})
            await again.expect("grants", id="barrier")
            assert again.events == {seq: p.events[seq] for seq in range(after + 1, last + 1)}


def unhandled(records: list[logging.LogRecord]) -> list[str]:
    """Log lines that report an unhandled exception (a traceback, or asyncio's own)."""
    return [
        r.getMessage()
        for r in records
        if r.exc_info is not None or (r.name == "asyncio" and r.levelno >= logging.ERROR)
    ]


class FlakyStore:
    """A :class:`~gateway.store.Store` whose commits fail at random, at the seam: a failed
    commit raises :class:`StoreUnavailable` and writes nothing, as the contract says."""

    def __init__(self, inner: SqliteStore, rng: random.Random, failure_rate: float) -> None:
        self.inner = inner
        self.rng = rng
        self.failure_rate = failure_rate
        self.failures = 0

    def commit(self) -> None:
        if self.rng.random() < self.failure_rate:
            self.failures += 1
            raise StoreUnavailable("test: injected commit failure")
        self.inner.commit()

    def journal(self) -> bool:
        """Never: every flush commits (as on PostgreSQL), so each can fail at random;
        the journal under real faults is in test_store_faults.py and
        test_d1_journaled_flush.py."""
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
