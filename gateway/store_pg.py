"""The PostgreSQL :class:`~gateway.store.Store` (SPEC N1, D6).

Chosen by ``store.url`` (``TOOLBUS_STORE__URL``) holding a ``postgresql://`` URL; SQLite
stays the default. The contract is the SQLite store's: every write is *staged* in memory,
encoded and checked at staging (:class:`~gateway.store.BadValue` to its one caller), and
:meth:`PgStore.commit` writes everything staged in one transaction. A commit that fails
rolls back and raises :class:`~gateway.store.StoreUnavailable` with everything still
staged, in order; the outbox holds the frames and retries (SPEC D6, N7).

Driver: psycopg 3, synchronous, one connection, each commit sent as one pipeline (one
round trip for the whole batch); ``docs/deploy.md`` gives the measurement behind the
choice. Like the SQLite store, it is called on the event-loop thread, so every wait is
bounded (:class:`~gateway.pg_link.PgLink`: statement and socket timeouts, reconnection
on a thread of its own; durability: ``synchronous_commit``, see there).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import psycopg

from gateway.pg_link import PgLink
from gateway.store import (
    BadValue,
    JobRow,
    LedgerRow,
    SessionRow,
    StoreUnavailable,
    _job_row,
    _job_values,
    _session_row,
    _session_values,
)

logger = logging.getLogger("gateway.store_pg")

_SESSION_COLS = (
    'session_id, token_hash, "user", tenant, profile, context, options, grants, last_seq, '
    "acked_seq, floor_seq, created_at, expires_at, catalog_version, credential_ref"
)
_JOB_COLS = (
    'job_id, tool, state, session_id, "user", tenant, profile, call_id, params, context, '
    "created_at, started_at, finished_at, summary, artifacts, result, error"
)
_LEDGER_COLS = 'tenant, "user", call_id, tool, params_hash, state, outcome, created_at'


def _upsert(table: str, cols: str, key: str) -> str:
    names = [c.strip() for c in cols.split(",")]
    marks = ",".join(["%s"] * len(names))
    keys = {k.strip() for k in key.split(",")}
    sets = ",".join(f"{n}=EXCLUDED.{n}" for n in names if n not in keys)
    return f"INSERT INTO {table} ({cols}) VALUES ({marks}) ON CONFLICT ({key}) DO UPDATE SET {sets}"


_INSERT_SESSION = _upsert("sessions", _SESSION_COLS, "session_id")
_INSERT_JOB = _upsert("jobs", _JOB_COLS, "job_id")
_INSERT_LEDGER = _upsert("call_ledger", _LEDGER_COLS, 'tenant, "user", call_id')
_INSERT_EVENT = (
    "INSERT INTO events (session_id, seq, body) VALUES (%s,%s,%s) "
    "ON CONFLICT (session_id, seq) DO UPDATE SET body=EXCLUDED.body"
)
# id=DEFAULT: a rewritten call moves to the end, as SQLite's INSERT OR REPLACE does, so
# done_call_ids keeps the order in which calls ended (SPEC I12).
_INSERT_CALL = (
    "INSERT INTO calls (session_id, call_id, state, body) VALUES (%s,%s,%s,%s) "
    "ON CONFLICT (session_id, call_id) DO UPDATE SET state=EXCLUDED.state, "
    "body=EXCLUDED.body, id=DEFAULT"
)
_SELECT_SESSIONS = (
    f"SELECT {', '.join('s.' + c.strip() for c in _SESSION_COLS.split(','))}, "
    "(SELECT max(seq) FROM events e WHERE e.session_id = s.session_id) FROM sessions s"
)


def _text_checked(values: tuple[Any, ...], what: str) -> tuple[Any, ...]:
    """``values`` if PostgreSQL can bind every one; else :class:`BadValue` (SPEC D6):
    ``TEXT`` refuses U+0000 and text that is not valid Unicode."""
    for value in values:
        if isinstance(value, str):
            if "\x00" in value:
                raise BadValue(f"{what}: text holds U+0000, which the store cannot keep")
            try:
                value.encode()
            except UnicodeEncodeError as exc:
                raise BadValue(f"{what}: text is not valid Unicode ({exc.reason})") from exc
    return values


def _cid(call_id: str) -> bytes:
    # surrogatepass: any str the codec produced round-trips, whatever it holds.
    return call_id.encode("utf-8", "surrogatepass")


def _ledger_row(row: tuple[Any, ...]) -> LedgerRow:
    tenant, user, call_id, tool, params_hash, state, outcome, created_at = row
    return LedgerRow(
        tenant,
        user,
        bytes(call_id).decode("utf-8", "surrogatepass"),
        tool,
        params_hash,
        state,
        None if outcome is None else bytes(outcome),
        created_at,
    )


class PgStore:
    """A :class:`~gateway.store.Store` on PostgreSQL (SPEC N1, D6, N7).

    Args:
        url: a ``postgresql://`` URL (libpq syntax; ``?options=-csearch_path=x`` picks
            the schema the tables live in).

    Raises:
        StoreError: the database cannot be reached at start, or refused the migration.
        SchemaTooNew: the database schema is newer than this code.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.link = PgLink(url)
        """The connection (SPEC D6: bounded waits, reconnection off the loop)."""
        self._reset()

    def _reset(self) -> None:
        self._events: list[tuple[str, int, bytes]] = []
        self._sessions: dict[str, tuple[Any, ...]] = {}
        self._seqs: dict[str, tuple[int, int, int]] = {}
        self._calls: dict[tuple[str, str], tuple[str, bytes, str, bytes | None]] = {}
        self._forget: list[tuple[str, bytes]] = []
        self._jobs: dict[str, tuple[Any, ...]] = {}
        self._ledger: dict[tuple[str, str, str], LedgerRow] = {}
        self._deletes: list[str] = []
        self._purge_before: float | None = None

    # -- staging ---------------------------------------------------------------------

    def stage_event(self, session_id: str, seq: int, body: bytes) -> None:
        self._events.append((session_id, seq, body))

    def stage_session(self, row: SessionRow) -> None:
        self._sessions[row.session_id] = _text_checked(_session_values(row), "session")
        self._seqs.pop(row.session_id, None)

    def stage_seq(self, session_id: str, last_seq: int, acked_seq: int, floor_seq: int) -> None:
        self._seqs[session_id] = (last_seq, acked_seq, floor_seq)

    def stage_call(self, session_id: str, call_id: str, state: str, body: bytes | None) -> None:
        self._calls[(session_id, call_id)] = (session_id, _cid(call_id), state, body)

    def stage_forget_call(self, session_id: str, call_id: str) -> None:
        self._calls.pop((session_id, call_id), None)
        self._forget.append((session_id, _cid(call_id)))

    def stage_job(self, row: JobRow) -> None:
        self._jobs[row.job_id] = _text_checked(_job_values(row), f"job {row.job_id}")

    def stage_ledger(self, row: LedgerRow) -> None:
        _text_checked((row.tenant, row.user, row.tool, row.params_hash), "call ledger")
        self._ledger[(row.tenant, row.user, row.call_id)] = row

    @property
    def dirty(self) -> bool:
        """Whether anything is staged and not yet committed."""
        return bool(
            self._events
            or self._sessions
            or self._seqs
            or self._calls
            or self._jobs
            or self._forget
            or self._ledger
            or self._deletes
            or self._purge_before is not None
        )

    # -- commit ----------------------------------------------------------------------

    def commit(self) -> None:
        """Write everything staged in one transaction, sent as one pipeline (SPEC D6).

        Raises:
            StoreUnavailable: nothing was written; everything stays staged.
        """
        if not self.dirty:
            return
        db = self.link.conn()
        try:
            with db.pipeline(), db.transaction(), db.cursor() as cur:
                self._write(cur)
        except psycopg.Error as exc:
            raise self.link.failed(exc, "commit") from exc
        self._reset()

    def _write(self, cur: psycopg.Cursor[tuple[Any, ...]]) -> None:
        """The statements of one commit, in the SQLite store's order."""
        if self._sessions:
            cur.executemany(_INSERT_SESSION, list(self._sessions.values()))
        if self._events:
            cur.executemany(_INSERT_EVENT, self._events)
        if self._calls:
            cur.executemany(_INSERT_CALL, list(self._calls.values()))
        if self._forget:
            cur.executemany("DELETE FROM calls WHERE session_id=%s AND call_id=%s", self._forget)
        if self._seqs:
            seqs = [(la, ac, fl, sid) for sid, (la, ac, fl) in self._seqs.items()]
            cur.executemany(
                "UPDATE sessions SET last_seq=%s, acked_seq=%s, floor_seq=%s WHERE session_id=%s",
                seqs,
            )
            cur.executemany(
                "DELETE FROM events WHERE session_id=%s AND seq<=%s",
                [(sid, fl) for sid, (_, _, fl) in self._seqs.items()],
            )
        if self._jobs:
            cur.executemany(_INSERT_JOB, list(self._jobs.values()))
        if self._ledger:
            cur.executemany(_INSERT_LEDGER, [_ledger_values(r) for r in self._ledger.values()])
        if self._deletes:
            rows = [(sid,) for sid in self._deletes]
            for table in ("sessions", "events", "calls"):
                cur.executemany(f"DELETE FROM {table} WHERE session_id=%s", rows)
        if self._purge_before is not None:
            cur.execute(
                "DELETE FROM jobs WHERE finished_at IS NOT NULL AND finished_at<%s",
                (self._purge_before,),
            )

    # -- reads -----------------------------------------------------------------------

    def load_session(self, session_id: str) -> SessionRow | None:
        rows = self.link.read(_SELECT_SESSIONS + " WHERE s.session_id=%s", (session_id,))
        return _session_row(rows[0]) if rows else None

    def all_sessions(self) -> list[SessionRow]:
        return [_session_row(row) for row in self.link.read(_SELECT_SESSIONS)]

    def delete_session(self, session_id: str) -> None:
        self._deletes.append(session_id)

    def events_after(
        self, session_id: str, seq: int, limit: int | None = None
    ) -> list[tuple[int, bytes]]:
        rows = self.link.read(
            "SELECT seq, body FROM events WHERE session_id=%s AND seq>%s ORDER BY seq LIMIT %s",
            (session_id, seq, limit),
        )
        return [(int(s), bytes(b)) for s, b in rows]

    def events_complete(self, session_id: str, after: int, upto: int) -> bool:
        if upto <= after:
            return True
        rows = self.link.read(
            "SELECT count(*) FROM events WHERE session_id=%s AND seq>%s AND seq<=%s",
            (session_id, after, upto),
        )
        return bool(rows[0][0] == upto - after)

    def call(self, session_id: str, call_id: str) -> tuple[str, bytes | None] | None:
        rows = self.link.read(
            "SELECT state, body FROM calls WHERE session_id=%s AND call_id=%s",
            (session_id, _cid(call_id)),
        )
        if not rows:
            return None
        state, body = rows[0]
        return (state, None if body is None else bytes(body))

    def done_call_ids(self, session_id: str) -> list[str]:
        rows = self.link.read(
            "SELECT call_id FROM calls WHERE session_id=%s AND state='done' ORDER BY id",
            (session_id,),
        )
        return [bytes(r[0]).decode("utf-8", "surrogatepass") for r in rows]

    def running_calls(self) -> list[tuple[str, str, bytes | None]]:
        rows = self.link.read(
            "SELECT session_id, call_id, body FROM calls WHERE state<>'done' ORDER BY id"
        )
        return [
            (sid, bytes(cid).decode("utf-8", "surrogatepass"), None if b is None else bytes(b))
            for sid, cid, b in rows
        ]

    def job(self, job_id: str) -> JobRow | None:
        rows = self.link.read(f"SELECT {_JOB_COLS} FROM jobs WHERE job_id=%s", (job_id,))
        return _job_row(rows[0]) if rows else None

    def jobs(self, user: str, tenant: str | None, state: str | None, limit: int) -> list[JobRow]:
        sql = (
            f'SELECT {_JOB_COLS} FROM jobs WHERE "user"=%s AND tenant IS NOT DISTINCT FROM %s::text'
        )
        args: list[Any] = [user, tenant]
        if state is not None:
            sql += " AND state=%s"
            args.append(state)
        sql += " ORDER BY created_at DESC, id DESC LIMIT %s"
        args.append(limit)
        return [_job_row(row) for row in self.link.read(sql, tuple(args))]

    def unfinished_jobs(self) -> list[JobRow]:
        rows = self.link.read(f"SELECT {_JOB_COLS} FROM jobs WHERE state IN ('queued', 'running')")
        return [_job_row(row) for row in rows]

    def purge(self, now: float, job_retention: float) -> None:
        rows = self.link.read(
            "SELECT session_id FROM sessions WHERE expires_at IS NOT NULL AND expires_at<%s",
            (now,),
        )
        for (session_id,) in rows:
            self.delete_session(session_id)
        self._purge_before = now - job_retention
        with contextlib.suppress(StoreUnavailable):
            self.commit()

    def ledger(self, tenant: str, user: str, call_id: str) -> LedgerRow | None:
        staged = self._ledger.get((tenant, user, call_id))
        if staged is not None:
            return staged
        rows = self.link.read(
            f'SELECT {_LEDGER_COLS} FROM call_ledger WHERE tenant=%s AND "user"=%s AND call_id=%s',
            (tenant, user, _cid(call_id)),
        )
        return _ledger_row(rows[0]) if rows else None

    def running_ledger(self) -> list[LedgerRow]:
        rows = self.link.read(f"SELECT {_LEDGER_COLS} FROM call_ledger WHERE state='running'")
        return [_ledger_row(row) for row in rows]

    def purge_ledger(self, before: float) -> None:
        self.link.execute("DELETE FROM call_ledger WHERE created_at<%s", (before,))

    def close(self) -> None:
        try:
            self.commit()
        except StoreUnavailable as exc:
            logger.error("%s; %d staged events dropped at close", exc, len(self._events))
        self.link.close()


def _ledger_values(row: LedgerRow) -> tuple[Any, ...]:
    return (
        row.tenant,
        row.user,
        _cid(row.call_id),
        row.tool,
        row.params_hash,
        row.state,
        row.outcome,
        row.created_at,
    )
