"""PostgreSQL for the tests of the PostgreSQL store (SPEC N1).

The server is the machine's (``scripts/ensure-postgres`` starts it; override with
``TOOLBUS_TEST_PG_URL``). Each test gets a schema of its own, dropped after it, so tests
never see each other's rows. A server that does not answer fails the test: never a skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from gateway.pg_link import redact
from gateway.pg_schema import MIGRATIONS

PG_URL = os.environ.get("TOOLBUS_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
BACKENDS = ("sqlite", "postgresql")


def admin() -> psycopg.Connection[tuple[object, ...]]:
    """An autocommit connection to the test database (fails when it does not answer)."""
    try:
        return psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise AssertionError(
            f"PostgreSQL at {PG_URL} does not answer (run scripts/ensure-postgres): {exc}"
        ) from exc


def schema_url(name: str) -> str:
    """:data:`PG_URL` with ``search_path`` set to the schema ``name``."""
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options=-csearch_path%3D{name}"


@contextmanager
def fresh_schema() -> Iterator[str]:
    """A new, empty schema; yields a store URL for it, drops it afterwards."""
    name = "tb_" + uuid.uuid4().hex[:16]
    with admin() as db:
        db.execute(f"CREATE SCHEMA {name}")
    try:
        yield schema_url(name)
    finally:
        with admin() as db:
            db.execute(f"DROP SCHEMA {name} CASCADE")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A ``postgresql://`` URL of a fresh schema of its own."""
    with fresh_schema() as url:
        yield url


@pytest.fixture(params=BACKENDS)
def store_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test once per store (SPEC N1): the default SQLite, and PostgreSQL chosen by
    ``TOOLBUS_STORE__URL`` (inherited by servers the test starts as processes)."""
    if request.param == "sqlite":
        monkeypatch.delenv("TOOLBUS_STORE__URL", raising=False)
        yield "sqlite"
        return
    with fresh_schema() as url:
        monkeypatch.setenv("TOOLBUS_STORE__URL", url)
        yield url


def at_schema(url: str, version: int) -> None:
    """Make the database of ``url`` what a toolbus of schema ``version`` left: the
    migrations up to it applied and recorded, nothing after (SPEC N1)."""
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(
            "CREATE TABLE toolbus_schema (version INTEGER PRIMARY KEY, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for number, sql in MIGRATIONS[:version]:
            db.execute(sql.encode())
            db.execute("INSERT INTO toolbus_schema (version) VALUES (%s)", (number,))


def lease(url: str, node: str, seconds: float) -> None:
    """Give ``node`` a lease that runs out ``seconds`` from now on the database's clock
    (in the past when negative), as its lease thread writes it (SPEC N4)."""
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(
            "INSERT INTO nodes (node_id, lease_until, started_at) VALUES (%s, "
            "extract(epoch FROM clock_timestamp()) + %s, extract(epoch FROM clock_timestamp())) "
            "ON CONFLICT (node_id) DO UPDATE SET lease_until = EXCLUDED.lease_until",
            (node, seconds),
        )


def schema_of(url: str) -> tuple[int, str]:
    """The newest version recorded and the type of ``jobs.call_id``."""
    with psycopg.connect(url, autocommit=True) as db:
        version = db.execute("SELECT max(version) FROM toolbus_schema").fetchone()
        kind = db.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_schema = "
            "current_schema() AND table_name = 'jobs' AND column_name = 'call_id'"
        ).fetchone()
    assert version is not None
    assert kind is not None
    return int(version[0]), str(kind[0])


def older_nodes_message(url: str, names: str) -> str:
    """The line a start refused by :class:`OlderNodesRunning` gives (SPEC O5)."""
    return (
        f"store {redact(url)}: schema version 4 needs every node of an older toolbus "
        f"stopped, and nodes {names} hold live leases; drain and stop them, then start "
        f"this toolbus again"
    )
