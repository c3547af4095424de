"""Durable state behind sessions, calls, jobs and event logs (SPEC D1-D3, J5, I12).

:class:`Store` is the small interface every backend implements; :class:`SqliteStore`
is the embedded default (one file, WAL). Writes are *staged* in memory and made
durable together once per event-loop tick by the :class:`~gateway.outbox.Outbox`,
before it sends anything: an event is durable before it leaves (SPEC D1) while a burst
of events costs one write, not one disk sync each. On SQLite that write is an append
to the store's journal (:meth:`Store.journal`, :mod:`gateway.store_journal`); the
commit of the file it owes runs later, once for many ticks, and before any read of the
file. Elsewhere it is :meth:`Store.commit`. WAL with ``synchronous=NORMAL`` and the
journal's ``write(2)`` survive a process crash; a power loss may lose the last commits
(SQLite's documented trade-off).

A networked backend (PostgreSQL, Redis) implements :class:`Store` with the same staging
contract: stage cheaply, commit in :meth:`commit`, read committed data.

Storage faults fail closed (SPEC D6):

- Every value is encoded and checked when it is *staged* (:class:`BadValue` is raised to
  the one caller whose value it is, and nothing of it is staged), so a commit only writes
  bytes and numbers already known to be storable: one session's bad value never rolls
  back another session's events.
- A commit that fails (database locked by another process, disk full, I/O error) is
  rolled back and raises :class:`StoreUnavailable`; everything staged stays staged, in
  order, and the next :meth:`Store.commit` writes it all. Nothing durable is lost and,
  since the outbox sends a frame only after the journal append or commit that holds it
  succeeded, nothing unstored is ever sent. After a failed commit nothing is journaled
  until a commit succeeds.
- The SQLite connection of the event loop never waits on a lock (``busy_timeout`` 0): a
  locked file fails the commit at once and the outbox retries on a timer.
- :class:`SqliteStore` checks the file at open (``PRAGMA quick_check``, the schema
  version in ``user_version``, the tables' columns) and raises :class:`StoreDamaged`
  naming the file and the damage instead of starting empty.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from pathlib import Path
from typing import Protocol

from gateway.store_batch import SqliteBatch
from gateway.store_check import SCHEMA_VERSION as SCHEMA_VERSION
from gateway.store_check import StoreDamaged as StoreDamaged
from gateway.store_check import StoreError as StoreError
from gateway.store_check import StoreUnavailable as StoreUnavailable
from gateway.store_check import check_only, open_checked
from gateway.store_checkpoint import Checkpointer, start_checkpoints
from gateway.store_journal import JOURNAL_BYTES as JOURNAL_BYTES
from gateway.store_journal import open_replayed
from gateway.store_keys import LedgerKeys
from gateway.store_reads import SqliteReads
from gateway.store_rows import BadValue as BadValue
from gateway.store_rows import JobRow as JobRow
from gateway.store_rows import LedgerRow as LedgerRow
from gateway.store_rows import SessionRow as SessionRow
from gateway.store_rows import checked, job_values, session_values

logger = logging.getLogger("gateway.store")


class Store(Protocol):
    """Storage interface of the gateway. Stage methods never block on I/O."""

    def stage_event(self, session_id: str, seq: int, body: bytes) -> None:
        """Stage one durable event (SPEC D1); visible to reads after :meth:`commit`."""

    def stage_session(self, row: SessionRow) -> None:
        """Stage an insert-or-replace of a session row; its values are encoded and
        checked now (:class:`BadValue` if one cannot be stored; nothing staged, D6)."""

    def stage_seq(self, session_id: str, last_seq: int, acked_seq: int, floor_seq: int) -> None:
        """Stage the session's sequence counters and drop events at or below ``floor_seq``."""

    def stage_call(self, session_id: str, call_id: str, state: str, body: bytes | None) -> None:
        """Stage a call's state: ``running`` with a JSON note (tool, pending approval id)
        for recovery, or ``done`` with its terminal event bytes (SPEC I12)."""

    def stage_handoff(self, session_id: str, call_id: str, note: bytes) -> None:
        """Stage a call's ``running`` row with the hand-off note of a drain (SPEC N6,
        :mod:`gateway.handoff`), as :meth:`stage_call` does. A store shared by nodes
        also writes the note over the call's own row when this node no longer holds
        its session (a client resumed elsewhere: the session's other writes are fenced,
        SPEC N2), so that the node that claims this one adopts the call; a row of the
        call staged after it, before the commit, replaces the note and the hand-off."""

    def stage_forget_call(self, session_id: str, call_id: str) -> None:
        """Stage the removal of a call's record (it left the idempotency window, I12)."""

    def stage_job(self, row: JobRow) -> None:
        """Stage an insert-or-replace of a job row (SPEC J5: before its event is sent);
        its values are encoded and checked now (:class:`BadValue`; nothing staged, D6)."""

    def stage_ledger(self, row: LedgerRow) -> None:
        """Stage an insert-or-replace of a call ledger row (SPEC I15)."""

    def ledger(self, tenant: str, user: str, call_id: str) -> LedgerRow | None:
        """The principal's ledger row of ``call_id``, staged or committed (SPEC I15)."""

    def keep_intent(self, session_id: str, call_id: str, key: tuple[str, str, str]) -> bool:
        """Make a just-admitted call's staged ``running`` rows (its ledger row ``key`` =
        tenant, user, call id, and its session's call row) survive a crash without a
        commit (SPEC I15). ``True`` when they are journaled; commits then leave them out
        until the call ends (its ended rows replace them) or the journal is emptied.
        ``False`` when this store cannot (no journal, a failed append, the last commit
        failed, the rows are not staged): they ride the next commit as staged rows."""

    def running_durable(self, key: tuple[str, str, str]) -> bool:
        """Whether the ``running`` ledger row ``key`` (staged when its call was admitted)
        would survive a crash now, with no commit: it is journaled, or a commit wrote it
        since (SPEC I15). ``False`` while it is only staged, after a failed commit (SPEC
        D6: no handler starts then), and always on a store without a journal: the
        caller commits first (:meth:`Outbox.durable <gateway.outbox.Outbox.durable>`)."""

    def running_ledger(self) -> list[LedgerRow]:
        """Ledger rows still ``running``: calls a crash or restart cut off (SPEC I15)."""

    def purge_ledger(self, before: float) -> None:
        """Delete ledger rows created before ``before`` (Unix seconds, SPEC I15)."""

    def commit(self) -> None:
        """Write everything staged in one transaction (SPEC D6).

        Raises:
            StoreUnavailable: nothing was written; all that was staged is still staged
                and the next call writes it (with whatever was staged since).
        """

    def journal(self) -> bool:
        """Make everything staged durable without a commit, by one append to the store's
        journal (SPEC D1, D6; SQLite only): ``True`` when it is, and the commit is owed
        (:attr:`owed`) to a later :meth:`commit`, which reads run first; ``False`` when
        the caller must :meth:`commit` (no journal, rows a journal entry does not carry,
        the last commit failed, the append failed)."""

    @property
    def owed(self) -> bool:
        """Whether journaled writes wait for a :meth:`commit` (:meth:`journal`)."""

    @property
    def journals(self) -> bool:
        """Whether a flush is an append to a journal (one ``write(2)``), not a commit:
        a job's start is then made durable at once, not in the turn's group commit
        (:meth:`gateway.jobs.JobRunner._execute`)."""

    def journal_session(self, row: SessionRow) -> bool:
        """Make the ``context``, ``grants`` and ``credential_ref`` of ``row`` (just
        staged) survive a crash without a commit, even while commits fail (SPEC A3, S5,
        S6, D6): ``True`` when they do (SQLite: one journal append); nothing else of
        the row is journaled. ``False`` without a usable journal or when the append
        failed: the caller answers ``unavailable``."""

    def journal_delete(self, session_id: str) -> bool:
        """Make a session's deletion survive a crash without a commit, even while
        commits fail (SPEC A4, D2, D6), as :meth:`journal_session` does; ``False``
        likewise. The deletion itself is staged by :meth:`delete_session`, in the same
        loop turn (before or after): the session's rows are gone after a restart."""

    def load_session(self, session_id: str) -> SessionRow | None: ...

    def delete_session(self, session_id: str) -> None:
        """Forget a session, its events and calls (its jobs stay, SPEC D2); staged, it
        runs last in the next commit (a locked store must not fail it, D6)."""

    def events_after(
        self, session_id: str, seq: int, limit: int | None = None
    ) -> list[tuple[int, bytes]]:
        """Committed events of a session with ``seq`` greater than the given one, in order;
        at most ``limit`` of them (``None``: all)."""

    def events_complete(self, session_id: str, after: int, upto: int) -> bool:
        """Whether every committed event ``after < seq <= upto`` of the session is there:
        the log has no hole in that range (SPEC D3, D6, case F27)."""

    def call(self, session_id: str, call_id: str) -> tuple[str, bytes | None] | None:
        """A call's ``(state, terminal bytes)``, or ``None`` if the call id is unused."""

    def done_call_ids(self, session_id: str) -> list[str]: ...

    def running_calls(self) -> list[tuple[str, str, bytes | None]]:
        """``(session_id, call_id, body)`` of calls a crash or restart cut off; a running
        call's body is JSON ``{"tool": name, "approval_id"?: id, "expires_at"?: s}``
        (or ``"elicitation_id"`` and its ``"expires_at"``, SPEC M3, N3)."""

    def job(self, job_id: str) -> JobRow | None: ...

    def jobs(self, user: str, tenant: str | None, state: str | None, limit: int) -> list[JobRow]:
        """The user's jobs, newest first (SPEC J3)."""

    def unfinished_jobs(self) -> list[JobRow]: ...

    def all_sessions(self) -> list[SessionRow]: ...

    def purge(self, now: float, job_retention: float) -> None:
        """Delete expired sessions and jobs finished more than ``job_retention`` s ago."""

    def close(self) -> None: ...


class CommitsOnly:
    """:meth:`Store.journal`, :attr:`Store.owed` and the intent methods of a store
    without a journal: every flush commits (PostgreSQL: every node reads the database)."""

    owed = False
    journals = False

    def journal(self) -> bool:
        return False

    def keep_intent(self, session_id: str, call_id: str, key: tuple[str, str, str]) -> bool:
        """Always ``False``: a node that takes over a dead one must see the ``running``
        rows in the database, so they are committed before the handler (SPEC I15, N4)."""
        return False

    def running_durable(self, key: tuple[str, str, str]) -> bool:
        """Always ``False``: the caller commits before the handler (as above)."""
        return False

    def journal_session(self, row: SessionRow) -> bool:
        """Always ``False``: only a commit makes a session change durable (SPEC D6)."""
        return False

    def journal_delete(self, session_id: str) -> bool:
        """Always ``False``: only a commit makes a session's end durable (SPEC D6)."""
        return False


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
    catalog_version TEXT, credential_ref TEXT
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
CREATE TABLE IF NOT EXISTS call_ledger (
    tenant TEXT NOT NULL, user TEXT NOT NULL, call_id TEXT NOT NULL, tool TEXT NOT NULL,
    params_hash TEXT NOT NULL, state TEXT NOT NULL, outcome BLOB, created_at REAL NOT NULL,
    PRIMARY KEY (tenant, user, call_id)
);
CREATE INDEX IF NOT EXISTS call_ledger_by_age ON call_ledger (created_at);
CREATE TABLE IF NOT EXISTS journal_mark (
    id INTEGER PRIMARY KEY CHECK (id = 1), generation INTEGER NOT NULL
);
"""


def check_file(path: Path) -> None:
    """The store file at ``path`` checked as :class:`SqliteStore` would open it, read-only
    (``toolbus check``, SPEC O5, D6; :func:`gateway.store_check.check_only`).

    Raises:
        StoreDamaged: the file is damaged (its message says how to start fresh).
        StoreError: it cannot be read."""
    check_only(str(path), _SCHEMA)


def _ledger_keys(db: sqlite3.Connection) -> LedgerKeys:
    """Every ledger key of the file, as :class:`LedgerKeys` (about 1 s per million
    rows, once at open)."""
    count, latest = db.execute(
        "SELECT count(*), coalesce(max(created_at), 0) FROM call_ledger"
    ).fetchone()
    return LedgerKeys(db.execute("SELECT tenant, user, call_id FROM call_ledger"), count, latest)


class SqliteStore(SqliteReads):
    """The embedded default :class:`Store`: one SQLite file in WAL mode (SPEC D3).

    Args:
        path: the database file (created with its folder), or ``":memory:"``.
        checkpoint_interval: seconds between two WAL checkpoints of the
            :class:`~gateway.store_checkpoint.Checkpointer` thread (not for ``:memory:``).
        ledger_window: ``calls.call_id_window`` (s): older intent journal entries are not
            put back at open (:func:`~gateway.store_journal.replay`; ``None``: all are).

    All methods run on the event-loop thread; each commit is one short transaction
    without an fsync (WAL, ``synchronous=NORMAL``) that never waits on a lock. What is
    staged waits in a :class:`~gateway.store_batch.SqliteBatch` until :meth:`commit`.

    Raises:
        StoreDamaged: at open, the file fails its check (SPEC D6, O5; case F32).
        StoreError: at open, the file cannot be opened (permissions, a lock held past
            5 s by another process, another store writing it: one store per file).
    """

    def __init__(
        self,
        path: Path | str,
        checkpoint_interval: float = 1.0,
        ledger_window: float | None = None,
    ) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        # timeout=0: this connection runs on the event loop and must never wait on a
        # lock another connection holds (SPEC D6); a busy file fails the commit at once.
        self._db = open_checked(self.path, _SCHEMA)
        self._batch = SqliteBatch()
        self._commit_failed = False  # whether the last attempt (a purge's too) failed, D6
        since = None if ledger_window is None else time.time() - ledger_window
        try:  # the journal; calls' running rows it holds stay out of the batch
            self._intents = open_replayed(self.path, self._db, since)
        except BaseException:
            self._db.close()
            raise
        # One writer of the file (the journal's lock, or a private :memory: database):
        # a new call id is then answered from memory (issue 13, SPEC I12).
        self._keys: LedgerKeys | None = None
        if self.path == ":memory:" or self.journals:
            try:
                self._keys = _ledger_keys(self._db)
            except BaseException:
                self._intents.close()
                self._db.close()
                raise
        self._checkpointer: Checkpointer | None = None
        if self.path != ":memory:":
            self._checkpointer = start_checkpoints(
                self._db, self.path, checkpoint_interval, WAL_PAGES
            )

    # -- staging ---------------------------------------------------------------------

    def stage_event(self, session_id: str, seq: int, body: bytes) -> None:
        # ``body`` comes encoded from protocol.codec (valid UTF-8 JSON): nothing to check.
        self._batch.events.append((session_id, seq, body))
        self._intents.staged_event(session_id, seq, body)

    def stage_session(self, row: SessionRow) -> None:
        batch = self._batch
        values = checked(session_values(row), "session")
        batch.sessions[row.session_id] = values
        self._intents.staged_session(values)
        if row.session_id in batch.seqs:  # the row's counters win; its floor still trims
            batch.seqs[row.session_id] = (row.last_seq, row.acked_seq, row.floor_seq)

    def stage_seq(self, session_id: str, last_seq: int, acked_seq: int, floor_seq: int) -> None:
        self._batch.seqs[session_id] = (last_seq, acked_seq, floor_seq)
        self._intents.staged_seq(session_id, last_seq, acked_seq, floor_seq)

    def stage_call(self, session_id: str, call_id: str, state: str, body: bytes | None) -> None:
        self._intents.staged_call(session_id, call_id, state, body)
        self._batch.put_call((session_id, call_id), (session_id, call_id, state, body))

    def stage_handoff(self, session_id: str, call_id: str, note: bytes) -> None:
        # One process, no fencing (SPEC N6: the next start adopts the call from its row).
        self.stage_call(session_id, call_id, "running", note)

    def stage_forget_call(self, session_id: str, call_id: str) -> None:
        self._intents.forgotten(session_id, call_id)
        self._batch.calls.pop((session_id, call_id), None)
        self._batch.forget[(session_id, call_id)] = None

    def stage_job(self, row: JobRow) -> None:
        values = checked(job_values(row), f"job {row.job_id}")
        self._batch.jobs[row.job_id] = values
        self._intents.staged_job(values)

    def stage_ledger(self, row: LedgerRow) -> None:
        key = (row.tenant, row.user, row.call_id)
        self._intents.staged_ledger(key, row)
        self._batch.ledger[key] = row
        if self._keys is not None:
            self._keys.add(key, row.created_at, new=row.state == "running")

    @property
    def dirty(self) -> bool:
        """Whether anything is staged and not yet committed."""
        return self._batch.dirty

    def commit(self) -> None:
        self._commit(self._intents.emptying(self._batch))

    def journal(self) -> bool:
        return not self._commit_failed and self._intents.log(self._batch)

    @property
    def owed(self) -> bool:
        return self._intents.owed

    @property
    def journals(self) -> bool:
        return self._intents.journal is not None

    def _settled(self) -> sqlite3.Connection:
        """The connection, once the file has every journaled write (a read of the file
        must see what was sent, SPEC D1, D3); raises :class:`StoreUnavailable`."""
        if self._intents.owed:
            self.commit()
        return self._db

    def _commit(self, emptying: bool) -> None:
        """Commit the batch; with ``emptying``, the held rows too, then empty the journal
        (every journaled call's rows are in the file first)."""
        if emptying:
            self._intents.release(self._batch)
        if self._batch.dirty:
            db = self._db
            self._commit_failed = True  # until this attempt succeeds
            try:
                # IMMEDIATE takes the write lock first: a file locked by another
                # connection fails here, before anything is written (busy_timeout 0).
                db.execute("BEGIN IMMEDIATE")
                deleted, purged = self._batch.write(db)
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                # SPEC D6: nothing of this batch is durable; keep it all staged (released
                # rows too: the journal still names them) for the next attempt (the
                # outbox holds its frames until then).
                self._rollback()
                raise StoreUnavailable(f"{self.path}: commit failed: {exc}") from exc
            except BaseException:
                self._rollback()
                raise
            self._commit_failed = False
            if self._batch.ledger_before is not None and self._keys is not None:
                self._keys.expire(self._batch.ledger_before, deleted)
            for session_id in purged:  # deleted: their held call rows are never written
                self._intents.drop_session(session_id)
            self._batch = SqliteBatch()
        self._intents.committed(emptying)

    def journal_session(self, row: SessionRow) -> bool:
        # Not held back by a failed commit, unlike journal(): these columns depend on no
        # other write (store_journal.Intents.session_change).
        values = checked(session_values(row), "session")
        change = ("a", row.session_id, values[5], values[7], row.credential_ref)
        return self._intents.session_change(change)

    def journal_delete(self, session_id: str) -> bool:
        return self._intents.session_change(("d", session_id))

    def keep_intent(self, session_id: str, call_id: str, key: tuple[str, str, str]) -> bool:
        return not self._commit_failed and self._intents.keep(self._batch, session_id, call_id, key)

    def running_durable(self, key: tuple[str, str, str]) -> bool:
        return not self._commit_failed and self._intents.durable(self._batch, key)

    def _rollback(self) -> None:
        """End a failed transaction. SQLite may already have rolled it back itself (a
        full disk, an I/O error): then there is nothing to undo, and no second error."""
        if not self._db.in_transaction:
            return
        try:
            self._db.execute("ROLLBACK")
        except sqlite3.Error as exc:  # the connection is unusable; the next BEGIN says so
            logger.warning("%s: rollback after a failed commit failed: %s", self.path, exc)

    # -- reads -----------------------------------------------------------------------

    def delete_session(self, session_id: str) -> None:
        # Staged like every write (SPEC D6): a locked file must not fail or stall the end
        # of a session; the deletion runs last in the next commit.
        self._intents.drop_session(session_id)
        self._batch.deletes.append(session_id)

    def purge(self, now: float, job_retention: float) -> None:
        # Settled first: a session row journaled since the last commit (a resume that
        # cleared its expires_at) must not be read as the file's older one. A store
        # that cannot commit now expires no session this round (the file is behind).
        with contextlib.suppress(StoreUnavailable):
            cur = self._settled().execute(
                "SELECT session_id FROM sessions WHERE expires_at IS NOT NULL AND expires_at<?",
                (now,),
            )
            # SPEC D2: deleted only if still expired when the commit runs (a resume
            # staged before it keeps the session, its log and its held call rows).
            self._batch.purged.extend(session_id for (session_id,) in cur)
            self._batch.purged_at = now
        self._batch.purge_before = now - job_retention
        # A store that cannot commit now keeps the purge staged for the next commit.
        with contextlib.suppress(StoreUnavailable):
            self.commit()

    def ledger(self, tenant: str, user: str, call_id: str) -> LedgerRow | None:
        key = (tenant, user, call_id)
        staged = self._batch.ledger.get(key) or self._intents.held_ledger(key)
        if staged is not None:
            return staged
        if self._keys is not None and key not in self._keys:
            return None  # no row of the file has this key: a new call id
        row = self._db.execute(
            "SELECT * FROM call_ledger WHERE tenant=? AND user=? AND call_id=?",
            (tenant, user, call_id),
        ).fetchone()
        return None if row is None else LedgerRow(*row)

    def purge_ledger(self, before: float) -> None:
        # Staged like purge(): a locked store is never waited on here (SPEC D6).
        self._batch.ledger_before = before
        with contextlib.suppress(StoreUnavailable):
            self.commit()

    def close(self) -> None:
        try:
            self._commit(emptying=True)
        except StoreUnavailable as exc:
            # Never sent (SPEC D6): no client holds these events, so the log stays whole.
            # The journal keeps its entries: the next open puts their calls back.
            logger.error("%s; %d staged events dropped at close", exc, len(self._batch.events))
        if self._checkpointer is not None:
            self._checkpointer.stop()
        self._intents.close()
        self._db.close()
