"""The writes a :class:`~gateway.store_pg.PgStore` stages until its next commit, and the
SQL that writes them (SPEC D1, D6, N2, N4).

The PostgreSQL twin of :class:`~gateway.store_batch.SqliteBatch`: every value in a
:class:`PgBatch` was encoded and checked when it was staged, so :meth:`PgBatch.write`
only binds values known to bind. It runs inside the store's transaction (one pipeline);
if that fails, the store keeps the batch for the next attempt, whole and in order.
Deletions (ended sessions, the purge) run last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from gateway.store_rows import JobRow, LedgerRow, anything_staged, job_row, job_values

SESSION_COLS = (
    'session_id, token_hash, "user", tenant, profile, context, options, grants, last_seq, '
    "acked_seq, floor_seq, created_at, expires_at, catalog_version, credential_ref"
)
JOB_COLS = (
    'job_id, tool, state, session_id, "user", tenant, profile, call_id, params, context, '
    "created_at, started_at, finished_at, summary, artifacts, result, error"
)
LEDGER_COLS = 'tenant, "user", call_id, tool, params_hash, state, outcome, created_at'


def _upsert(table: str, cols: str, key: str) -> str:
    names = [c.strip() for c in cols.split(",")]
    marks = ",".join(["%s"] * len(names))
    keys = {k.strip() for k in key.split(",")}
    sets = ",".join(f"{n}=EXCLUDED.{n}" for n in names if n not in keys)
    return f"INSERT INTO {table} ({cols}) VALUES ({marks}) ON CONFLICT ({key}) DO UPDATE SET {sets}"


# SPEC N2: a new row gets its owner and token; an update never changes them (a take-over
# does, in Fence.take_over).
_INSERT_SESSION = _upsert("sessions", SESSION_COLS, "session_id").replace(
    ") VALUES (", ", owner_node, owner_epoch) VALUES (%s,%s,", 1
)
# SPEC N4: each job and ledger row names the node that runs it, and only that node may
# change it, unless that node is gone (its ``nodes`` row deleted by the node that claimed
# its work): a node declared dead that still runs cannot overwrite what the claimer wrote.
_NODE_GUARD = (
    " WHERE {t}.node_id IS NULL OR {t}.node_id = EXCLUDED.node_id"
    " OR NOT EXISTS (SELECT 1 FROM nodes n WHERE n.node_id = {t}.node_id)"
)
_INSERT_JOB = _upsert("jobs", JOB_COLS + ", node_id", "job_id") + _NODE_GUARD.format(t="jobs")
_INSERT_LEDGER = _upsert(
    "call_ledger", LEDGER_COLS + ", node_id", 'tenant, "user", call_id'
) + _NODE_GUARD.format(t="call_ledger")
_INSERT_EVENT = (
    "INSERT INTO events (session_id, seq, body) VALUES (%s,%s,%s) "
    "ON CONFLICT (session_id, seq) DO UPDATE SET body=EXCLUDED.body"
)
# id=DEFAULT: a rewritten call moves to the end, as SQLite's INSERT OR REPLACE does, so
# done_call_ids keeps the order in which calls ended (SPEC I12).
_INSERT_CALL = (
    "INSERT INTO calls (session_id, call_id, state, body, node_id) VALUES (%s,%s,%s,%s,%s) "
    "ON CONFLICT (session_id, call_id) DO UPDATE SET state=EXCLUDED.state, "
    "body=EXCLUDED.body, node_id=EXCLUDED.node_id, id=DEFAULT"
)

_HANDOFF_CALL = (
    "UPDATE calls SET body=%s WHERE session_id=%s AND call_id=%s AND node_id=%s AND state='running'"
)


def utf8(text: str) -> bytes:
    """Text a client or a handler chose (a call id, a tool name as invoked, a job's
    summary) as the UTF-8 ``BYTEA`` it is stored as: ``TEXT`` cannot hold U+0000 (SPEC
    D6; :data:`~gateway.pg_schema.MIGRATIONS`)."""
    # surrogatepass: any str the codec produced round-trips, whatever it holds.
    return text.encode("utf-8", "surrogatepass")


cid = utf8
"""A call id as the ``BYTEA`` it is stored as (:func:`utf8`)."""


def text_of(stored: bytes) -> str:
    """A ``BYTEA`` column written by :func:`utf8` as the text it was."""
    return bytes(stored).decode("utf-8", "surrogatepass")


def _opt_utf8(text: str | None) -> bytes | None:
    return None if text is None else utf8(text)


_JOB_NAMES = [c.strip() for c in JOB_COLS.split(",")]
_JOB_UTF8 = (_JOB_NAMES.index("call_id"), _JOB_NAMES.index("summary"))
"""Positions of the ``jobs`` columns that are UTF-8 ``BYTEA`` (schema version 4)."""


def pg_job_values(row: JobRow) -> tuple[Any, ...]:
    """:func:`~gateway.store_rows.job_values` for PostgreSQL: ``call_id`` and ``summary``
    as UTF-8 ``BYTEA`` (SPEC D6: a client's call id, a handler's summary or failure text
    may hold U+0000)."""
    values = list(job_values(row))
    for i in _JOB_UTF8:
        values[i] = _opt_utf8(values[i])
    return tuple(values)


def pg_job_row(fetched: Sequence[Any]) -> JobRow:
    """A ``jobs`` row read as :data:`JOB_COLS` as a :class:`JobRow`: the shape
    :func:`~gateway.store_rows.job_row` gives, its ``BYTEA`` text decoded."""
    values = list(fetched)
    for i in _JOB_UTF8:
        if values[i] is not None:
            values[i] = text_of(values[i])
    return job_row(values)


def pg_ledger_row(fetched: Sequence[Any]) -> LedgerRow:
    """A ``call_ledger`` row read as :data:`LEDGER_COLS` as a :class:`LedgerRow`; its
    call id and tool are UTF-8 ``BYTEA``."""
    tenant, user, call_id, tool, params_hash, state, outcome, created_at = fetched
    return LedgerRow(
        tenant,
        user,
        text_of(call_id),
        text_of(tool),
        params_hash,
        state,
        None if outcome is None else bytes(outcome),
        created_at,
    )


def _ledger_values(row: LedgerRow) -> tuple[Any, ...]:
    return (
        row.tenant,
        row.user,
        utf8(row.call_id),
        utf8(row.tool),
        row.params_hash,
        row.state,
        row.outcome,
        row.created_at,
    )


@dataclass(slots=True)
class PgBatch:
    """Staged writes, by table; written together by :meth:`write`."""

    events: list[tuple[str, int, bytes]] = field(default_factory=list)
    """``(session_id, seq, body)`` in the order they were emitted."""
    sessions: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    """Session rows as the values to write (owner node and token last, SPEC N2)."""
    seqs: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """``session_id -> (last_seq, acked_seq, floor_seq)``."""
    calls: dict[tuple[str, str], tuple[str, bytes, str, bytes | None, str | None]] = field(
        default_factory=dict
    )
    """Keyed: a call that starts and ends within one tick is written once."""
    handoffs: dict[tuple[str, str], None] = field(default_factory=dict)
    """Keys of :attr:`calls` whose row holds a drain's hand-off note
    (:meth:`PgStore.stage_handoff <gateway.store_pg.PgStore.stage_handoff>`, SPEC N6):
    written over the call's own row even when its session is fenced."""
    forget: dict[tuple[str, str], bytes] = field(default_factory=dict)
    """Call rows to delete, ``(session_id, call_id) -> stored call id``; a row of the same
    key staged after its forget cancels it."""
    jobs: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    ledger: dict[tuple[str, str, str], LedgerRow] = field(default_factory=dict)
    deletes: list[str] = field(default_factory=list)
    """Sessions ended here (fenced like every write of a session, SPEC N2)."""
    purged: list[str] = field(default_factory=list)
    """Sessions expired wherever they were held: the purge is not fenced (SPEC D2, N2)."""
    purged_at: float | None = None
    """The purge's ``now`` (Unix s): a purged session is deleted only if its row is still
    expired then, in the commit that deletes it."""
    purge_before: float | None = None

    def put_call(
        self, key: tuple[str, str], row: tuple[str, bytes, str, bytes | None, str | None]
    ) -> None:
        """Stage the call row ``row`` of ``key`` (session id, call id); a forget of the
        key staged before is dropped (as :meth:`SqliteBatch.put_call
        <gateway.store_batch.SqliteBatch.put_call>`, SPEC I12)."""
        self.forget.pop(key, None)
        self.handoffs.pop(key, None)
        self.calls[key] = row

    @property
    def dirty(self) -> bool:
        """Whether anything is staged."""
        return anything_staged(self)

    def touched(self) -> set[str]:
        """Sessions whose rows, events or calls this batch writes (SPEC N2)."""
        touched = {sid for sid, _, _ in self.events} | set(self.sessions) | set(self.seqs)
        touched.update(sid for sid, _ in self.calls)
        touched.update(sid for sid, _ in self.forget)
        touched.update(self.deletes)
        return touched

    def write(
        self, cur: psycopg.Cursor[tuple[Any, ...]], fenced: set[str], node: str | None
    ) -> None:
        """The statements of one commit, in the SQLite store's order, without those of
        the ``fenced`` sessions (SPEC N2); ledger rows name ``node`` (SPEC N4).

        Raises:
            psycopg.Error: a statement failed; the caller rolls back (SPEC D6).
        """
        sessions = [v for sid, v in self.sessions.items() if sid not in fenced]
        if sessions:
            cur.executemany(_INSERT_SESSION, sessions)
        events = [e for e in self.events if e[0] not in fenced]
        if events:
            cur.executemany(_INSERT_EVENT, events)
        calls = [v for (sid, _), v in self.calls.items() if sid not in fenced]
        if calls:
            cur.executemany(_INSERT_CALL, calls)
        moved = []
        for key in self.handoffs:
            if key[0] in fenced:
                sid, stored_id, _, note, _ = self.calls[key]
                moved.append((note, sid, stored_id, node))
        if moved and node is not None:
            # SPEC N6, N2: the session moved on, but its call still waits here for its
            # approval: its hand-off note goes over the row this node runs, so the node
            # that claims this one's work adopts the call (gateway.handoff).
            cur.executemany(_HANDOFF_CALL, moved)
        forget = [(sid, c) for (sid, _), c in self.forget.items() if sid not in fenced]
        if forget:
            cur.executemany("DELETE FROM calls WHERE session_id=%s AND call_id=%s", forget)
        kept = {sid: v for sid, v in self.seqs.items() if sid not in fenced}
        if kept:
            seqs = [(la, ac, fl, sid) for sid, (la, ac, fl) in kept.items()]
            cur.executemany(
                "UPDATE sessions SET last_seq=%s, acked_seq=%s, floor_seq=%s WHERE session_id=%s",
                seqs,
            )
            cur.executemany(
                "DELETE FROM events WHERE session_id=%s AND seq<=%s",
                [(sid, fl) for sid, (_, _, fl) in kept.items()],
            )
        if self.jobs:
            cur.executemany(_INSERT_JOB, list(self.jobs.values()))
        if self.ledger:
            rows = [(*_ledger_values(r), node) for r in self.ledger.values()]
            cur.executemany(_INSERT_LEDGER, rows)
        self._write_deletes(cur, fenced)

    def _write_deletes(self, cur: psycopg.Cursor[tuple[Any, ...]], fenced: set[str]) -> None:
        """Sessions ended, sessions purged that are still expired, jobs past retention,
        last in the batch (SPEC D2)."""
        gone = [sid for sid in self.deletes if sid not in fenced]
        if gone:
            cur.executemany("DELETE FROM sessions WHERE session_id=%s", [(s,) for s in gone])
        if self.purged:
            # SPEC D2, D3: the purge read these as expired; one resumed since (its row's
            # expires_at cleared or moved on, committed by its node while this commit
            # waited or failed) keeps its row and its log.
            cur.execute(
                "DELETE FROM sessions WHERE session_id = ANY(%s) AND expires_at < %s "
                "RETURNING session_id",
                (self.purged, self.purged_at),
            )
            gone += [sid for (sid,) in cur.fetchall()]
        if gone:
            rows = [(sid,) for sid in gone]
            for table in ("events", "calls"):
                cur.executemany(f"DELETE FROM {table} WHERE session_id=%s", rows)
        if self.purge_before is not None:
            cur.execute(
                "DELETE FROM jobs WHERE finished_at IS NOT NULL AND finished_at<%s",
                (self.purge_before,),
            )
            # SPEC N3: inbox rows of sessions that ended before their owner read them.
            cur.execute(
                "DELETE FROM inbox i WHERE NOT EXISTS "
                "(SELECT 1 FROM sessions s WHERE s.session_id = i.session_id)"
            )
