"""Versioned schema of the PostgreSQL store, migrated at start (SPEC N1).

Each entry of :data:`MIGRATIONS` is one version: the SQL that brings a database from the
version before it to this one. :func:`migrate` runs at every start of a
:class:`~gateway.store_pg.PgStore`: under a transaction-level advisory lock (so that
several nodes starting at once migrate once), it reads the versions applied so far from
``toolbus_schema``, refuses a database whose schema is newer than this code
(:class:`SchemaTooNew`, one line naming the versions), and applies the missing ones in
order, each in the same transaction as its row in ``toolbus_schema``.

Versions are never edited once released: a change is a new entry at the end.
"""

from __future__ import annotations

from typing import Any

import psycopg

from gateway.store import StoreError

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE sessions (
            session_id TEXT PRIMARY KEY, token_hash TEXT NOT NULL, "user" TEXT NOT NULL,
            tenant TEXT, profile TEXT NOT NULL, context BYTEA NOT NULL,
            options BYTEA NOT NULL, grants BYTEA NOT NULL, last_seq BIGINT NOT NULL,
            acked_seq BIGINT NOT NULL, floor_seq BIGINT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION,
            catalog_version TEXT
        );
        CREATE TABLE events (
            session_id TEXT NOT NULL, seq BIGINT NOT NULL, body BYTEA NOT NULL,
            PRIMARY KEY (session_id, seq)
        );
        CREATE TABLE calls (
            id BIGSERIAL, session_id TEXT NOT NULL, call_id BYTEA NOT NULL,
            state TEXT NOT NULL, body BYTEA, PRIMARY KEY (session_id, call_id)
        );
        CREATE TABLE jobs (
            job_id TEXT PRIMARY KEY, tool TEXT NOT NULL, state TEXT NOT NULL,
            session_id TEXT NOT NULL, "user" TEXT NOT NULL, tenant TEXT,
            profile TEXT NOT NULL, call_id TEXT, params BYTEA NOT NULL,
            context BYTEA NOT NULL, created_at DOUBLE PRECISION NOT NULL,
            started_at DOUBLE PRECISION, finished_at DOUBLE PRECISION, summary TEXT,
            artifacts BYTEA NOT NULL, result BYTEA, error BYTEA, id BIGSERIAL
        );
        CREATE INDEX jobs_by_user ON jobs ("user", created_at);
        CREATE INDEX jobs_unfinished ON jobs (state) WHERE state IN ('queued', 'running');
        CREATE TABLE call_ledger (
            tenant TEXT NOT NULL, "user" TEXT NOT NULL, call_id BYTEA NOT NULL,
            tool TEXT NOT NULL, params_hash TEXT NOT NULL, state TEXT NOT NULL,
            outcome BYTEA, created_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (tenant, "user", call_id)
        );
        CREATE INDEX call_ledger_by_age ON call_ledger (created_at);
        """,
    ),
    # SPEC S6, A7: the session's credential reference (never the credential itself).
    (2, "ALTER TABLE sessions ADD COLUMN credential_ref TEXT;"),
    # SPEC N2, N3, N4: nodes and their leases, session ownership with a fencing token
    # (owner_epoch), the inbox of events bound for a session another node holds,
    # requests (a decision, a cancel) bound for the node that runs a call or job, and
    # the node that runs each job, call and ledger entry (its work, if it dies).
    (
        3,
        """
        CREATE TABLE nodes (
            node_id TEXT PRIMARY KEY, lease_until DOUBLE PRECISION NOT NULL,
            started_at DOUBLE PRECISION NOT NULL, draining BOOLEAN NOT NULL DEFAULT false
        );
        ALTER TABLE sessions ADD COLUMN owner_node TEXT;
        ALTER TABLE sessions ADD COLUMN owner_epoch BIGINT NOT NULL DEFAULT 0;
        CREATE TABLE inbox (
            id BIGSERIAL PRIMARY KEY, session_id TEXT NOT NULL, body BYTEA NOT NULL,
            created_at DOUBLE PRECISION NOT NULL
        );
        CREATE INDEX inbox_by_session ON inbox (session_id, id);
        ALTER TABLE jobs ADD COLUMN node_id TEXT;
        ALTER TABLE calls ADD COLUMN node_id TEXT;
        ALTER TABLE call_ledger ADD COLUMN node_id TEXT;
        CREATE TABLE node_requests (
            id BIGSERIAL PRIMARY KEY, kind TEXT NOT NULL, session_id TEXT NOT NULL,
            "user" TEXT NOT NULL, target TEXT NOT NULL, decision TEXT,
            created_at DOUBLE PRECISION NOT NULL
        );
        """,
    ),
)
"""``(version, sql)`` in order. ``call_id`` columns are ``BYTEA`` (UTF-8): a client's call
id may hold U+0000, which PostgreSQL ``TEXT`` cannot store (SPEC D6: a value that binds
in SQLite must bind here too)."""

SCHEMA_VERSION = MIGRATIONS[-1][0]
"""The newest version this code knows."""

MIGRATION_WAIT_S = 60
"""Seconds a start may wait for another node's migration, or take for its own (SPEC N1)."""

_LOCK_KEY = 0x746F6F6C627573  # "toolbus": one migration at a time across nodes
_TABLE = (
    "CREATE TABLE IF NOT EXISTS toolbus_schema ("
    "version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
)


class SchemaTooNew(StoreError):
    """The database was migrated by a newer toolbus (SPEC N1, O5): this code refuses to
    start rather than write rows a newer schema does not expect."""


def migrate(db: psycopg.Connection[tuple[Any, ...]], where: str) -> list[int]:
    """Bring the database to :data:`SCHEMA_VERSION` (SPEC N1).

    Args:
        db: an autocommit connection whose ``search_path`` names the store's schema.
        where: how to name the database in messages (its URL without a password).

    Returns:
        The versions applied now, in order (empty when the schema was up to date).

    Raises:
        SchemaTooNew: the database holds a version newer than :data:`SCHEMA_VERSION`.
        psycopg.Error: the database refused a statement.
    """
    applied: list[int] = []
    with db.transaction():
        # Nodes started together wait for the one that migrates (the connection's short
        # lock_timeout is for serving, SPEC D6), up to MIGRATION_WAIT_S.
        db.execute(f"SET LOCAL lock_timeout = '{MIGRATION_WAIT_S}s'")
        db.execute(f"SET LOCAL statement_timeout = '{MIGRATION_WAIT_S}s'")
        db.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        db.execute(_TABLE)
        row = db.execute("SELECT max(version) FROM toolbus_schema").fetchone()
        current = int(row[0]) if row is not None and row[0] is not None else 0
        if current > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"store {where}: database schema version {current} is newer than this "
                f"toolbus's {SCHEMA_VERSION}; run the newer toolbus, or point store.url "
                f"at another database"
            )
        for version, sql in MIGRATIONS:
            if version <= current:
                continue
            db.execute(sql.encode())
            db.execute("INSERT INTO toolbus_schema (version) VALUES (%s)", (version,))
            applied.append(version)
    return applied
