"""The store file's check at open (SPEC D6, O5; case F32).

:func:`open_checked` opens the SQLite file of :class:`gateway.store.SqliteStore` and
refuses a damaged one with :class:`StoreDamaged`, one line naming the file, the damage
and how to start fresh on purpose: a 0-byte file (truncated; SQLite would take it for a
new, empty store), ``PRAGMA quick_check`` failing, a ``user_version`` newer than
:data:`SCHEMA_VERSION`, a table of version 1 missing, or a table's columns differing
from the schema's. A store without a version (written before versions) is adopted; an
older one first gets the additive :data:`MIGRATIONS` it lacks (2: ``credential_ref``).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

SCHEMA_VERSION = 2
"""``PRAGMA user_version`` of a store this code writes; a file with a newer one is refused."""

MIGRATIONS: tuple[tuple[int, str, str, str], ...] = (
    # SPEC S6, A7: the session's credential reference (never the credential), so that a
    # session a restart brought back is re-validated before anything of it runs.
    (2, "sessions", "credential_ref", "ALTER TABLE sessions ADD COLUMN credential_ref TEXT"),
)
"""Additive changes since version 1, ``(version, table, column, sql)`` in order; a file
older than ``version`` whose ``table`` lacks ``column`` gets ``sql`` at open. Released
entries are never edited; a change is a new entry at the end."""


class StoreError(Exception):
    """Root of the store's typed faults (SPEC D6)."""


class StoreDamaged(StoreError):
    """The store file failed its check at open (SPEC D6, O5, case F32). The message is one
    line naming the file, the damage and how to start fresh on purpose."""


class StoreUnavailable(StoreError):
    """A commit or read could not be done now: the file is locked or busy, the disk is
    full, or an I/O error occurred (SPEC D6). Nothing of a failed commit is durable and
    everything it held stays staged for the next attempt."""


_CORE_TABLES = ("sessions", "events", "calls", "jobs")
"""Tables every store since schema version 1 has; one missing means damage."""


def _damaged(path: str, damage: str) -> StoreDamaged:
    return StoreDamaged(
        f"{path}: the store is damaged ({damage}); refusing to start rather than drop its "
        f"sessions and jobs silently. To start fresh on purpose, move {path} and its "
        f"-wal, -shm and -intent files away (their sessions, jobs and event logs are then "
        f"gone)."
    )


def open_checked(path: str, schema: str) -> sqlite3.Connection:
    """Open the store, check it (SPEC D6, O5, case F32) and bring its schema up to date.

    Raises:
        StoreDamaged: the file is empty, fails ``PRAGMA quick_check``, has a newer schema
            version, or misses a table or a column.
        StoreError: the file cannot be opened for another reason (permissions, locked).
    """
    existed = path != ":memory:" and Path(path).exists()
    if existed and Path(path).stat().st_size == 0:
        raise _damaged(path, "the file is empty (0 bytes): it was truncated")
    # Start-up may wait on a lock (nothing is served yet); the loop's connection never.
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
    try:
        if existed:
            _check_file(db, path, schema)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(schema)
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        db.execute("PRAGMA busy_timeout=0")
    except sqlite3.Error as exc:
        db.close()
        if _is_damage(exc):
            raise _damaged(path, str(exc)) from exc
        # Locked past the 5 s wait, busy, unreadable, full: the file may be whole, so
        # never the damage message (it advises moving the file away).
        raise StoreError(f"{path}: cannot open the store: {exc}") from exc
    except StoreError:
        db.close()
        raise
    return db


def check_only(path: str, schema: str) -> None:
    """``toolbus check``'s look at the store file (SPEC O5, D6, case F32), writing
    nothing: the checks of :func:`open_checked` on a read-only connection (SQLite adds
    no -wal and -shm files unless a process has the store open). A missing file passes
    (``serve`` creates it), so does one that only lacks the columns :data:`MIGRATIONS`
    add at open.

    Raises:
        StoreDamaged: as :func:`open_checked`.
        StoreError: the file cannot be read (permissions, locked past 5 s, a folder).
    """
    file = Path(path)
    if not file.exists():
        return
    if file.is_file() and file.stat().st_size == 0:
        raise _damaged(path, "the file is empty (0 bytes): it was truncated")
    # Without a -wal file no process has the store open (WAL mode keeps one while any
    # does): read it as immutable, so SQLite creates no -wal and -shm files for a reader.
    live = Path(f"{path}-wal").exists()
    query = "mode=ro" if live else "mode=ro&immutable=1"
    try:
        db = sqlite3.connect(f"{file.resolve().as_uri()}?{query}", uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot open the store: {exc}") from exc
    try:
        _check_file(db, path, schema, migrate=False)
    except sqlite3.Error as exc:
        if _is_damage(exc):
            raise _damaged(path, str(exc)) from exc
        raise StoreError(f"{path}: cannot open the store: {exc}") from exc
    finally:
        db.close()


def _is_damage(exc: sqlite3.Error) -> bool:
    """Whether SQLite's error says the file itself is damaged (``SQLITE_CORRUPT``,
    ``SQLITE_NOTADB``, with their extended codes), not locked, busy or unreadable."""
    name = getattr(exc, "sqlite_errorname", "")
    return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))


def _check_file(db: sqlite3.Connection, path: str, schema: str, migrate: bool = True) -> None:
    """Integrity, schema version and columns of an existing store file; ``migrate``:
    apply the :data:`MIGRATIONS` it lacks (else a column they would add may be missing)."""
    problems = [row[0] for row in db.execute("PRAGMA quick_check(3)")]
    if problems != ["ok"]:
        raise _damaged(path, "integrity check: " + "; ".join(problems))
    (version,) = db.execute("PRAGMA user_version").fetchone()
    if version > SCHEMA_VERSION:
        raise _damaged(
            path, f"schema version {version} is newer than this toolbus's {SCHEMA_VERSION}"
        )
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables and version == 0:
        return  # a store created but never written
    missing = [name for name in _CORE_TABLES if name not in tables]
    if missing:
        raise _damaged(path, f"table(s) {', '.join(missing)} missing from the schema")
    added: set[tuple[str, str]] = set()
    if migrate:
        _migrate(db, version)
    else:
        added = {(table, column) for since, table, column, _ in MIGRATIONS if version < since}
    reference = sqlite3.connect(":memory:")
    try:
        reference.executescript(schema)
        for (name,) in reference.execute("SELECT name FROM sqlite_master WHERE type='table'"):
            if name not in tables:
                continue  # added since this file was written; created below
            want = [row[1] for row in reference.execute(f"PRAGMA table_info({name})")]
            have = [row[1] for row in db.execute(f"PRAGMA table_info({name})")]
            if have != want and have != [c for c in want if (name, c) not in added]:
                raise _damaged(path, f"table {name} has columns {have}, expected {want}")
    finally:
        reference.close()


def _migrate(db: sqlite3.Connection, version: int) -> None:
    """Apply the additive :data:`MIGRATIONS` a file of schema ``version`` lacks (SPEC D6)."""
    for since, table, column, sql in MIGRATIONS:
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if version < since and column not in have:
            db.execute(sql)
