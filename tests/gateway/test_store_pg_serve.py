"""`toolbus serve` on the PostgreSQL store chosen by one config key (SPEC N1, O5): the
state lives in the database, not in the data folder; a newer schema is refused."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import psycopg
import yaml
from websockets.asyncio.client import connect

from gateway.config import DEMO_DIR
from gateway.pg_link import redact
from gateway.pg_schema import SCHEMA_VERSION
from gateway.store_pg import PgStore
from tests.pg_support import (  # noqa: F401 (fixture)
    at_schema,
    lease,
    older_nodes_message,
    pg_url,
    schema_of,
    schema_url,
)
from tests.support import (
    CONVERT,
    ROOT,
    WAIT,
    Peer,
    clean_env,
    spawn_serve,
    toolbus_argv,
    write_token_file,
)

START = 60.0
"""Seconds a `toolbus serve` may take to start: imports take seconds on a loaded machine."""


def _config(folder: Path, url: str, data: str) -> Path:
    """A config: port 0, the demo catalog, the test tokens, ``store.url`` = ``url``."""
    config = {
        "data_dir": str(folder / data),
        "server": {"port": 0, "heartbeat_interval": 0},
        "auth": {"token_file": str(write_token_file(folder))},
        "catalog": {
            "tools": [str(DEMO_DIR / "tools.yaml")],
            "profiles": [str(DEMO_DIR / "profiles.yaml")],
            "hot_reload": False,
        },
        "store": {"url": url},
    }
    path = folder / f"{data}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _serve_once(config: Path) -> subprocess.CompletedProcess[str]:
    """Run `toolbus serve` expecting it to stop at once; its exit code and output."""
    return subprocess.run(
        toolbus_argv("serve", "--config", str(config)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=START,
        env=clean_env(),
    )


async def _serve(config: Path) -> tuple[asyncio.subprocess.Process, str]:
    proc = await spawn_serve("--config", str(config))
    assert proc.stdout is not None
    async with asyncio.timeout(START):
        url = (await proc.stdout.readline()).decode().split()[3]
    return proc, url


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(WAIT):
        await proc.wait()


async def test_serve_keeps_sessions_in_postgresql_not_in_data_dir(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N1, D3: a session made on one server resumes, replayed whole, on a server with
    another, empty data folder pointed at the same database."""
    first, url = await _serve(_config(tmp_path, pg_url, "one"))
    try:
        async with connect(url, subprotocols=["toolbus.v1"]) as ws:  # type: ignore[list-item]
            p = Peer(ws)
            await p.hello()
            await p.invoke("c1", "convert_units", CONVERT)
            result = await p.terminal("c1")
            welcome = p.welcome
            catalog_seq = 1
    finally:
        await _stop(first)
    assert first.returncode == 0
    second, url = await _serve(_config(tmp_path, pg_url, "two"))
    try:
        async with connect(url, subprotocols=["toolbus.v1"]) as ws:  # type: ignore[list-item]
            again = Peer(ws)
            back = await again.hello(
                session_id=welcome["session_id"],
                resume_token=welcome["resume_token"],
                last_seq=catalog_seq,
            )
            assert (back["resumed"], back["last_seq"]) == (True, result["seq"])
            replayed = [await again.recv() for _ in range(result["seq"] - catalog_seq)]
            assert replayed[-1] == result
            assert [m["seq"] for m in replayed] == list(range(catalog_seq + 1, result["seq"] + 1))
    finally:
        await _stop(second)
    assert not (tmp_path / "two" / "toolbus.db").exists()


def test_serve_refuses_a_database_schema_newer_than_the_code(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N1, O5: a database a newer toolbus migrated stops `serve` with one line."""
    PgStore(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("INSERT INTO toolbus_schema (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    result = _serve_once(_config(tmp_path, pg_url, "d"))
    assert "Traceback" not in result.stderr
    assert result.returncode == 1
    assert result.stderr == (
        f"toolbus: cannot start: store {redact(pg_url)}: database schema version "
        f"{SCHEMA_VERSION + 1} is newer than this toolbus's {SCHEMA_VERSION}; run the newer "
        f"toolbus, or point store.url at another database\n"
    )


def test_serve_refuses_migration_4_while_an_older_node_holds_a_live_lease(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N1, N6, O5: `serve` on a schema-3 database where a node of the older toolbus
    still holds its lease stops with one line naming it and saying to drain and stop it,
    exit 1, no traceback; nothing is migrated."""
    at_schema(pg_url, 3)
    lease(pg_url, "old-node-1", 3600.0)
    result = _serve_once(_config(tmp_path, pg_url, "d"))
    assert "Traceback" not in result.stderr
    assert result.returncode == 1
    assert result.stderr == (
        f"toolbus: cannot start: {older_nodes_message(pg_url, 'old-node-1')}\n"
    )
    assert schema_of(pg_url) == (3, "text")


def test_serve_with_a_missing_search_path_schema_names_it(tmp_path: Path) -> None:
    """SPEC N1, O5: a store URL whose ``search_path`` schema does not exist (docs/deploy.md:
    "the schema must exist") stops `serve` with one line saying so, not the SQL error."""
    url = schema_url("tb_no_such_schema")
    result = _serve_once(_config(tmp_path, url, "m"))
    assert "Traceback" not in result.stderr
    assert result.returncode == 1
    assert result.stderr == (
        f"toolbus: cannot start: store {redact(url)}: no schema of its search_path "
        f"(tb_no_such_schema) exists; create it first (CREATE SCHEMA ...) or fix "
        f"options=-csearch_path in store.url\n"
    )


def test_serve_with_an_unreachable_database_is_one_line(tmp_path: Path) -> None:
    """SPEC N1, O5: a store URL nothing answers at stops `serve` with one line, exit 1."""
    url = "postgresql://postgres@127.0.0.1:1/test"
    result = _serve_once(_config(tmp_path, url, "u"))
    assert "Traceback" not in result.stderr
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"toolbus: cannot start: store {redact(url)}: cannot connect: connection failed: "
    )
    assert result.stderr.count("\n") == 1
