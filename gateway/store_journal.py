"""The journal of a SQLite store: a call's ``running`` rows, and each flush's writes,
made durable with one ``write(2)``, not a commit (SPEC I15, D1, D6; issue 13).

**Batch entries (SPEC D1).** A flush of the outbox
(:meth:`SqliteStore.journal <gateway.store.SqliteStore.journal>`) appends the writes
staged since the last flush or commit (events, call rows, ledger rows, job rows,
session rows and counters: :data:`_WRITES`) as one numbered line,
``{"gen": N, "writes": [...]}``, and sends its frames; the
commit of the file it owes runs later for every flush of that time
(:class:`~gateway.outbox.Outbox`, ``store.settle_after``), first thing in any read of
the file (:mod:`gateway.store_reads`), past :data:`JOURNAL_BYTES` and at a clean close,
and it empties the journal. A batch holding writes no entry carries (a deletion, a
purge) is committed instead, and so is every flush while the last commit failed (D6).
Entries are numbered; the commit that writes their rows records the last number in the
file (table ``journal_mark``) in the same transaction.
At open, the entries numbered past the mark (a crash before their commit) are written
first, in order; one the file already has (a crash after its commit, before the
truncate, or a truncate that failed) is skipped, and each write is guarded besides.
A SQLite commit of a sequential call's rows cost about 80 us of CPU on the loop; the
append costs a few (docs/bench.md).

**Intent entries (SPEC I15).**

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
a re-send again (SPEC I15). A store works without a journal when the journal does not
exist and cannot be created, is not a regular file (``/dev/null`` would keep nothing),
or after a truncate failed (it would only grow); then every flush commits, and every
call's rows are committed before its handler. A journal that exists and cannot be
opened stops the store (:class:`~gateway.store_check.StoreError`): it may hold sent
events and running calls the file lacks.
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

from gateway.records import record
from gateway.store_batch import SqliteBatch
from gateway.store_check import StoreError
from gateway.store_rows import LedgerRow, ledger_values
from protocol.codec import decode_json, encode_json

logger = logging.getLogger("gateway.store")

SUFFIX = "-intent"
"""The journal of ``toolbus.db`` is ``toolbus.db-intent``, beside its ``-wal`` file."""

JOURNAL_BYTES = 1024 * 1024
"""The journal is emptied by the first commit past this size (about 1,100 sequential
calls at about 950 bytes each, or 2,000 job ends), by every ledger purge and at a clean
close. Below it, journaled flushes are committed on the ``store.settle_after`` timer: a
burst of a thousand job ends (about 500 KB) is sent without a commit of its rows in the
middle of it (P5 measured 256 KiB: a 7 ms commit inside the burst, issue 13)."""

CHANGES_BYTES = 8 * JOURNAL_BYTES
"""Journal size past which a session change is no longer journaled while commits fail
(:meth:`Intents.session_change`): an outage of hours cannot grow it without bound; the
change is then refused ``unavailable`` (SPEC D6)."""

Key = tuple[str, str, str]
"""A ledger row's key: ``(tenant, user, call_id)``."""


@record
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

        ``False`` (the disk is full, an I/O error, a short write, which is cut off the
        file again): the caller must not count on it and commits the rows instead. A
        failure is logged once, until an append succeeds again.
        """
        return self.append_line(intent.encode())

    def append_line(self, line: bytes) -> bool:
        """Append one encoded entry (:meth:`Intent.encode`, :func:`encode_batch`);
        ``True`` once all of it is in the file, as :meth:`append`."""
        if self._broken:
            return False
        try:
            written = os.write(self._fd, line)
        except OSError as exc:
            self._failed(exc)
            return False
        if written != len(line):
            # A full disk: cut the torn entry off again, so that no part of an entry
            # the caller was told failed is ever read back (:meth:`read` also skips an
            # entry without its closing newline, should this truncate fail too).
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                self._size += written
            self._failed(OSError(f"short write, {written} of {len(line)} bytes"))
            return False
        self._size += written
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

    @property
    def usable(self) -> bool:
        """Whether the journal takes entries (no truncate failed)."""
        return not self._broken

    def read(self) -> list[Intent | Batch]:
        """Every whole entry in the file, in order: an :class:`Intent` or a
        :class:`Batch`; torn or foreign lines are skipped."""
        # Only the file's length: a journal that is a device (``/dev/full`` in a test of
        # a full disk) would read forever.
        data = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        found = []
        lines = data.split(b"\n")
        if lines.pop():
            # No closing newline: an append that failed part way (a full disk), which
            # its caller was told failed and made durable otherwise; never an entry.
            logger.warning("%s: skipped an unfinished intent journal entry", self.path)
        for line in lines:
            if not line:
                continue
            entry: Intent | Batch | None
            try:
                fields = decode_json(line)
                if isinstance(fields, dict):
                    entry = batch_entry(fields)
                else:
                    entry = Intent(*fields)
                    entry = entry if entry.well_formed() else None
            except (ValueError, TypeError, KeyError):  # not JSON, or not an entry's fields
                entry = None
            if entry is None:
                logger.warning("%s: skipped a torn intent journal entry", self.path)
                continue
            found.append(entry)
        return found

    def fileno(self) -> int:
        """The journal's file descriptor."""
        return self._fd

    def close(self) -> None:
        """Release the lock and the file (the kernel does both at exit too)."""
        with contextlib.suppress(OSError):
            os.close(self._fd)


def open_journal(database: str) -> IntentJournal | None:
    """The journal beside the file ``database`` names (a symbolic link resolved, as
    SQLite does for its WAL), or ``None`` when it cannot be used (an in-memory store; it
    does not exist and cannot be created; not a regular file): the store then commits
    every flush and every call's rows before its handler.

    Raises:
        StoreError: another store holds the journal's lock (one store per file, through
            whatever symbolic link it was opened; a hard link is not seen, and SQLite
            does not support one either), the journal exists and cannot be opened (it
            may hold what the file lacks), or ``database`` is a link with a journal of
            entries beside it.
    """
    if database == ":memory:":
        return None
    # Named after the file itself, as SQLite names its WAL: two paths to one database
    # (a symbolic link) share one journal and its lock, so a second store is refused.
    path = Path(os.path.realpath(database) + SUFFIX)
    if _left_beside_a_link(database + SUFFIX, path):
        # Where an earlier release kept it: it may hold sent events the file lacks, so
        # the store does not open without it (SPEC D6).
        raise StoreError(
            f"{database + SUFFIX}: a journal beside the link {database}; the store keeps "
            f"its journal beside the file the link names ({path}): move it there"
        )
    try:
        journal = IntentJournal(path)
    except BlockingIOError:
        raise StoreError(
            f"{database}: in use by another store (it holds {path.name}); "
            "one store may write a SQLite file"
        ) from None
    except OSError as exc:
        if path.exists() or path.is_symlink():
            # It may hold sent events and running calls the file lacks (SPEC D1, I15):
            # opening the store without them would lose a sent result and run a re-sent
            # call again. Fail closed (SPEC D6).
            raise StoreError(
                f"{path}: cannot open the store's journal ({exc}); it may hold sent "
                "events and running calls the database lacks, so the store does not open "
                "without it"
            ) from exc
        logger.warning("%s: cannot create the journal (%s); calls commit instead", path, exc)
        return None
    if not stat.S_ISREG(os.fstat(journal.fileno()).st_mode):
        # A device or a FIFO is no journal (writes to /dev/null succeed and keep nothing).
        logger.warning("%s is not a regular file; calls commit their rows instead", path)
        journal.close()
        return None
    return journal


def open_replayed(database: str, db: sqlite3.Connection, since: float | None = None) -> Intents:
    """:func:`open_journal`, then :func:`replay` into ``db`` (the store's connection) of
    the intent entries created at or after ``since`` (Unix seconds; ``None``: all) and
    the batch entries the file does not have; the journal as :class:`Intents`.

    Raises:
        StoreError: another store holds the journal, or the journaled calls cannot be
            put back now (the journal is closed).
    """
    journal = open_journal(database)
    generation = 0
    if journal is not None:
        try:
            generation = replay(journal, db, since)
        except BaseException:
            journal.close()
            raise
    return Intents(journal, generation)


def _left_beside_a_link(given: str, path: Path) -> bool:
    """Whether ``given`` (the database path as given, plus the suffix) is a journal with
    entries other than ``path``: a regular file, not empty, that the kernel finds
    elsewhere (each path resolved as the kernel does, links before ``..``)."""
    if os.path.realpath(given) == os.path.realpath(path):
        return False
    try:
        found = os.stat(given)
    except OSError:
        return False  # none there (or a dangling link): nothing is held
    return stat.S_ISREG(found.st_mode) and found.st_size > 0


_WRITES = {"e": 3, "q": 4, "c": 4, "f": 2, "l": 8, "j": 17, "s": 15, "a": 4, "d": 1}
"""A batch entry's writes by kind, with their number of values:
``["e", session_id, seq, body]`` an event; ``["q", session_id, last_seq, acked_seq,
floor_seq]`` a session's counters; ``["c", session_id, call_id, state, body]`` a call
row; ``["f", session_id, call_id]`` a forgotten call row; ``["l", tenant, user,
call_id, tool, params_hash, state, outcome, created_at]`` a ledger row; ``["j", ...]``
a job row, the 17 ``jobs`` columns in their order (:func:`gateway.store_rows.job_values`);
``["s", ...]`` a session row, the 15 ``sessions`` columns in their order
(:func:`gateway.store_rows.session_values`); ``["a", session_id, context, grants,
credential_ref]`` a session's context, grants (JSON text) and credential reference
alone, and ``["d", session_id]`` a session ended for good
(:meth:`Intents.session_change`: journaled even while commits fail). Bodies and JSON
columns are text (the bytes are UTF-8 JSON from :mod:`protocol.codec`)."""

_JOB_JSON = (8, 9, 14, 15, 16)
"""The ``jobs`` columns (0-based) that hold JSON bytes: params, context, artifacts,
result, error."""

_SESSION_JSON = (5, 6, 7)
"""The ``sessions`` columns (0-based) that hold JSON bytes: context, options, grants."""

_SESSION_UPSERT = (
    f"INSERT INTO sessions VALUES ({','.join('?' * 15)}) ON CONFLICT (session_id) DO UPDATE "
    "SET token_hash=excluded.token_hash, user=excluded.user, tenant=excluded.tenant, "
    "profile=excluded.profile, context=excluded.context, options=excluded.options, "
    "grants=excluded.grants, last_seq=MAX(last_seq, excluded.last_seq), "
    "acked_seq=MAX(acked_seq, excluded.acked_seq), "
    "floor_seq=MAX(floor_seq, excluded.floor_seq), created_at=excluded.created_at, "
    "expires_at=excluded.expires_at, catalog_version=excluded.catalog_version, "
    "credential_ref=excluded.credential_ref"
)
"""A journaled session row written back: the entry's columns, its counters only forward."""

_JOB_RANK = "CASE {} WHEN 'queued' THEN 0 WHEN 'running' THEN 1 ELSE 2 END"
"""A job state's place in its one-way order: queued, running, ended (SPEC J1)."""


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch entry read back: its ``generation`` (the store numbers its entries; the
    commit that writes an entry's rows records the number in the file, table
    ``journal_mark``) and its ``writes`` (:data:`_WRITES`)."""

    generation: int
    writes: list[Any]


def encode_batch(generation: int, writes: list[tuple[Any, ...]]) -> bytes:
    """Batch entry number ``generation`` as one journal line, newline on both sides.

    Raises:
        TypeError: a value JSON cannot carry (the caller commits instead).
    """
    return b"\n" + encode_json({"gen": generation, "writes": writes}) + b"\n"


def batch_entry(fields: dict[str, Any]) -> Batch | None:
    """A batch entry read back, or ``None`` when ``fields`` is not one."""
    generation, writes = fields["gen"], fields["writes"]
    if not isinstance(generation, int) or isinstance(generation, bool):
        return None
    if not isinstance(writes, list):
        return None
    for write in writes:
        if not (
            isinstance(write, list)
            and write
            and _WRITES.get(write[0]) == len(write) - 1
            and all(v is None or isinstance(v, str | int | float) for v in write[1:])
        ):
            return None
    return Batch(generation, writes)


def _text(body: bytes | None) -> str | None:
    return None if body is None else body.decode("utf-8", "surrogateescape")


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8", "surrogateescape")


def _apply(db: sqlite3.Connection, writes: list[Any]) -> None:
    """Write a batch entry's writes in the order they were staged. Each is guarded so
    that an entry the file already has (a crash after its commit, before the truncate)
    changes nothing: no event of a session the file lacks or at or below its floor, no
    ledger row over a newer one, no ``running`` row over an ended one of the same call,
    counters only forward, no job row back to an earlier state (queued, running,
    ended)."""
    for kind, *v in writes:
        if kind == "e":
            db.execute(
                "INSERT OR IGNORE INTO events (session_id, seq, body) SELECT ?,?,? WHERE EXISTS "
                "(SELECT 1 FROM sessions WHERE session_id=? AND floor_seq<?)",
                (v[0], v[1], _bytes(v[2]), v[0], v[1]),
            )
        elif kind == "q":
            db.execute(
                "UPDATE sessions SET last_seq=MAX(last_seq,?), acked_seq=MAX(acked_seq,?), "
                "floor_seq=MAX(floor_seq,?) WHERE session_id=?",
                (v[1], v[2], v[3], v[0]),
            )
            db.execute("DELETE FROM events WHERE session_id=? AND seq<=?", (v[0], v[3]))
        elif kind == "c":
            db.execute(
                "INSERT OR REPLACE INTO calls (session_id, call_id, state, body) SELECT ?,?,?,? "
                "WHERE EXISTS (SELECT 1 FROM sessions WHERE session_id=?) AND NOT (?='running' "
                "AND EXISTS (SELECT 1 FROM calls WHERE session_id=? AND call_id=? "
                "AND state='done'))",
                (v[0], v[1], v[2], _bytes(v[3]), v[0], v[2], v[0], v[1]),
            )
        elif kind == "f":
            db.execute("DELETE FROM calls WHERE session_id=? AND call_id=?", (v[0], v[1]))
        elif kind == "s":
            db.execute(
                _SESSION_UPSERT, [_bytes(x) if i in _SESSION_JSON else x for i, x in enumerate(v)]
            )
        elif kind == "a":
            db.execute(
                "UPDATE sessions SET context=?, grants=?, credential_ref=? WHERE session_id=?",
                (_bytes(v[1]), _bytes(v[2]), v[3], v[0]),
            )
        elif kind == "d":
            for table in ("sessions", "events", "calls"):
                db.execute(f"DELETE FROM {table} WHERE session_id=?", (v[0],))
        elif kind == "j":
            values = [_bytes(x) if i in _JOB_JSON else x for i, x in enumerate(v)]
            db.execute(
                f"INSERT OR REPLACE INTO jobs SELECT {','.join('?' * 17)} WHERE NOT EXISTS "
                f"(SELECT 1 FROM jobs WHERE job_id=? AND {_JOB_RANK.format('state')} > "
                f"{_JOB_RANK.format('?')})",
                (*values, v[0], v[2]),
            )
        else:
            key, state, outcome, created_at = v[:3], v[5], v[6], v[7]
            db.execute(
                "INSERT OR REPLACE INTO call_ledger SELECT ?,?,?,?,?,?,?,? WHERE NOT EXISTS "
                "(SELECT 1 FROM call_ledger WHERE tenant=? AND user=? AND call_id=? "
                "AND (created_at>? OR (created_at=? AND ?='running' AND state!='running')))",
                (*v[:6], _bytes(outcome), created_at, *key, created_at, created_at, state),
            )


def replay(journal: IntentJournal, db: sqlite3.Connection, since: float | None = None) -> int:
    """Put back the ``running`` rows of calls journaled but never committed (a crash
    between the append and the commit), then empty the journal. Run at open, before
    recovery reads the ``running`` rows: recovery ends those calls ``cancelled`` and a
    re-send never runs them (SPEC I15). A call whose ledger row the file has was
    committed (a spent entry): skipped; so is an entry created before ``since`` (the
    ledger's window: its call id is new again, and its call long ended or was purged).

    Batch entries (writes journaled instead of committed, SPEC D1) are written first, in
    order: their events were sent, so they are durable. Only those numbered past the
    file's ``journal_mark``: a commit that wrote an entry's rows recorded its number in
    the same transaction, so an entry left by a crash before the truncate, or by a
    truncate that failed, is never written twice over newer rows.

    Returns:
        The number of the last batch entry the file has (the store numbers on from it).

    Raises:
        StoreError: the rows cannot be written now (locked, full, I/O error).
    """
    entries = journal.read()
    try:
        found = db.execute("SELECT generation FROM journal_mark WHERE id=1").fetchone()
    except sqlite3.Error as exc:
        raise StoreError(f"{journal.path}: cannot read the journal's mark: {exc}") from exc
    mark = 0 if found is None else int(found[0])
    batches = [e for e in entries if isinstance(e, Batch) and e.generation > mark]
    intents = [
        entry
        for entry in entries
        if isinstance(entry, Intent) and (since is None or entry.created_at >= since)
    ]
    if intents or batches:
        try:
            # Start-up may wait on a lock, as the open did; the loop's connection never.
            db.execute("PRAGMA busy_timeout=5000")
            db.execute("BEGIN IMMEDIATE")
            for batch in batches:
                _apply(db, batch.writes)
            if batches:
                mark = max(batch.generation for batch in batches)
                db.execute("INSERT OR REPLACE INTO journal_mark VALUES (1, ?)", (mark,))
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
        if batches:
            logger.info("%s: %d journaled batches written", journal.path, len(batches))
        if put:
            logger.info(
                "%s: %d journaled calls were never committed; put back as running",
                journal.path,
                put,
            )
    journal.clear()
    return mark


def _put_back(db: sqlite3.Connection, intent: Intent) -> bool:
    key = (intent.tenant, intent.user, intent.call_id)
    found = db.execute(
        "SELECT created_at, state FROM call_ledger WHERE tenant=? AND user=? AND call_id=?", key
    ).fetchone()
    if found is not None and (
        found[0] > intent.created_at or (found[0] == intent.created_at and found[1] != "running")
    ):
        return False  # this call's end (or a later call's row) was committed: spent
    if found is None or found[0] < intent.created_at:
        # No row, or an older one: the key was used again after its window, before the
        # purge deleted the old row (SPEC I15), and this run was never committed.
        row = LedgerRow(*key, intent.tool, intent.params_hash, "running", None, intent.created_at)
        db.execute(
            "INSERT OR REPLACE INTO call_ledger VALUES (?,?,?,?,?,?,?,?)", ledger_values(row)
        )
    # Else this call's own ``running`` row, staged again while it ran (its wait for a
    # worker thread, or its start after it, SPEC J6) and written by a batch entry: it
    # stays, but the call row the entry never carried (it stayed held) is put back, or
    # the resumed session would never get the call's end (SPEC I12, D3).
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
    (:meth:`staged_ledger`, :meth:`staged_call`, :meth:`forgotten`), so the call's later
    rows win.
    """

    def __init__(self, journal: IntentJournal | None, generation: int = 0) -> None:
        self.journal = journal
        self._generation = generation
        """The number of the last batch entry appended (or found in the file)."""
        self._ledger: dict[Key, LedgerRow] = {}
        self._calls: dict[tuple[str, str], tuple[str, str, str, bytes | None]] = {}
        self._writes: list[tuple[Any, ...]] = []
        """Writes staged since the last commit and not journaled yet (:data:`_WRITES`)."""
        self.owed = False
        """Writes are journaled that the file does not have yet: the next commit (an
        emptying one) owes them."""

    def staged_event(self, session_id: str, seq: int, body: bytes) -> None:
        """An event was staged."""
        if self.journal is not None:
            self._writes.append(("e", session_id, seq, _text(body)))

    def staged_seq(self, session_id: str, last: int, acked: int, floor: int) -> None:
        """A session's counters were staged."""
        if self.journal is not None:
            self._writes.append(("q", session_id, last, acked, floor))

    def staged_call(self, session_id: str, call_id: str, state: str, body: bytes | None) -> None:
        """A call row was staged: it replaces a held one."""
        self._calls.pop((session_id, call_id), None)
        if self.journal is not None:
            self._writes.append(("c", session_id, call_id, state, _text(body)))

    def forgotten(self, session_id: str, call_id: str) -> None:
        """A call row was forgotten: a held one must never be written."""
        self._calls.pop((session_id, call_id), None)
        if self.journal is not None:
            self._writes.append(("f", session_id, call_id))

    def staged_session(self, values: tuple[Any, ...]) -> None:
        """A session row was staged (its ``sessions`` column values, JSON columns as
        bytes)."""
        if self.journal is not None:
            self._writes.append(("s", *(_text(v) if isinstance(v, bytes) else v for v in values)))

    def staged_job(self, values: tuple[Any, ...]) -> None:
        """A job row was staged (its ``jobs`` column values, JSON columns as bytes)."""
        if self.journal is not None:
            self._writes.append(("j", *(_text(v) if isinstance(v, bytes) else v for v in values)))

    def staged_ledger(self, key: Key, row: LedgerRow) -> None:
        """A ledger row of ``key`` was staged: it replaces the held one."""
        self._ledger.pop(key, None)
        if self.journal is not None:
            tail = (row.tool, row.params_hash, row.state, _text(row.outcome), row.created_at)
            self._writes.append(("l", *key, *tail))

    def log(self, batch: SqliteBatch) -> bool:
        """Journal the writes staged since the last commit or log, in one append (SPEC
        D1, D6): ``True`` when everything staged in ``batch`` is durable now, the file's
        commit owed (:attr:`owed`). ``False`` without a usable journal, past
        :data:`JOURNAL_BYTES`, when ``batch`` holds writes a batch entry does not carry
        (deletions, purges), or when the append failed (then the next commit is an
        emptying one): the caller commits."""
        journal = self.journal
        if (
            journal is None
            or not journal.usable
            or journal.size >= JOURNAL_BYTES
            or batch.deletes
            or batch.purged
            or batch.ledger_before is not None
            or batch.purge_before is not None
        ):
            return False
        if self._writes:
            try:
                line = encode_batch(self._generation + 1, self._writes)
            except TypeError:
                return False
            self._generation += 1  # a failed append may leave a torn line of this number
            if not journal.append_line(line):
                # A short write whose truncate failed too may have left the line whole
                # but for its newline: the commit that follows records this number and
                # empties the journal.
                self.owed = True
                return False
            self._writes = []
            self.owed = True
        return True

    def session_change(self, write: tuple[Any, ...]) -> bool:
        """Journal one session change the client is told of (SPEC A3, S5, S6, D2, D6)
        in an entry of its own: ``("a", session_id, context, grants, credential_ref)``
        (JSON bytes, then text) or ``("d", session_id)`` (:data:`_WRITES`). ``True``
        once it is in the file, the commit owed.

        Unlike :meth:`log`, also while commits fail: these columns, and the end of a
        session, depend on no other write, so the entry holds whatever was staged and
        lost before it. The rows it changes stay staged (the batch, and :attr:`_writes`
        for the next entry), and an entry after it that carries the session's row
        carries the same values. ``False`` without a usable journal, past
        :data:`CHANGES_BYTES`, or when the append failed (the caller then answers
        ``unavailable``, SPEC D6).
        """
        journal = self.journal
        if journal is None or not journal.usable or journal.size >= CHANGES_BYTES:
            return False
        encoded = tuple(_text(v) if isinstance(v, bytes) else v for v in write)
        line = encode_batch(self._generation + 1, [encoded])
        self._generation += 1
        self.owed = True  # a torn line of this number may be whole (as in log)
        return journal.append_line(line)

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
        # Their writes, just staged, leave the next batch entry too: the intent carries
        # them (the replay puts back intents after the batch entries).
        writes = self._writes
        while writes and (
            (writes[-1][0] == "l" and writes[-1][1:4] == key)
            or (writes[-1][0] == "c" and writes[-1][1:4] == (session_id, call_id, "running"))
        ):
            writes.pop()
        return True

    def durable(self, batch: SqliteBatch, key: Key) -> bool:
        """Whether the ledger row ``key`` survives a crash: held (journaled), or no longer
        staged, which only a commit that succeeded does (a failed one keeps the batch).
        Always ``False`` without a journal (the caller commits first, as before)."""
        return self.journal is not None and (key in self._ledger or key not in batch.ledger)

    def held_ledger(self, key: Key) -> LedgerRow | None:
        """The held ``running`` ledger row of ``key``, if it is held."""
        return self._ledger.get(key)

    def drop_session(self, session_id: str) -> None:
        """The session is deleted: its held call rows must never be written back (the
        replay puts back only the calls of sessions the file has)."""
        for held in [k for k in self._calls if k[0] == session_id]:
            del self._calls[held]

    def emptying(self, batch: SqliteBatch) -> bool:
        """Whether the commit of ``batch`` is to empty the journal: it owes journaled
        writes (after it no batch entry may be applied again), past
        :data:`JOURNAL_BYTES`, or a ledger purge (no entry outlives its ledger row)."""
        journal = self.journal
        return journal is not None and (
            self.owed or batch.ledger_before is not None or journal.size >= JOURNAL_BYTES
        )

    def release(self, batch: SqliteBatch) -> None:
        """Stage every held row in ``batch`` again, for the commit that empties the
        journal (none has a staged row of its key), and the number of the last batch
        entry, which that commit records (:func:`replay` skips the entries it has)."""
        if self.owed:
            batch.journal_mark = self._generation
        batch.ledger.update(self._ledger)
        batch.calls.update(self._calls)
        self._ledger, self._calls = {}, {}

    def committed(self, emptying: bool) -> None:
        """A commit succeeded: the staged writes are in the file. With ``emptying`` (it
        followed :meth:`release`) every entry's rows are too, so the journal is emptied."""
        self._writes = []
        if emptying and self.journal is not None:
            self.journal.clear()
            self.owed = False

    def close(self) -> None:
        """Close the journal (its entries stay for the next open); held rows are
        dropped with the store."""
        if self.journal is not None:
            self.journal.close()
            self.journal = None
