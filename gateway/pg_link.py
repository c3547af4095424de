"""The PostgreSQL store's connection (SPEC N1, D6, N7).

:class:`PgLink` opens the connection at start (and migrates the schema), bounds every
wait of the event loop, and reconnects off the loop. Each statement is bounded by
``statement_timeout`` (:data:`STATEMENT_TIMEOUT_MS`), a lock wait by ``lock_timeout``
(:data:`LOCK_TIMEOUT_MS`), and a silent network by ``tcp_user_timeout``. A lost
connection is never re-opened on the loop: the failing call raises ``StoreUnavailable``
at once and a background thread connects again (libpq counts its connect timeout in
whole seconds).

Durability: the connection runs with ``synchronous_commit=off`` unless the URL's
``options`` set it. A commit then returns once PostgreSQL has it, without waiting for
the WAL flush (7-9 ms per commit measured on this project's machines, all of it on the
event loop; docs/deploy.md). It is the SQLite store's trade-off (``synchronous=NORMAL``):
a toolbus crash loses nothing, a crash of the database server itself may lose its last
fraction of a second of commits. ``options=-csynchronous_commit%3Don`` in the URL buys
full durability at that price.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from gateway.pg_schema import SCHEMA_VERSION, migrate
from gateway.store import StoreError, StoreUnavailable

logger = logging.getLogger("gateway.pg_link")

STATEMENT_TIMEOUT_MS = 2000
"""Longest wait, in milliseconds, of one statement (and of unacknowledged data on the
socket) before it fails ``StoreUnavailable`` (SPEC D6): the loop's worst stall."""

LOCK_TIMEOUT_MS = 100
"""Longest wait, in milliseconds, for a row or table lock someone else holds (an operator's
``LOCK TABLE``, a long maintenance statement): the commit then fails and the outbox
retries on its timer, as the SQLite store does with a locked file (SPEC D6)."""

CONNECT_TIMEOUT_S = 5
"""Seconds a connection attempt may take (libpq counts whole seconds; at start-up, or
on the reconnecting thread, never on the event loop)."""

_Conn = psycopg.Connection[tuple[Any, ...]]


def _usable(db: _Conn) -> bool:
    """Whether ``db`` can run the store's next statement: open, not broken, and not
    still busy with a command (the store runs one at a time, on the loop)."""
    return (
        not db.broken
        and not db.closed
        and db.info.transaction_status is not psycopg.pq.TransactionStatus.ACTIVE
    )


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    params = conninfo_to_dict(url)
    params.pop("password", None)
    return make_conninfo("", **params)


def _conninfo(url: str) -> str:
    """``url`` with the timeouts that bound every wait of the loop (SPEC D6) and, unless
    the URL's ``options`` set it, ``synchronous_commit=off`` (see the module docstring)."""
    params = conninfo_to_dict(url)
    extra = f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c lock_timeout={LOCK_TIMEOUT_MS}"
    if "synchronous_commit" not in str(params.get("options") or ""):
        extra += " -c synchronous_commit=off"
    params["options"] = f"{params.get('options') or ''} {extra}".strip()
    params.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    params.setdefault("tcp_user_timeout", STATEMENT_TIMEOUT_MS)
    params.setdefault("application_name", "toolbus")
    return make_conninfo("", **params)


def _line(exc: BaseException) -> str:
    """``exc`` as one line: libpq's messages span several (SPEC O5: one line at start)."""
    return " ".join(str(exc).split())


def _search_path(db: _Conn) -> str:
    """The connection's ``search_path`` setting, for a message ("?" when unreadable)."""
    try:
        row = db.execute("SHOW search_path").fetchone()
    except psycopg.Error:
        return "?"
    return str(row[0]) if row else "?"


def probe(url: str) -> str | None:
    """``toolbus check``'s look at the database ``store.url`` names (SPEC O5, N1), writing
    nothing: ``None`` when ``serve`` could open it, else one line saying why not: it does
    not answer (or refuses the login, or the database does not exist), no schema of its
    ``search_path`` exists, or the store's schema version is newer than this toolbus's.
    A database without toolbus's tables is fine (``serve`` creates them)."""
    where = redact(url)
    try:
        db = psycopg.connect(_conninfo(url), autocommit=True)
    except psycopg.Error as exc:
        return f"store {where}: cannot connect: {_line(exc)}"
    try:
        schema = db.execute("SELECT current_schema()").fetchone()
        if not (schema and schema[0]):
            return (
                f"store {where}: no schema of its search_path ({_search_path(db)}) exists; "
                f"create it first (CREATE SCHEMA ...) or fix options=-csearch_path in store.url"
            )
        row = db.execute("SELECT to_regclass('toolbus_schema') IS NOT NULL").fetchone()
        if not (row and row[0]):
            return None
        version = db.execute("SELECT max(version) FROM toolbus_schema").fetchone()
        current = int(version[0]) if version and version[0] is not None else 0
    except psycopg.Error as exc:
        return f"store {where}: cannot read the schema version: {_line(exc)}"
    finally:
        db.close()
    if current > SCHEMA_VERSION:
        return (
            f"store {where}: database schema version {current} is newer than this "
            f"toolbus's {SCHEMA_VERSION}; run the newer toolbus, or point store.url at "
            f"another database"
        )
    return None


class PgLink:
    """One connection of a store (SPEC N1, D6). Several nodes share one store (SPEC N2):
    sessions move between them under a fencing token (:mod:`gateway.nodes`).

    Args:
        url: a ``postgresql://`` URL (libpq syntax).

    Raises:
        StoreError: the database cannot be reached, has no schema of the URL's
            ``search_path``, or refused the migration.
        SchemaTooNew: the database schema is newer than this code.
    """

    def __init__(self, url: str) -> None:
        self.where = redact(url)
        self._conninfo = _conninfo(url)
        try:
            db = psycopg.connect(self._conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise StoreError(f"store {self.where}: cannot connect: {_line(exc)}") from exc
        try:
            applied = migrate(db, self.where)
        except psycopg.errors.InvalidSchemaName as exc:
            path = _search_path(db)
            db.close()
            raise StoreError(
                f"store {self.where}: no schema of its search_path ({path}) exists; create "
                f"it first (CREATE SCHEMA ...) or fix options=-csearch_path in store.url"
            ) from exc
        except psycopg.Error as exc:
            db.close()
            raise StoreError(f"store {self.where}: migration failed: {_line(exc)}") from exc
        except StoreError:
            db.close()
            raise
        if applied:
            logger.info("store %s: schema migrated to version %d", self.where, applied[-1])
        self._db: _Conn | None = db
        self._lock = threading.Lock()
        self._connecting = False
        self._closed = False

    @property
    def conninfo(self) -> str:
        """The connection string, timeouts included, for another connection of this
        store (the node's lease and notification thread, SPEC N4)."""
        return self._conninfo

    def conn(self) -> _Conn:
        """The live connection, or ``StoreUnavailable`` at once while there is none (a
        thread is then connecting again; the loop never waits for it, SPEC D6).

        A connection that libpq says still runs a command between two of the store's
        (transaction status ``ACTIVE``: a result never read) is as good as lost: every
        statement on it would fail "another command is already in progress" and, the
        connection not being broken, none would ever reconnect. It is closed and
        replaced, as a broken one is (:func:`_usable`)."""
        db = self._db
        if db is not None and _usable(db):
            return db
        self._drop()
        raise StoreUnavailable(f"store {self.where}: not connected; reconnecting")

    def _drop(self) -> None:
        """Close the connection (if it is still open) and connect again on a thread."""
        db, self._db = self._db, None
        if db is not None and not db.closed:
            try:
                db.close()
            except psycopg.Error as exc:
                logger.debug("store %s: closing a lost connection: %s", self.where, exc)
        if not self._closed:
            self._reconnect_soon()

    def _reconnect_soon(self) -> None:
        with self._lock:
            if self._connecting:
                return
            self._connecting = True
        threading.Thread(target=self._reconnect, name="toolbus-pg-connect", daemon=True).start()

    def _reconnect(self) -> None:
        db: _Conn | None = None
        try:
            db = psycopg.connect(self._conninfo, autocommit=True)
        except psycopg.Error as exc:
            logger.warning("store %s: reconnect failed: %s", self.where, _line(exc))
            db = None
        finally:
            with self._lock:
                self._connecting = False
                if db is not None and self._closed:
                    db.close()  # closed meanwhile
                elif db is not None:
                    self._db = db
                    logger.warning("store %s: connected again", self.where)

    def failed(self, exc: psycopg.Error, doing: str) -> StoreUnavailable:
        """The ``StoreUnavailable`` to raise for ``exc``; a broken connection is dropped
        and a reconnection started (SPEC D6, N7)."""
        db = self._db
        if db is not None and not _usable(db):
            self._drop()
        return StoreUnavailable(f"store {self.where}: {doing} failed: {_line(exc)}")

    def read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of one committed read; ``StoreUnavailable`` when it cannot be done now."""
        db = self.conn()
        try:
            return db.execute(sql, args).fetchall()
        except psycopg.Error as exc:
            raise self.failed(exc, "read") from exc

    def execute(self, sql: str, args: tuple[Any, ...]) -> None:
        """Run one statement in its own transaction; ``StoreUnavailable`` on failure."""
        db = self.conn()
        try:
            db.execute(sql, args)
        except psycopg.Error as exc:
            raise self.failed(exc, "write") from exc

    def close(self) -> None:
        """Close the connection; no reconnection after."""
        with self._lock:
            self._closed = True
            db, self._db = self._db, None
        if db is not None:
            db.close()
