"""The writes a :class:`~gateway.store.SqliteStore` stages until its next commit (SPEC D1,
D2, D6).

Every value in a :class:`SqliteBatch` was encoded and checked when it was staged, so
:meth:`SqliteBatch.write` only binds bytes and numbers known to bind. It runs inside the
store's transaction; if that fails, the store rolls back and keeps the batch for the
next attempt, whole and in order. Deletions (ended sessions, the purge) run last.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

from gateway.store_rows import LedgerRow, anything_staged, ledger_values


@dataclass(slots=True)
class SqliteBatch:
    """Staged writes, by table; written together by :meth:`write`."""

    events: list[tuple[str, int, bytes]] = field(default_factory=list)
    """``(session_id, seq, body)`` in the order they were emitted."""
    sessions: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    """Session rows as the values to write, encoded and checked (SPEC D6)."""
    seqs: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """``session_id -> (last_seq, acked_seq, floor_seq)``."""
    calls: dict[tuple[str, str], tuple[str, str, str, bytes | None]] = field(default_factory=dict)
    """Keyed: a call that starts and ends within one tick is written once."""
    forget: dict[tuple[str, str], None] = field(default_factory=dict)
    """Call rows to delete; a row of the same key staged after its forget cancels it."""
    jobs: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    ledger: dict[tuple[str, str, str], LedgerRow] = field(default_factory=dict)
    ledger_before: float | None = None
    journal_mark: int | None = None
    """The number of the last journal batch entry whose rows this commit writes
    (:func:`gateway.store_journal.replay` skips the entries the file has)."""
    deletes: list[str] = field(default_factory=list)
    """Sessions ended here: deleted with their events and calls, last in the commit."""
    purged: list[str] = field(default_factory=list)
    """Sessions the purge read as expired (SPEC D2): each is deleted only if its row is
    still expired at :attr:`purged_at` in the commit that deletes it."""
    purged_at: float | None = None
    """The purge's ``now`` (Unix s)."""
    purge_before: float | None = None

    def put_call(self, key: tuple[str, str], row: tuple[str, str, str, bytes | None]) -> None:
        """Stage the call row ``row`` of ``key`` (session id, call id). A forget of the
        key staged before is dropped: the row replaces the old one, and the forget's
        delete, run after the inserts, would remove it (SPEC I12)."""
        self.forget.pop(key, None)
        self.calls[key] = row

    @property
    def dirty(self) -> bool:
        """Whether anything is staged."""
        return anything_staged(self)

    def write(self, db: sqlite3.Connection) -> tuple[int, list[str]]:
        """Execute every staged write on ``db``, inside the caller's transaction.

        Returns:
            The call-ledger rows the ledger purge (``ledger_before``) deleted (0 without
            one), and the ids of the :attr:`purged` sessions this write deleted.

        Raises:
            sqlite3.Error: a statement failed; the caller rolls back (SPEC D6).
        """
        deleted, purged = 0, []
        if self.sessions:
            db.executemany(
                "INSERT OR REPLACE INTO sessions VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                self.sessions.values(),
            )
        if self.events:
            db.executemany(
                "INSERT OR REPLACE INTO events (session_id, seq, body) VALUES (?,?,?)",
                self.events,
            )
        if self.calls:
            db.executemany(
                "INSERT OR REPLACE INTO calls (session_id, call_id, state, body) VALUES (?,?,?,?)",
                self.calls.values(),
            )
        if self.forget:
            db.executemany("DELETE FROM calls WHERE session_id=? AND call_id=?", list(self.forget))
        if self.seqs:
            self._write_seqs(db)
        if self.jobs:
            db.executemany(
                "INSERT OR REPLACE INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                self.jobs.values(),
            )
        if self.ledger:
            db.executemany(
                "INSERT OR REPLACE INTO call_ledger VALUES (?,?,?,?,?,?,?,?)",
                [ledger_values(row) for row in self.ledger.values()],
            )
        if self.ledger_before is not None:
            purge = "DELETE FROM call_ledger WHERE created_at<?"
            deleted = db.execute(purge, (self.ledger_before,)).rowcount
        if self.journal_mark is not None:
            db.execute("INSERT OR REPLACE INTO journal_mark VALUES (1, ?)", (self.journal_mark,))
        if self.deletes or self.purged or self.purge_before is not None:
            purged = self._write_deletes(db)
        return deleted, purged

    def _write_deletes(self, db: sqlite3.Connection) -> list[str]:
        """Sessions ended, sessions purged that are still expired, jobs past retention,
        last in the batch (SPEC D2); returns the purged sessions deleted."""
        db.executemany("DELETE FROM sessions WHERE session_id=?", [(s,) for s in self.deletes])
        # SPEC D2, D3: the purge read these as expired; one resumed since (its row's
        # expires_at cleared or moved on, staged before this commit) keeps its row and log.
        purged = [
            sid
            for sid in dict.fromkeys(self.purged)
            if db.execute(
                "DELETE FROM sessions WHERE session_id=? AND expires_at<? RETURNING session_id",
                (sid, self.purged_at),
            ).fetchall()
        ]
        rows = [(sid,) for sid in dict.fromkeys(self.deletes + purged)]
        for table in ("events", "calls"):
            db.executemany(f"DELETE FROM {table} WHERE session_id=?", rows)
        if self.purge_before is not None:
            db.execute(
                "DELETE FROM jobs WHERE finished_at IS NOT NULL AND finished_at<?",
                (self.purge_before,),
            )
        return purged

    def _write_seqs(self, db: sqlite3.Connection) -> None:
        rows = [(last, acked, floor, sid) for sid, (last, acked, floor) in self.seqs.items()]
        db.executemany(
            "UPDATE sessions SET last_seq=?, acked_seq=?, floor_seq=? WHERE session_id=?", rows
        )
        db.executemany(
            "DELETE FROM events WHERE session_id=? AND seq<=?",
            [(sid, floor) for sid, (_, _, floor) in self.seqs.items()],
        )
