"""The PostgreSQL :class:`~gateway.store.Store` (SPEC N1, D6).

Chosen by ``store.url`` (``TOOLBUS_STORE__URL``) holding a ``postgresql://`` URL; SQLite
stays the default. The contract is the SQLite store's: every write is *staged* in memory
(a :class:`~gateway.store_pg_batch.PgBatch`, which holds the commit's SQL too), encoded
and checked at staging (:class:`~gateway.store.BadValue` to its one caller), and
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
import time
from typing import Any

import psycopg

from gateway.pg_fence import Fence, TakeOver
from gateway.pg_link import PgLink
from gateway.store import CommitsOnly, StoreUnavailable
from gateway.store_pg_batch import (
    JOB_COLS,
    LEDGER_COLS,
    SESSION_COLS,
    PgBatch,
    cid,
    pg_job_row,
    pg_job_values,
    pg_ledger_row,
    text_of,
)
from gateway.store_rows import BadValue, JobRow, LedgerRow, SessionRow, session_row, session_values

logger = logging.getLogger("gateway.store_pg")

_SELECT_SESSIONS = (
    f"SELECT {', '.join('s.' + c.strip() for c in SESSION_COLS.split(','))}, "
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


def _unstorable(key: str) -> bool:
    """Whether ``key`` (an id a client sent) holds U+0000: ``TEXT`` cannot bind it, so no
    row has it. A lookup answers "none" then, like for any made-up id (SPEC A7, S1),
    instead of failing as if the store were down."""
    return "\x00" in key


class PgStore(CommitsOnly):
    """A :class:`~gateway.store.Store` on PostgreSQL (SPEC N1, D6, N7).

    Args:
        url: ``postgresql://`` (libpq; ``?options=-csearch_path=x`` picks the schema).

    Raises:
        StoreError: the database cannot be reached at start, or refused the migration.
        SchemaTooNew: the database schema is newer than this code.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.link = PgLink(url)
        """The connection (SPEC D6: bounded waits, reconnection off the loop)."""
        self.fence: Fence | None = None
        """Set by :class:`gateway.nodes.Node`: this node's fencing tokens (SPEC N2).
        ``None``: no fencing (a store used alone, by tools and the store's tests)."""
        self._reset()

    def _reset(self) -> None:
        self._batch = PgBatch()

    # -- staging ---------------------------------------------------------------------

    def stage_event(self, session_id: str, seq: int, body: bytes) -> None:
        self._batch.events.append((session_id, seq, body))

    def stage_session(self, row: SessionRow) -> None:
        values = _text_checked(session_values(row), "session")
        fence, sid = self.fence, row.session_id
        owner = (None, 0) if fence is None else (fence.node_id, fence.new_session(sid))
        self._batch.sessions[sid] = (*values, *owner)
        if sid in self._batch.seqs:  # the row's counters win; its floor still trims (D2)
            self.stage_seq(sid, row.last_seq, row.acked_seq, row.floor_seq)

    def stage_seq(self, session_id: str, last_seq: int, acked_seq: int, floor_seq: int) -> None:
        self._batch.seqs[session_id] = (last_seq, acked_seq, floor_seq)

    def stage_call(self, session_id: str, call_id: str, state: str, body: bytes | None) -> None:
        node = self.fence.node_id if self.fence is not None else None
        self._batch.put_call((session_id, call_id), (session_id, cid(call_id), state, body, node))

    def stage_handoff(self, session_id: str, call_id: str, note: bytes) -> None:
        self.stage_call(session_id, call_id, "running", note)
        self._batch.handoffs[(session_id, call_id)] = None

    def stage_forget_call(self, session_id: str, call_id: str) -> None:
        self._batch.calls.pop((session_id, call_id), None)
        self._batch.handoffs.pop((session_id, call_id), None)
        self._batch.forget[(session_id, call_id)] = cid(call_id)

    def stage_job(self, row: JobRow) -> None:
        values = _text_checked(pg_job_values(row), f"job {row.job_id}")
        self._batch.jobs[row.job_id] = (*values, self.fence.node_id if self.fence else None)

    def stage_ledger(self, row: LedgerRow) -> None:
        _text_checked((row.tenant, row.user, row.params_hash), "call ledger")
        self._batch.ledger[(row.tenant, row.user, row.call_id)] = row

    @property
    def dirty(self) -> bool:
        """Whether anything is staged and not yet committed."""
        fence = self.fence
        return self._batch.dirty or (fence is not None and bool(fence.consumed_rows))

    # -- commit ----------------------------------------------------------------------

    def commit(self) -> None:
        """Write everything staged in one transaction, sent as one pipeline (SPEC D6).

        Raises:
            StoreUnavailable: nothing was written; everything stays staged.
        """
        if not self.dirty:
            return
        fence = self.fence
        if fence is not None and fence.dead:
            # SPEC N4: another node claimed this one's work; nothing it would write is
            # true any more, and nothing staged may be sent (SPEC D1): fail every commit.
            raise StoreUnavailable(f"store {self.link.where}: this node was declared dead")
        db, batch = self.link.conn(), self._batch
        fenced: dict[str, str | None] = {}
        try:
            with db.pipeline(), db.transaction(), db.cursor() as cur:
                if fence is not None:
                    # SPEC N2: what this node no longer holds is neither written nor sent.
                    fenced = fence.check(cur, batch.touched())
                    fence.forward(cur, fenced, batch.events, time.time())
                batch.write(cur, set(fenced), fence.node_id if fence is not None else None)
        except psycopg.Error as exc:
            raise self.link.failed(exc, "commit") from exc
        deleted = batch.deletes
        self._reset()
        if fence is not None:
            fence.committed(fenced, deleted)

    def take_over(
        self, session_id: str, only_from: str | None = None
    ) -> tuple[SessionRow, TakeOver] | None:
        """Make this node the session's owner (SPEC N2; :meth:`Fence.take_over`) and read
        its row after, ``last_seq`` being the highest stored ``seq``. ``None``: no such
        session (or, with ``only_from``, another node than that one holds it). Call it
        with nothing staged (the outbox flushed).

        Raises:
            StoreUnavailable: it could not be done now; nothing changed.
        """
        fence = self.fence
        assert fence is not None, "take_over needs a node (gateway.nodes.Node)"
        if _unstorable(session_id):
            return None
        db = self.link.conn()
        try:
            took = fence.take_over(db, session_id, only_from)
            rows = db.execute(_SELECT_SESSIONS + " WHERE s.session_id=%s", (session_id,)).fetchall()
        except psycopg.Error as exc:
            raise self.link.failed(exc, "take over") from exc
        if took is None or not rows:
            return None
        return session_row(rows[0]), took

    def inbox(self, limit: int) -> list[tuple[int, str, bytes]]:
        """Inbox rows for the sessions this node owns, oldest first (SPEC N3)."""
        fence = self.fence
        assert fence is not None, "inbox needs a node (gateway.nodes.Node)"
        db = self.link.conn()
        try:
            return fence.inbox(db, limit)
        except psycopg.Error as exc:
            raise self.link.failed(exc, "inbox read") from exc

    # -- reads -----------------------------------------------------------------------

    def load_session(self, session_id: str) -> SessionRow | None:
        if _unstorable(session_id):
            return None
        rows = self.link.read(_SELECT_SESSIONS + " WHERE s.session_id=%s", (session_id,))
        return session_row(rows[0]) if rows else None

    def all_sessions(self) -> list[SessionRow]:
        return [session_row(row) for row in self.link.read(_SELECT_SESSIONS)]

    def delete_session(self, session_id: str) -> None:
        self._batch.deletes.append(session_id)

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
            (session_id, cid(call_id)),
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
        return [text_of(r[0]) for r in rows]

    def running_calls(self) -> list[tuple[str, str, bytes | None]]:
        rows = self.link.read(
            "SELECT session_id, call_id, body FROM calls WHERE state<>'done' ORDER BY id"
        )
        return [
            (sid, text_of(call_id), None if b is None else bytes(b)) for sid, call_id, b in rows
        ]

    def job(self, job_id: str) -> JobRow | None:
        if _unstorable(job_id):
            return None
        rows = self.link.read(f"SELECT {JOB_COLS} FROM jobs WHERE job_id=%s", (job_id,))
        return pg_job_row(rows[0]) if rows else None

    def jobs(self, user: str, tenant: str | None, state: str | None, limit: int) -> list[JobRow]:
        sql = (
            f'SELECT {JOB_COLS} FROM jobs WHERE "user"=%s AND tenant IS NOT DISTINCT FROM %s::text'
        )
        args: list[Any] = [user, tenant]
        if state is not None:
            sql += " AND state=%s"
            args.append(state)
        sql += " ORDER BY created_at DESC, id DESC LIMIT %s"
        args.append(limit)
        return [pg_job_row(row) for row in self.link.read(sql, tuple(args))]

    def unfinished_jobs(self) -> list[JobRow]:
        rows = self.link.read(f"SELECT {JOB_COLS} FROM jobs WHERE state IN ('queued', 'running')")
        return [pg_job_row(row) for row in rows]

    def purge(self, now: float, job_retention: float) -> None:
        rows = self.link.read(
            "SELECT session_id FROM sessions WHERE expires_at IS NOT NULL AND expires_at<%s",
            (now,),
        )
        # Expired wherever they were held: the purge is not fenced (SPEC D2, N2).
        self._batch.purged.extend(session_id for (session_id,) in rows)
        self._batch.purged_at, self._batch.purge_before = now, now - job_retention
        with contextlib.suppress(StoreUnavailable):
            self.commit()

    def ledger(self, tenant: str, user: str, call_id: str) -> LedgerRow | None:
        staged = self._batch.ledger.get((tenant, user, call_id))
        if staged is not None:
            return staged
        rows = self.link.read(
            f'SELECT {LEDGER_COLS} FROM call_ledger WHERE tenant=%s AND "user"=%s AND call_id=%s',
            (tenant, user, cid(call_id)),
        )
        return pg_ledger_row(rows[0]) if rows else None

    def running_ledger(self) -> list[LedgerRow]:
        rows = self.link.read(f"SELECT {LEDGER_COLS} FROM call_ledger WHERE state='running'")
        return [pg_ledger_row(row) for row in rows]

    def purge_ledger(self, before: float) -> None:
        self.link.execute("DELETE FROM call_ledger WHERE created_at<%s", (before,))

    def close(self) -> None:
        try:
            self.commit()
        except StoreUnavailable as exc:
            logger.error("%s; %d staged events dropped at close", exc, len(self._batch.events))
        self.link.close()


class PgNodeWork:
    """What a dead node left in the shared store, read by the node that claimed it
    (SPEC N4; :class:`gateway.node_claim.NodeClaim`).

    Args:
        link: the store's connection (:attr:`PgStore.link`).
    """

    def __init__(self, link: PgLink) -> None:
        self._link = link

    def sessions_held_by(self, node: str) -> list[str]:
        """Ids of the sessions ``node`` owns."""
        rows = self._link.read("SELECT session_id FROM sessions WHERE owner_node=%s", (node,))
        return [sid for (sid,) in rows]

    def running_calls_of(self, node: str) -> list[tuple[str, str, bytes | None]]:
        """:meth:`PgStore.running_calls` that ``node`` ran."""
        rows = self._link.read(
            "SELECT session_id, call_id, body FROM calls WHERE state<>'done' AND node_id=%s "
            "ORDER BY id",
            (node,),
        )
        return [
            (sid, text_of(call_id), None if b is None else bytes(b)) for sid, call_id, b in rows
        ]

    def running_ledger_of(self, node: str) -> list[LedgerRow]:
        """:meth:`PgStore.running_ledger` rows that ``node`` ran."""
        rows = self._link.read(
            f"SELECT {LEDGER_COLS} FROM call_ledger WHERE state='running' AND node_id=%s",
            (node,),
        )
        return [pg_ledger_row(row) for row in rows]

    def unfinished_jobs_of(self, node: str) -> list[JobRow]:
        """:meth:`PgStore.unfinished_jobs` that ``node`` ran."""
        rows = self._link.read(
            f"SELECT {JOB_COLS} FROM jobs WHERE state IN ('queued', 'running') AND node_id=%s",
            (node,),
        )
        return [pg_job_row(row) for row in rows]
