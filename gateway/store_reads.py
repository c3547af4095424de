"""Reads of a :class:`~gateway.store.SqliteStore`'s file (SPEC D3, I12, I15, J3).

Each read first has the store pay the commit its journaled flushes owe
(:meth:`SqliteStore.journal <gateway.store.SqliteStore.journal>`): a read of the file
must see what was sent (SPEC D1, D3). That commit can fail
(:class:`~gateway.store_check.StoreUnavailable`), and the read with it.
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from typing import Any

from gateway.store_check import StoreUnavailable
from gateway.store_rows import JobRow, LedgerRow, SessionRow, job_row, session_row

# A session row's last_seq is written with the row (save, ack); events emitted since are
# in the log, so the true last seq is the larger of the two. This keeps emit() to a
# single staged insert.
_SELECT_SESSIONS = (
    "SELECT s.*, (SELECT MAX(seq) FROM events e WHERE e.session_id = s.session_id) FROM sessions s"
)


class SqliteReads(ABC):
    """The reads of the :class:`~gateway.store.Store` interface on a SQLite file."""

    path: str

    @abstractmethod
    def _settled(self) -> sqlite3.Connection:
        """The connection, once the file has every journaled write."""

    def load_session(self, session_id: str) -> SessionRow | None:
        cur = self._settled().execute(_SELECT_SESSIONS + " WHERE s.session_id=?", (session_id,))
        row = cur.fetchone()
        return None if row is None else session_row(row)

    def all_sessions(self) -> list[SessionRow]:
        return [session_row(row) for row in self._settled().execute(_SELECT_SESSIONS)]

    def events_after(
        self, session_id: str, seq: int, limit: int | None = None
    ) -> list[tuple[int, bytes]]:
        try:
            cur = self._settled().execute(
                "SELECT seq, body FROM events WHERE session_id=? AND seq>? ORDER BY seq LIMIT ?",
                (session_id, seq, -1 if limit is None else limit),
            )
            return list(cur)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{self.path}: reading events failed: {exc}") from exc

    def events_complete(self, session_id: str, after: int, upto: int) -> bool:
        # seq is unique per session (index events_by_session): the range is whole exactly
        # when it holds upto - after rows. One index range count, no bodies read.
        if upto <= after:
            return True
        try:
            (count,) = (
                self._settled()
                .execute(
                    "SELECT COUNT(*) FROM events WHERE session_id=? AND seq>? AND seq<=?",
                    (session_id, after, upto),
                )
                .fetchone()
            )
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{self.path}: reading events failed: {exc}") from exc
        return bool(count == upto - after)

    def call(self, session_id: str, call_id: str) -> tuple[str, bytes | None] | None:
        cur = self._settled().execute(
            "SELECT state, body FROM calls WHERE session_id=? AND call_id=?", (session_id, call_id)
        )
        row = cur.fetchone()
        return None if row is None else (row[0], row[1])

    def done_call_ids(self, session_id: str) -> list[str]:
        cur = self._settled().execute(
            "SELECT call_id FROM calls WHERE session_id=? AND state='done' ORDER BY id",
            (session_id,),
        )
        return [row[0] for row in cur]

    def running_calls(self) -> list[tuple[str, str, bytes | None]]:
        cur = self._settled().execute(
            "SELECT session_id, call_id, body FROM calls WHERE state!='done'"
        )
        return [(row[0], row[1], row[2]) for row in cur]

    def job(self, job_id: str) -> JobRow | None:
        row = self._settled().execute("SELECT * FROM jobs WHERE job_id=?", (job_id,)).fetchone()
        return None if row is None else job_row(row)

    def jobs(self, user: str, tenant: str | None, state: str | None, limit: int) -> list[JobRow]:
        sql = "SELECT * FROM jobs WHERE user=? AND tenant IS ?"
        args: list[Any] = [user, tenant]
        if state is not None:
            sql += " AND state=?"
            args.append(state)
        sql += " ORDER BY created_at DESC, rowid DESC LIMIT ?"
        args.append(limit)
        return [job_row(row) for row in self._settled().execute(sql, args)]

    def unfinished_jobs(self) -> list[JobRow]:
        cur = self._settled().execute("SELECT * FROM jobs WHERE state IN ('queued', 'running')")
        return [job_row(row) for row in cur]

    def running_ledger(self) -> list[LedgerRow]:
        cur = self._settled().execute("SELECT * FROM call_ledger WHERE state='running'")
        return [LedgerRow(*row) for row in cur]
