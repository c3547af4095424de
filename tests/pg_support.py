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
