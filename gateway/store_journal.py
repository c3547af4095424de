"""The intent journal of a SQLite store: a call's ``running`` rows made durable with one
``write(2)``, not a commit (SPEC I15, D6; issue 13).

Before a handler with side effects starts, its call's ``running`` rows (the principal's
ledger row and the session's call row) must survive a crash, so that a re-send never
runs the tool again (SPEC I15). A SQLite commit of those rows costs a transaction and,
for a lone call, a loop turn: about a fifth of a sequential call's round trip. The
journal gets the same guarantee from one append to ``<database>-intent``: once
``os.write`` returned, the bytes are in the kernel's page cache and survive the
process being killed, which is exactly what a WAL commit at ``synchronous=NORMAL``
promises too (neither survives a power loss before the OS writes the pages back).

A call is journaled when it is admitted, in the loop turn that staged its rows
(:meth:`CallLedger.open <gateway.ledger.CallLedger.open>`); the store then holds the
rows out of its batch. A call that ends before the journal is emptied never writes its
``running`` rows at all: its ended rows replace them (under 50 concurrent sessions a
commit used to land between a call's start and its end almost always, so each call
wrote its ledger and call rows twice). The journal is emptied (``ftruncate``) only
now and then, by a commit that first writes every row still held: after a commit past
:data:`JOURNAL_BYTES`, with every ledger purge (so no entry outlives
its call's ledger row, SPEC I15's window) and at a clean close; a truncate costs about
ten appends. At open, the store puts back every journaled call whose ledger row the
file lacks (a crash while it ran, or before its end was committed), before recovery
reads the ``running`` rows: recovery then ends those calls ``cancelled`` exactly as if
the rows had been committed. Entries of calls whose ended rows the file has are spent:
skipped.

Entries are lines of JSON with a newline on both sides, so a torn append (a full disk)
is a line of its own that does not parse and is skipped: a failed append left the rows
staged (the next commit writes them) and the handler waits for that commit.

The journal alone is enough before the handler only when nothing else must be durable
first (:meth:`CallLedger.durable <gateway.ledger.CallLedger.durable>`,
:meth:`SqliteStore.running_durable <gateway.store.SqliteStore.running_durable>`): no
approval was decided (its outcome must be committed before the handler, SPEC A3; the
journaled ledger row stays held meanwhile), the session does not get ungated
``tool_start`` (that event must be in the log of a started tool, SPEC A6: its calls
are not journaled), and the store's last commit succeeded (SPEC D6: no call is
journaled, and no handler starts on the journal, while commits fail). Otherwise the
pipeline waits for a commit.

One store writes a SQLite file: the store takes an exclusive ``flock`` on its journal,
and a second store on the same file, in this process or another, fails to open
(:class:`~gateway.store_check.StoreError`): the first one's ``running`` rows may be
only in its journal, so the second could not see a call running there and would run
a re-send again (SPEC I15). A store works without a journal when the journal cannot be
opened, is not a regular file (``/dev/null`` would keep nothing), or after a truncate
failed (it would only grow); then every call's rows are committed before its handler.
An entry left by a failed truncate outlives its call's ledger row: the replay skips
entries older than the ledger's window (a call id that old is new again, SPEC I15), so
a finished call is never put back.

Not handled: the journal names no database. One left beside a database file that was
replaced by another (a restore) is applied to it, and the calls it names come back
``cancelled`` there; the damage message tells to move ``-intent`` with the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.store_batch import SqliteBatch
from gateway.store_check import StoreError
from gateway.store_rows import LedgerRow, ledger_values
from protocol.codec import decode_json, encode_json

logger = logging.getLogger("gateway.store")

SUFFIX = "-intent"
"""The journal of ``toolbus.db`` is ``toolbus.db-intent``, beside its ``-wal`` file."""

JOURNAL_BYTES = 256 * 1024
"""The journal is emptied by the first commit past this size (about 1,700 calls), by
every ledger purge and at a clean close."""

Key = tuple[str, str, str]
"""A ledger row's key: ``(tenant, user, call_id)``."""


@dataclass(frozen=True, slots=True)
class Intent:
    """One journaled call: the rows its commit would have written (SPEC I15).

    ``note`` is the call row's JSON note (tool, pending approval id) as text.
    """

    session_id: str
    call_id: str
    note: str | None
    tenant: str
    user: str
    tool: str
    params_hash: str
    created_at: float

    @classmethod
    def of(
        cls, session_id: str, call_id: str, staged: tuple[Any, ...] | None, ledger: LedgerRow
    ) -> Intent:
        """The intent of a call from its staged rows: ``staged`` is its call row
        ``(session_id, call_id, state, body)`` if one is staged, ``ledger`` its ledger row."""
        body = staged[3] if staged is not None and staged[2] == "running" else None
        note = None if body is None else body.decode()
        return cls(
            session_id,
            call_id,
            note,
            ledger.tenant,
            ledger.user,
            ledger.tool,
            ledger.params_hash,
            ledger.created_at,
        )

    def well_formed(self) -> bool:
        """Whether every field has its type (a line read back may be anything)."""
        texts = (self.session_id, self.call_id, self.tenant, self.user, self.tool)
        return (
            all(isinstance(v, str) for v in (*texts, self.params_hash))
            and (self.note is None or isinstance(self.note, str))
            and isinstance(self.created_at, int | float)
            and not isinstance(self.created_at, bool)
        )

    def encode(self) -> bytes:
        """The entry as one journal line, newline on both sides."""
        return (
            b"\n"
            + encode_json(
                [
                    self.session_id,
                    self.call_id,
                    self.note,
                    self.tenant,
                    self.user,
                    self.tool,
                    self.params_hash,
                    self.created_at,
                ]
            )
            + b"\n"
        )


class IntentJournal:
    """The append-only intent file of one store; all methods run on the event loop.

    Args:
        path: the journal file (created, mode 0600).

    Raises:
        OSError: the file cannot be opened or created.
        BlockingIOError: another process holds its lock (:func:`open_journal` turns
            this into "no journal").
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise
        self._size = os.fstat(self._fd).st_size
        self._failing = False
        self._broken = False
        """A truncate failed: the journal takes no more entries (it would only grow)."""

    @property
    def size(self) -> int:
        """Bytes appended since the last :meth:`clear`."""
        return self._size

    def append(self, intent: Intent) -> bool:
        """Append ``intent``; ``True`` once all of it is in the file (SPEC I15).

        ``False`` (the disk is full, an I/O error, a short write): the caller must not
        count on it and commits the rows instead. A failure is logged once, until an
        append succeeds again.
        """
        if self._broken:
            return False
        line = intent.encode()
        try:
            written = os.write(self._fd, line)
        except OSError as exc:
            self._failed(exc)
            return False
        self._size += written
        if written != len(line):
            self._failed(OSError(f"short write, {written} of {len(line)} bytes"))
            return False
        self._failing = False
        return True

    def _failed(self, exc: OSError) -> None:
        if not self._failing:
            logger.warning("%s: intent journal append failed (commits instead): %s", self.path, exc)
        self._failing = True

    def clear(self) -> None:
        """Empty the file: every entry's rows are committed. A failed truncate leaves
        the entries; they are harmless (the open skips calls the file has)."""
        if self._size == 0:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError as exc:
            if not self._broken:
                logger.warning(
                    "%s: intent journal truncate failed (calls commit instead from now on): %s",
                    self.path,
                    exc,
                )
            self._broken = True
            return
        self._size = 0

    def read(self) -> list[Intent]:
        """Every whole entry in the file, in order; torn or foreign lines are skipped."""
        # Only the file's length: a journal that is a device (``/dev/full`` in a test of
        # a full disk) would read forever.
        data = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        found = []
        for line in data.split(b"\n"):
            if not line:
                continue
            try:
                intent = Intent(*decode_json(line))
            except (ValueError, TypeError):  # not JSON, or not an entry's fields
                intent = None
            if intent is None or not intent.well_formed():
                logger.warning("%s: skipped a torn intent journal entry", self.path)
                continue
            found.append(intent)
        return found

    def fileno(self) -> int:
        """The journal's file descriptor."""
        return self._fd

    def close(self) -> None:
        """Release the lock and the file (the kernel does both at exit too)."""
        with contextlib.suppress(OSError):
            os.close(self._fd)


def open_journal(database: str) -> IntentJournal | None:
    """The journal beside ``database``, or ``None`` when it cannot be used (an in-memory
    store; it cannot be opened; not a regular file): the store then commits every call's
    rows before its handler, as it did without one.

    Raises:
        StoreError: another store holds the journal's lock (one store per file).
    """
    if database == ":memory:":
        return None
    path = Path(database + SUFFIX)
    try:
        journal = IntentJournal(path)
    except BlockingIOError:
        raise StoreError(
            f"{database}: in use by another store (it holds {path.name}); "
            "one store may write a SQLite file"
        ) from None
    except OSError as exc:
        logger.warning("%s: cannot open the intent journal (%s); calls commit instead", path, exc)
        return None
    if not stat.S_ISREG(os.fstat(journal.fileno()).st_mode):
        # A device or a FIFO is no journal (writes to /dev/null succeed and keep nothing).
        logger.warning("%s is not a regular file; calls commit their rows instead", path)
        journal.close()
        return None
    return journal


def open_replayed(
    database: str, db: sqlite3.Connection, since: float | None = None
) -> IntentJournal | None:
    """:func:`open_journal`, then :func:`replay` into ``db`` (the store's connection) of
    the entries created at or after ``since`` (Unix seconds; ``None``: all).

    Raises:
        StoreError: another store holds the journal, or the journaled calls cannot be
            put back now (the journal is closed).
    """
    journal = open_journal(database)
    if journal is not None:
        try:
            replay(journal, db, since)
        except BaseException:
            journal.close()
            raise
    return journal


def replay(journal: IntentJournal, db: sqlite3.Connection, since: float | None = None) -> None:
    """Put back the ``running`` rows of calls journaled but never committed (a crash
    between the append and the commit), then empty the journal. Run at open, before
    recovery reads the ``running`` rows: recovery ends those calls ``cancelled`` and a
    re-send never runs them (SPEC I15). A call whose ledger row the file has was
    committed (a spent entry): skipped; so is an entry created before ``since`` (the
    ledger's window: its call id is new again, and its call long ended or was purged).

    Raises:
        StoreError: the rows cannot be written now (locked, full, I/O error).
    """
    intents = [i for i in journal.read() if since is None or i.created_at >= since]
    if intents:
        try:
            # Start-up may wait on a lock, as the open did; the loop's connection never.
            db.execute("PRAGMA busy_timeout=5000")
            db.execute("BEGIN IMMEDIATE")
            put = sum(_put_back(db, intent) for intent in intents)
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise StoreError(f"{journal.path}: cannot put back its calls: {exc}") from exc
        finally:
            with contextlib.suppress(sqlite3.Error):
                db.execute("PRAGMA busy_timeout=0")
        if put:
            logger.info(
                "%s: %d journaled calls were never committed; put back as running",
                journal.path,
                put,
            )
    journal.clear()


def _put_back(db: sqlite3.Connection, intent: Intent) -> bool:
    key = (intent.tenant, intent.user, intent.call_id)
    found = db.execute(
        "SELECT created_at FROM call_ledger WHERE tenant=? AND user=? AND call_id=?", key
    ).fetchone()
    if found is not None and found[0] >= intent.created_at:
        return False  # this call's row (or a later one's) was committed: a spent entry
    # No row, or an older one: the key was used again after its window, before the
    # purge deleted the old row (SPEC I15), and this run was never committed.
    row = LedgerRow(*key, intent.tool, intent.params_hash, "running", None, intent.created_at)
    db.execute("INSERT OR REPLACE INTO call_ledger VALUES (?,?,?,?,?,?,?,?)", ledger_values(row))
    note = None if intent.note is None else intent.note.encode()
    # The call row only while its session lives (an ended session's rows are gone), and
    # never over a row the session already has (a recorded outcome stays, SPEC I12).
    db.execute(
        "INSERT OR IGNORE INTO calls (session_id, call_id, state, body) "
        "SELECT ?,?,'running',? WHERE EXISTS (SELECT 1 FROM sessions WHERE session_id=?)",
        (intent.session_id, intent.call_id, note, intent.session_id),
    )
    return True


class Intents:
    """A store's intent journal and the ``running`` rows it holds out of the store's
    batch (SPEC I15); all methods run on the event loop.

    Args:
        journal: the journal, or ``None`` (an in-memory store, or none usable): then
            nothing is journaled and nothing held.

    A held row and a staged row of the same key never coexist: :meth:`keep` moves the
    rows out of the batch, and staging a row of a held key drops the held one
    (:meth:`drop_ledger`, :meth:`drop_call`), so the call's later rows win.
    """

    def __init__(self, journal: IntentJournal | None) -> None:
        self.journal = journal
        self._ledger: dict[Key, LedgerRow] = {}
        self._calls: dict[tuple[str, str], tuple[str, str, str, bytes | None]] = {}

    def keep(self, batch: SqliteBatch, session_id: str, call_id: str, key: Key) -> bool:
        """Journal the call's staged ``running`` rows and hold them out of ``batch``;
        ``False`` (nothing changed) without a journal, a staged running ledger row, or
        when the append failed."""
        ledger = batch.ledger.get(key)
        if self.journal is None or ledger is None or ledger.state != "running":
            return False
        staged = batch.calls.get((session_id, call_id))
        if not self.journal.append(Intent.of(session_id, call_id, staged, ledger)):
            return False
        self._ledger[key] = batch.ledger.pop(key)
        if staged is not None and staged[2] == "running":
            self._calls[(session_id, call_id)] = batch.calls.pop((session_id, call_id))
        return True

    def durable(self, batch: SqliteBatch, key: Key) -> bool:
        """Whether the ledger row ``key`` survives a crash: held (journaled), or no longer
        staged, which only a commit that succeeded does (a failed one keeps the batch).
        Always ``False`` without a journal (the caller commits first, as before)."""
        return self.journal is not None and (key in self._ledger or key not in batch.ledger)

    def held_ledger(self, key: Key) -> LedgerRow | None:
        """The held ``running`` ledger row of ``key``, if it is held."""
        return self._ledger.get(key)

    def drop_ledger(self, key: Key) -> None:
        """A row of ``key`` was staged: it replaces the held one."""
        self._ledger.pop(key, None)

    def drop_call(self, session_id: str, call_id: str) -> None:
        """A call row was staged or forgotten: the held one must never be written."""
        self._calls.pop((session_id, call_id), None)

    def drop_session(self, session_id: str) -> None:
        """The session is deleted: its held call rows must never be written back (the
        replay puts back only the calls of sessions the file has)."""
        for held in [k for k in self._calls if k[0] == session_id]:
            del self._calls[held]

    def emptying(self, batch: SqliteBatch) -> bool:
        """Whether the commit of ``batch`` is to empty the journal: past
        :data:`JOURNAL_BYTES`, or a ledger purge (no entry outlives its ledger row)."""
        journal = self.journal
        return journal is not None and (
            batch.ledger_before is not None or journal.size >= JOURNAL_BYTES
        )

    def release(self, batch: SqliteBatch) -> None:
        """Stage every held row in ``batch`` again, for the commit that empties the
        journal (none has a staged row of its key)."""
        batch.ledger.update(self._ledger)
        batch.calls.update(self._calls)
        self._ledger, self._calls = {}, {}

    def emptied(self) -> None:
        """The commit after :meth:`release` succeeded: every entry's rows are in the
        file, so the journal is emptied."""
        if self.journal is not None:
            self.journal.clear()

    def close(self) -> None:
        """Close the journal (its entries stay for the next open); held rows are
        dropped with the store."""
        if self.journal is not None:
            self.journal.close()
            self.journal = None
