"""Versioned schema of the PostgreSQL store, migrated at start (SPEC N1).

Each entry of :data:`MIGRATIONS` is one version: the SQL that brings a database from the
version before it to this one. :func:`migrate` runs at every start of a
:class:`~gateway.store_pg.PgStore`: under a transaction-level advisory lock (so that
several nodes starting at once migrate once), it reads the versions applied so far from
``toolbus_schema``, refuses a database whose schema is newer than this code
(:class:`SchemaTooNew`, one line naming the versions), and applies the missing ones in
order, each in the same transaction as its row in ``toolbus_schema``.

A version that changes columns nodes of an older toolbus still write (:data:`DRAIN_FIRST`:
version 4, ``TEXT`` to ``BYTEA``, SPEC D6) is applied only while no other node holds a
live lease in ``nodes``: a rolling restart across it (SPEC N6) drains and stops every
older node first, and a start that finds one running is refused with one line
(:class:`OlderNodesRunning`, SPEC N1, O5) after waiting, at most :data:`LEASE_WAIT_S`,
for the leases of nodes just stopped to run out.

Versions are never edited once released: a change is a new entry at the end.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from gateway.store import StoreError

logger = logging.getLogger("gateway.pg_schema")

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
    # SPEC D6, N1: text a client or a handler chooses becomes UTF-8 BYTEA, as call ids
    # were from version 1: a job's call id (an async or promoted call's) and summary (a
    # handler's, or the text of its failure), the tool name a ledger entry records (an
    # invoke's, known or not), the call id a routed cancel names. Nodes of an older
    # toolbus must be stopped first (DRAIN_FIRST).
    (
        4,
        """
        ALTER TABLE jobs
            ALTER COLUMN call_id TYPE BYTEA USING convert_to(call_id, 'UTF8'),
            ALTER COLUMN summary TYPE BYTEA USING convert_to(summary, 'UTF8');
        ALTER TABLE call_ledger ALTER COLUMN tool TYPE BYTEA USING convert_to(tool, 'UTF8');
        ALTER TABLE node_requests
            ALTER COLUMN target TYPE BYTEA USING convert_to(target, 'UTF8');
        """,
    ),
)
"""``(version, sql)`` in order. Text a client or a handler chooses is UTF-8 ``BYTEA``:
``calls.call_id`` and ``call_ledger.call_id`` from version 1, ``jobs.call_id``,
``jobs.summary``, ``call_ledger.tool`` and ``node_requests.target`` from version 4. Such
text may hold U+0000, which PostgreSQL ``TEXT`` cannot store (SPEC D6: a value that binds
in SQLite must bind here too). ``TEXT`` columns hold what the server mints (session and
job ids, hashes, states, node ids, JSON it encoded), tool names of the catalog
(``[A-Za-z0-9_-]``), and names from credentials (user, tenant, profile), which the
authenticators refuse when they hold U+0000 (SPEC S2: ``gateway.auth``,
``gateway.tokenfile``); ``PgStore`` refuses, when it is staged, any other value such a
column cannot bind."""

SCHEMA_VERSION = MIGRATIONS[-1][0]
"""The newest version this code knows."""

MIGRATION_WAIT_S = 60
"""Seconds a start may wait for another node's migration, or take for its own (SPEC N1)."""

DRAIN_FIRST = frozenset({4})
"""Versions that nodes of an older toolbus cannot run alongside (SPEC N1, N6, O5): they
change the type of columns those nodes still write and read (version 4: ``TEXT`` to
``BYTEA``; PostgreSQL would even take much of an old node's text into ``BYTEA``, and
hand it back as bytes). Such a version is applied only while no other node holds a live
lease (:class:`OlderNodesRunning`)."""

LEASE_WAIT_S = 30.0
"""Seconds at most a start waits, before a :data:`DRAIN_FIRST` migration, for the live
leases it finds to run out: a node just stopped (or killed) keeps its lease until its
``nodes.lease_ttl`` has passed, a running node renews its own. Longer leases, and leases
renewed meanwhile, stop the start."""

_LOCK_KEY = 0x746F6F6C627573  # "toolbus": one migration at a time across nodes
_TABLE = (
    "CREATE TABLE IF NOT EXISTS toolbus_schema ("
    "version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
)


class SchemaTooNew(StoreError):
    """The database was migrated by a newer toolbus (SPEC N1, O5): this code refuses to
    start rather than write rows a newer schema does not expect."""


class OlderNodesRunning(StoreError):
    """A :data:`DRAIN_FIRST` migration is due while other nodes hold live leases: nodes of
    an older toolbus that would write rows the new schema does not expect (SPEC N1, N6,
    O5). Nothing was migrated; the message (one line) names the nodes and says to drain
    and stop them, then start again."""


def migrate(db: psycopg.Connection[tuple[Any, ...]], where: str) -> list[int]:
    """Bring the database to :data:`SCHEMA_VERSION` (SPEC N1).

    Args:
        db: an autocommit connection whose ``search_path`` names the store's schema.
        where: how to name the database in messages (its URL without a password).

    Returns:
        The versions applied now, in order (empty when the schema was up to date).

    Raises:
        SchemaTooNew: the database holds a version newer than :data:`SCHEMA_VERSION`.
        OlderNodesRunning: a :data:`DRAIN_FIRST` version is due and other nodes still
            hold live leases (after waiting up to :data:`LEASE_WAIT_S` for them to run
            out); nothing was applied.
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
            if version in DRAIN_FIRST and current >= _NODES_SINCE:
                _refuse_live_nodes(db, where, version)
            db.execute(sql.encode())
            db.execute("INSERT INTO toolbus_schema (version) VALUES (%s)", (version,))
            applied.append(version)
    return applied


_NODES_SINCE = 3
"""The version that created the ``nodes`` table: before it, no node kept a lease."""


def _leases(db: psycopg.Connection[tuple[Any, ...]]) -> list[tuple[str, float]]:
    """Live leases, ``(node_id, seconds left)``, on the database's clock (SPEC N4)."""
    rows = db.execute(
        "SELECT node_id, lease_until - extract(epoch FROM clock_timestamp()) FROM nodes "
        "WHERE lease_until > extract(epoch FROM clock_timestamp()) ORDER BY node_id"
    ).fetchall()
    return [(str(node), float(left)) for node, left in rows]


def _refuse_live_nodes(db: psycopg.Connection[tuple[Any, ...]], where: str, version: int) -> None:
    """Inside the migration's transaction, under its lock: raise
    :class:`OlderNodesRunning` unless no node holds a live lease (SPEC N1, N6, O5).

    This process has no lease yet (a node registers after its store opens), so every
    live lease is another process's, of an older toolbus (a node of this one would have
    migrated already). Leases that run out within :data:`LEASE_WAIT_S` (nodes just
    stopped) are waited for, once; a lease still live after that is a running node.
    """
    live = _leases(db)
    if live and max(left for _, left in live) <= LEASE_WAIT_S:
        wait = max(left for _, left in live) + 0.05
        logger.info(
            "store %s: waiting %.1f s for the leases of nodes %s to run out before "
            "migrating to schema version %d",
            where,
            wait,
            ", ".join(node for node, _ in live),
            version,
        )
        time.sleep(wait)
        live = _leases(db)
    if live:
        names = ", ".join(node for node, _ in live)
        raise OlderNodesRunning(
            f"store {where}: schema version {version} needs every node of an older "
            f"toolbus stopped, and nodes {names} hold live leases; drain and stop them, "
            f"then start this toolbus again"
        )
