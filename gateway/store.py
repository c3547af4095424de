"""Durable state behind sessions, calls, jobs and event logs (SPEC D1-D3, J5, I12).

:class:`Store` is the small interface every backend implements; :class:`SqliteStore`
is the embedded default (one file, WAL). Writes are *staged* in memory and committed
together by :meth:`Store.commit`, which the :class:`~gateway.outbox.Outbox` calls once
per event-loop tick before it sends anything: an event is durable before it leaves
(SPEC D1) while a burst of events costs one transaction, not one disk sync each. WAL
with ``synchronous=NORMAL`` survives a process crash; a power loss may lose the last
commits (SQLite's documented trade-off).

A networked backend (PostgreSQL, Redis) implements :class:`Store` with the same staging
contract: stage cheaply, commit in :meth:`commit`, read committed data.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from protocol.codec import decode_json, encode_json


@dataclass(frozen=True, slots=True)
class SessionRow:
    """A session as stored (SPEC D3). Times are Unix seconds."""

    session_id: str
    token_hash: str
    user: str
    tenant: str | None
    profile: str
    context: dict[str, str]
    options: dict[str, Any]
    grants: list[str]
    last_seq: int
    acked_seq: int
    floor_seq: int
    """Events with seq <= floor_seq are gone (acked or over the cap); resume below it fails."""
    created_at: float
    expires_at: float | None
    """When a parked session stops being resumable; ``None`` while a socket holds it."""
    catalog_version: str | None


@dataclass(frozen=True, slots=True)
class JobRow:
    """A job as stored (SPEC J1). ``result``/``error`` are JSON objects or ``None``."""

    job_id: str
    tool: str
    state: str
    session_id: str
    user: str
    tenant: str | None
    profile: str
    call_id: str | None
    params: dict[str, Any]
    context: dict[str, str]
    created_at: float
    started_at: float | None
    finished_at: float | None
    summary: str | None
    artifacts: list[dict[str, Any]]
    result: dict[str, Any] | None
    error: dict[str, Any] | None


class Store(Protocol):
    """Storage interface of the gateway. Stage methods never block on I/O."""

    def stage_event(self, session_id: str, seq: int, body: bytes) -> None:
        """Stage one durable event (SPEC D1); visible to reads after :meth:`commit`."""

    def stage_session(self, row: SessionRow) -> None:
        """Stage an insert-or-replace of a session row."""

    def stage_seq(self, session_id: str, last_seq: int, acked_seq: int, floor_seq: int) -> None:
        """Stage the session's sequence counters and drop events at or below ``floor_seq``."""

    def stage_call(self, session_id: str, call_id: str, state: str, body: bytes | None) -> None:
        """Stage a call's state: ``running`` with a JSON note (tool, pending approval id)
        for recovery, or ``done`` with its terminal event bytes (SPEC I12)."""

    def stage_forget_call(self, session_id: str, call_id: str) -> None:
        """Stage the removal of a call's record (it left the idempotency window, I12)."""

    def stage_job(self, row: JobRow) -> None:
        """Stage an insert-or-replace of a job row (SPEC J5: before its event is sent)."""

    def commit(self) -> None:
        """Write everything staged in one transaction."""

    def load_session(self, session_id: str) -> SessionRow | None: ...

    def delete_session(self, session_id: str) -> None:
        """Forget a session, its events and calls (its jobs stay, SPEC D2)."""

    def events_after(
        self, session_id: str, seq: int, limit: int | None = None
    ) -> list[tuple[int, bytes]]:
        """Committed events of a session with ``seq`` greater than the given one, in order;
        at most ``limit`` of them (``None``: all)."""

    def call(self, session_id: str, call_id: str) -> tuple[str, bytes | None] | None:
        """A call's ``(state, terminal bytes)``, or ``None`` if the call id is unused."""

    def done_call_ids(self, session_id: str) -> list[str]: ...

    def running_calls(self) -> list[tuple[str, str, bytes | None]]:
        """``(session_id, call_id, body)`` of calls a crash or restart cut off; a running
        call's body is JSON ``{"tool": name, "approval_id"?: id}``."""

    def job(self, job_id: str) -> JobRow | None: ...

    def jobs(self, user: str, tenant: str | None, state: str | None, limit: int) -> list[JobRow]:
        """The user's jobs, newest first (SPEC J3)."""

    def unfinished_jobs(self) -> list[JobRow]: ...

    def all_sessions(self) -> list[SessionRow]: ...

    def purge(self, now: float, job_retention: float) -> None:
        """Delete expired sessions and jobs finished more than ``job_retention`` s ago."""

    def close(self) -> None: ...


WAL_PAGES = 16_384
"""WAL size, in pages of 4 KiB (64 MiB), past which a commit checkpoints inline and the
file is truncated back after the WAL restarts."""

# Events and calls are rowid tables plus an index, not tables clustered by session
# (WITHOUT ROWID): rows then append to the table's last page and only the small index
# entries scatter across sessions. With 50 sessions busy, that halves the pages a commit
# writes (measured here: 36 us against 71 us of SQLite time per call).
_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, token_hash TEXT NOT NULL, user TEXT NOT NULL,
    tenant TEXT, profile TEXT NOT NULL, context BLOB NOT NULL, options BLOB NOT NULL,
    grants BLOB NOT NULL, last_seq INTEGER NOT NULL, acked_seq INTEGER NOT NULL,
    floor_seq INTEGER NOT NULL, created_at REAL NOT NULL, expires_at REAL,
    catalog_version TEXT
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS events_by_session ON events (session_id, seq);
CREATE TABLE IF NOT EXISTS calls (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL, call_id TEXT NOT NULL, state TEXT NOT NULL, body BLOB
);
CREATE UNIQUE INDEX IF NOT EXISTS calls_by_session ON calls (session_id, call_id);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY, tool TEXT NOT NULL, state TEXT NOT NULL,
    session_id TEXT NOT NULL, user TEXT NOT NULL, tenant TEXT, profile TEXT NOT NULL,
    call_id TEXT, params BLOB NOT NULL, context BLOB NOT NULL, created_at REAL NOT NULL,
    started_at REAL, finished_at REAL, summary TEXT, artifacts BLOB NOT NULL,
    result BLOB, error BLOB
);
CREATE INDEX IF NOT EXISTS jobs_by_user ON jobs (user, created_at);
"""


# A session row's last_seq is written with the row (save, ack); events emitted since are
# in the log, so the true last seq is the larger of the two. This keeps emit() to a
# single staged insert.
_SELECT_SESSIONS = (
    "SELECT s.*, (SELECT MAX(seq) FROM events e WHERE e.session_id = s.session_id) FROM sessions s"
)


def _json(value: Any) -> bytes:
    return encode_json(value)


def _opt_json(value: Any) -> bytes | None:
    return None if value is None else encode_json(value)


def _load(raw: bytes | None) -> Any:
    return None if raw is None else decode_json(raw)


class SqliteStore:
    """The embedded default :class:`Store`: one SQLite file in WAL mode (SPEC D3).

    Args:
        path: the database file (created with its folder), or ``":memory:"``.

    All methods run on the event-loop thread; each commit is one short transaction
    without an fsync (WAL, ``synchronous=NORMAL``).
    """

    def __init__(self, path: Path | str, checkpoint_interval: float = 1.0) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._checkpointer: _Checkpointer | None = None
        if str(path) != ":memory:":
            # Checkpoints (which fsync) leave the event loop for a thread of their own;
            # they were a third of the commit cost when SQLite ran them inline.
            # The thread's PASSIVE checkpoints cannot restart the WAL while writes keep
            # landing; a rare inline checkpoint, run between two commits, can. By then the
            # thread has copied most frames, so it is cheap, and the WAL stays bounded.
            self._db.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
            self._db.execute(f"PRAGMA journal_size_limit={WAL_PAGES * 4096}")
            self._checkpointer = _Checkpointer(str(path), checkpoint_interval)
        self._events: list[tuple[str, int, bytes]] = []
        self._sessions: dict[str, SessionRow] = {}
        self._seqs: dict[str, tuple[int, int, int]] = {}
        self._calls: dict[tuple[str, str], tuple[str, str, str, bytes | None]] = {}
        self._forget: list[tuple[str, str]] = []
        self._jobs: dict[str, JobRow] = {}

    # -- staging ---------------------------------------------------------------------

    def stage_event(self, session_id: str, seq: int, body: bytes) -> None:
        self._events.append((session_id, seq, body))

    def stage_session(self, row: SessionRow) -> None:
        self._sessions[row.session_id] = row
        self._seqs.pop(row.session_id, None)

    def stage_seq(self, session_id: str, last_seq: int, acked_seq: int, floor_seq: int) -> None:
        self._seqs[session_id] = (last_seq, acked_seq, floor_seq)

    def stage_call(self, session_id: str, call_id: str, state: str, body: bytes | None) -> None:
        # Keyed: a call that starts and ends within one tick is written once.
        self._calls[(session_id, call_id)] = (session_id, call_id, state, body)

    def stage_forget_call(self, session_id: str, call_id: str) -> None:
        self._calls.pop((session_id, call_id), None)
        self._forget.append((session_id, call_id))

    def stage_job(self, row: JobRow) -> None:
        self._jobs[row.job_id] = row

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
        )

    def commit(self) -> None:
        if not self.dirty:
            return
        db = self._db
        db.execute("BEGIN")
        try:
            if self._sessions:
                db.executemany(
                    "INSERT OR REPLACE INTO sessions VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    [_session_values(row) for row in self._sessions.values()],
                )
            if self._events:
                db.executemany(
                    "INSERT OR REPLACE INTO events (session_id, seq, body) VALUES (?,?,?)",
                    self._events,
                )
            if self._calls:
                db.executemany(
                    "INSERT OR REPLACE INTO calls (session_id, call_id, state, body) "
                    "VALUES (?,?,?,?)",
                    self._calls.values(),
                )
            if self._forget:
                db.executemany("DELETE FROM calls WHERE session_id=? AND call_id=?", self._forget)
            if self._seqs:
                self._commit_seqs(db)
            if self._jobs:
                db.executemany(
                    "INSERT OR REPLACE INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    [_job_values(row) for row in self._jobs.values()],
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        finally:
            self._events, self._calls, self._forget = [], {}, []
            self._sessions, self._seqs, self._jobs = {}, {}, {}

    def _commit_seqs(self, db: sqlite3.Connection) -> None:
        rows = [(last, acked, floor, sid) for sid, (last, acked, floor) in self._seqs.items()]
        db.executemany(
            "UPDATE sessions SET last_seq=?, acked_seq=?, floor_seq=? WHERE session_id=?", rows
        )
        db.executemany(
            "DELETE FROM events WHERE session_id=? AND seq<=?",
            [(sid, floor) for sid, (_, _, floor) in self._seqs.items()],
        )

    # -- reads -----------------------------------------------------------------------

    def load_session(self, session_id: str) -> SessionRow | None:
        cur = self._db.execute(_SELECT_SESSIONS + " WHERE s.session_id=?", (session_id,))
        row = cur.fetchone()
        return None if row is None else _session_row(row)

    def all_sessions(self) -> list[SessionRow]:
        return [_session_row(row) for row in self._db.execute(_SELECT_SESSIONS)]

    def delete_session(self, session_id: str) -> None:
        for table in ("sessions", "events", "calls"):
            self._db.execute(f"DELETE FROM {table} WHERE session_id=?", (session_id,))

    def events_after(
        self, session_id: str, seq: int, limit: int | None = None
    ) -> list[tuple[int, bytes]]:
        cur = self._db.execute(
            "SELECT seq, body FROM events WHERE session_id=? AND seq>? ORDER BY seq LIMIT ?",
            (session_id, seq, -1 if limit is None else limit),
        )
        return list(cur)

    def call(self, session_id: str, call_id: str) -> tuple[str, bytes | None] | None:
        cur = self._db.execute(
            "SELECT state, body FROM calls WHERE session_id=? AND call_id=?", (session_id, call_id)
        )
        row = cur.fetchone()
        return None if row is None else (row[0], row[1])

    def done_call_ids(self, session_id: str) -> list[str]:
        cur = self._db.execute(
            "SELECT call_id FROM calls WHERE session_id=? AND state='done' ORDER BY id",
            (session_id,),
        )
        return [row[0] for row in cur]

    def running_calls(self) -> list[tuple[str, str, bytes | None]]:
        cur = self._db.execute("SELECT session_id, call_id, body FROM calls WHERE state!='done'")
        return [(row[0], row[1], row[2]) for row in cur]

    def job(self, job_id: str) -> JobRow | None:
        row = self._db.execute("SELECT * FROM jobs WHERE job_id=?", (job_id,)).fetchone()
        return None if row is None else _job_row(row)

    def jobs(self, user: str, tenant: str | None, state: str | None, limit: int) -> list[JobRow]:
        sql = "SELECT * FROM jobs WHERE user=? AND tenant IS ?"
        args: list[Any] = [user, tenant]
        if state is not None:
            sql += " AND state=?"
            args.append(state)
        sql += " ORDER BY created_at DESC, rowid DESC LIMIT ?"
        args.append(limit)
        return [_job_row(row) for row in self._db.execute(sql, args)]

    def unfinished_jobs(self) -> list[JobRow]:
        cur = self._db.execute("SELECT * FROM jobs WHERE state IN ('queued', 'running')")
        return [_job_row(row) for row in cur]

    def purge(self, now: float, job_retention: float) -> None:
        cur = self._db.execute(
            "SELECT session_id FROM sessions WHERE expires_at IS NOT NULL AND expires_at<?", (now,)
        )
        for (session_id,) in list(cur):
            self.delete_session(session_id)
        self._db.execute(
            "DELETE FROM jobs WHERE finished_at IS NOT NULL AND finished_at<?",
            (now - job_retention,),
        )

    def close(self) -> None:
        self.commit()
        if self._checkpointer is not None:
            self._checkpointer.stop()
        self._db.close()


class _Checkpointer:
    """Copies the WAL into the database file every ``interval`` seconds, on its own
    thread and connection (``PRAGMA wal_checkpoint(PASSIVE)``: it never blocks writers),
    so that commits on the event loop stay short appends to the WAL."""

    def __init__(self, path: str, interval: float) -> None:
        self._path = path
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolbus-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        db = sqlite3.connect(self._path, isolation_level=None)
        try:
            while not self._stop.wait(self._interval):
                db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()

    def stop(self) -> None:
        """Run a last full checkpoint and end the thread."""
        self._stop.set()
        self._thread.join()


def _session_values(row: SessionRow) -> tuple[Any, ...]:
    return (
        row.session_id,
        row.token_hash,
        row.user,
        row.tenant,
        row.profile,
        _json(row.context),
        _json(row.options),
        _json(row.grants),
        row.last_seq,
        row.acked_seq,
        row.floor_seq,
        row.created_at,
        row.expires_at,
        row.catalog_version,
    )


def _session_row(row: Iterable[Any]) -> SessionRow:
    (sid, token_hash, user, tenant, profile, context, options, grants, *rest) = row
    last_seq, acked_seq, floor_seq, created_at, expires_at, catalog_version, logged = rest
    return SessionRow(
        sid,
        token_hash,
        user,
        tenant,
        profile,
        _load(context),
        _load(options),
        _load(grants),
        max(last_seq, logged or 0),
        acked_seq,
        floor_seq,
        created_at,
        expires_at,
        catalog_version,
    )


def _job_values(row: JobRow) -> tuple[Any, ...]:
    return (
        row.job_id,
        row.tool,
        row.state,
        row.session_id,
        row.user,
        row.tenant,
        row.profile,
        row.call_id,
        _json(row.params),
        _json(row.context),
        row.created_at,
        row.started_at,
        row.finished_at,
        row.summary,
        _json(row.artifacts),
        _opt_json(row.result),
        _opt_json(row.error),
    )


def _job_row(row: Iterable[Any]) -> JobRow:
    (job_id, tool, state, sid, user, tenant, profile, call_id, params, context, *rest) = row
    created_at, started_at, finished_at, summary, artifacts, result, error = rest
    return JobRow(
        job_id,
        tool,
        state,
        sid,
        user,
        tenant,
        profile,
        call_id,
        _load(params),
        _load(context),
        created_at,
        started_at,
        finished_at,
        summary,
        _load(artifacts),
        _load(result),
        _load(error),
    )
