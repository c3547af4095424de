"""`toolbus check` looks at the store `serve` would open, and writes nothing to it (SPEC
O5, D6, N1; case F32): a damaged SQLite file, or a PostgreSQL database that does not
answer or lacks its schema, fails the check with one line, as `serve` would refuse it."""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from gateway.pg_link import redact
from gateway.store import SqliteStore
from tests import pg_support


def _config(tmp_path: Path, **sections: object) -> Path:
    config = tmp_path / "toolbus.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), **sections}))
    return config


def _errors(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_o5_d6_check_refuses_a_damaged_store_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC O5, D6 (case F32): a store file that is not a database, or was truncated to
    0 bytes, fails `check` with the same line `serve` refuses to start with."""
    config = _config(tmp_path)
    db = tmp_path / "data" / "toolbus.db"
    db.parent.mkdir()
    db.write_bytes(b"not a database, " * 512)
    assert main(["check", "--config", str(config)]) == 1
    assert _errors(capsys) == [
        f"error: {db}: the store is damaged (file is not a database); refusing to start "
        f"rather than drop its sessions and jobs silently. To start fresh on purpose, move "
        f"{db} and its -wal, -shm and -intent files away (their sessions, jobs and event "
        f"logs are then gone)."
    ]
    db.write_bytes(b"")
    assert main(["check", "--config", str(config)]) == 1
    (line,) = _errors(capsys)
    assert line.startswith(f"error: {db}: the store is damaged (the file is empty (0 bytes)")


def test_o5_check_passes_a_sound_store_and_writes_nothing_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC O5: a store `serve` wrote passes, and `check` changes none of its files; no
    store file yet passes too, and none is created."""
    config = _config(tmp_path)
    assert main(["check", "--config", str(config)]) == 0
    assert not (tmp_path / "data" / "toolbus.db").exists()
    capsys.readouterr()
    data = tmp_path / "data"
    data.mkdir()
    store = SqliteStore(data / "toolbus.db")
    store.stage_event("s1", 1, b"{}")
    store.commit()
    store.close()
    before = _digest(data)
    assert main(["check", "--config", str(config)]) == 0
    assert _errors(capsys) == []
    assert _digest(data) == before


def test_o5_n1_check_refuses_a_database_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC O5, N1: `store.url` naming a database the server lacks fails `check` with
    one line naming the URL (no password) and libpq's reason."""
    name = f"toolbus_absent_{secrets.token_hex(4)}"
    url = pg_support.PG_URL.rsplit("/", 1)[0] + f"/{name}"
    config = _config(tmp_path, store={"url": url})
    assert main(["check", "--config", str(config)]) == 1
    (line,) = _errors(capsys)
    assert line.startswith(f"error: store {redact(url)}: cannot connect: ")
    assert f'database "{name}" does not exist' in line


def test_o5_n1_check_refuses_a_search_path_schema_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC O5, N1: a `search_path` naming no schema fails `check` as `serve` fails."""
    url = pg_support.schema_url(f"absent_{secrets.token_hex(4)}")
    config = _config(tmp_path, store={"url": url})
    assert main(["check", "--config", str(config)]) == 1
    (line,) = _errors(capsys)
    assert line.startswith(f"error: store {redact(url)}: no schema of its search_path (")
    assert line.endswith(
        "exists; create it first (CREATE SCHEMA ...) or fix options=-csearch_path in store.url"
    )


def test_o5_n1_check_passes_a_fresh_and_a_migrated_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC O5, N1: an empty schema (serve creates the tables) and one a node migrated
    both pass; a schema version newer than this toolbus's fails."""
    from gateway.pg_schema import SCHEMA_VERSION
    from gateway.store_pg import PgStore

    with pg_support.fresh_schema() as url:
        config = _config(tmp_path, store={"url": url})
        assert main(["check", "--config", str(config)]) == 0
        PgStore(url).close()
        assert main(["check", "--config", str(config)]) == 0
        assert _errors(capsys) == []
        newer = SCHEMA_VERSION + 1
        with pg_support.admin() as db:
            db.execute(f"SET search_path TO {_schema_of(url)}")
            db.execute("INSERT INTO toolbus_schema (version) VALUES (%s)", (newer,))
        assert main(["check", "--config", str(config)]) == 1
        assert _errors(capsys) == [
            f"error: store {redact(url)}: database schema version {newer} is newer than "
            f"this toolbus's {SCHEMA_VERSION}; run the newer toolbus, or point store.url at "
            f"another database"
        ]


def _schema_of(url: str) -> str:
    """The schema name a :func:`tests.pg_support.schema_url` URL sets as search_path."""
    from psycopg.conninfo import conninfo_to_dict

    options = str(conninfo_to_dict(url).get("options") or "")
    return options.split("search_path=", 1)[1].split()[0]


def test_o5_d6_check_passes_an_older_store_its_open_would_migrate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC O5, D6: a schema-version-1 file lacking the column version 2 adds passes
    (`serve` migrates it at open) and stays as it was; the same file claiming version 2
    is damaged."""
    import sqlite3

    config = _config(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    SqliteStore(data / "toolbus.db").close()
    db = sqlite3.connect(data / "toolbus.db")
    db.execute("ALTER TABLE sessions DROP COLUMN credential_ref")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    before = _digest(data)
    assert main(["check", "--config", str(config)]) == 0
    assert _digest(data) == before
    db = sqlite3.connect(data / "toolbus.db")
    db.execute("PRAGMA user_version=2")
    db.commit()
    db.close()
    assert main(["check", "--config", str(config)]) == 1
    (line,) = _errors(capsys)
    assert "the store is damaged (table sessions has columns" in line
