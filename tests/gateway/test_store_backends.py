"""Every method of the Store interface, on both stores: SQLite and PostgreSQL (SPEC N1,
D1-D3, D6, I12, I15, J1-J3), plus what only the PostgreSQL store has: versioned
migrations, a lost connection, text PostgreSQL cannot hold (SPEC N1, N7, D6)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from gateway.pg_link import LOCK_TIMEOUT_MS, STATEMENT_TIMEOUT_MS, redact
from gateway.pg_schema import (
    _LOCK_KEY,
    LEASE_WAIT_S,
    MIGRATIONS,
    SCHEMA_VERSION,
    OlderNodesRunning,
    SchemaTooNew,
    migrate,
)
from gateway.store import (
    BadValue,
    JobRow,
    LedgerRow,
    SessionRow,
    SqliteStore,
    Store,
    StoreUnavailable,
)
from gateway.store_check import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from gateway.store_pg import PgStore
from tests.pg_support import (  # noqa: F401 (fixture)
    BACKENDS,
    at_schema,
    fresh_schema,
    lease,
    older_nodes_message,
    pg_url,
    schema_of,
)

Opener = Callable[[], Store]


@pytest.fixture(params=BACKENDS)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens a store on one place, again and again (a restart), of each backend."""
    if request.param == "sqlite":
        yield lambda: SqliteStore(tmp_path / "db.sqlite")
        return
    with fresh_schema() as url:
        yield lambda: PgStore(url)


def session(sid: str, user: str = "alice", expires_at: float | None = None) -> SessionRow:
    return SessionRow(
        sid, "h", user, None, "demo", {"k": "v"}, {"o": 1}, ["g"], 0, 0, 0, 1.5, expires_at, "v1"
    )


def job(job_id: str, created: float, state: str = "running", tenant: str | None = None) -> JobRow:
    finished = created + 1 if state in ("done", "failed") else None
    return JobRow(
        job_id, "report", state, "s1", "alice", tenant, "demo", "c1", {"p": [1, 2]}, {},
        created, created, finished, None, [{"name": "a"}], {"r": 1} if finished else None, None,
    )  # fmt: skip


def test_events_and_sessions_survive_a_reopen(opener: Opener) -> None:
    """SPEC D1, D3, N1: committed events read back in order, limited, complete or not;
    last_seq is the log's; the floor drops events; all of it survives a reopen."""
    store = opener()
    store.stage_session(session("s1"))
    for seq in range(1, 6):
        store.stage_event("s1", seq, b'{"seq":%d}' % seq)
    assert store.events_after("s1", 0) == []  # staged is not committed
    store.commit()
    store.close()
    store = opener()
    row = store.load_session("s1")
    assert row == SessionRow(
        "s1", "h", "alice", None, "demo", {"k": "v"}, {"o": 1}, ["g"], 5, 0, 0, 1.5, None, "v1"
    )
    assert store.events_after("s1", 2, limit=2) == [(3, b'{"seq":3}'), (4, b'{"seq":4}')]
    assert store.events_complete("s1", 0, 5) is True
    assert store.events_complete("s1", 0, 6) is False
    assert store.events_complete("s1", 4, 4) is True
    store.stage_seq("s1", 5, 3, 3)
    store.commit()
    assert [seq for seq, _ in store.events_after("s1", 0)] == [4, 5]
    assert store.events_complete("s1", 2, 5) is False
    loaded = store.load_session("s1")
    assert loaded is not None
    assert (loaded.last_seq, loaded.acked_seq, loaded.floor_seq) == (5, 3, 3)
    assert [r.session_id for r in store.all_sessions()] == ["s1"]
    assert store.load_session("nope") is None
    store.close()


def test_calls_keep_their_order_and_state(opener: Opener) -> None:
    """SPEC I12: call records by state; done ids in the order calls ended (a rewrite moves
    to the end); forgotten ones gone; running ones listed for recovery; any call id text."""
    store = opener()
    odd = "c\x00\u00e9"
    store.stage_call("s1", "a", "running", b'{"tool":"t"}')
    store.stage_call("s1", odd, "done", b'{"x":1}')
    store.stage_call("s1", "b", "done", b'{"x":2}')
    store.commit()
    store.stage_call("s1", "a", "done", b'{"x":3}')
    store.stage_call("s2", "z", "running", None)
    store.commit()
    assert store.done_call_ids("s1") == [odd, "b", "a"]
    assert store.call("s1", odd) == ("done", b'{"x":1}')
    assert store.call("s1", "missing") is None
    assert store.running_calls() == [("s2", "z", None)]
    store.stage_forget_call("s1", "b")
    store.commit()
    assert store.call("s1", "b") is None
    assert store.done_call_ids("s1") == [odd, "a"]
    store.close()


def test_n6_a_handoff_note_is_a_running_call_row_until_a_later_row_replaces_it(
    opener: Opener,
) -> None:
    """SPEC N6, I12: ``stage_handoff`` stores the drain's note as the call's ``running``
    row, on both stores; a row of the same call staged after it in the same batch (the
    call ended, or was forgotten) replaces the note, and on PostgreSQL its hand-off mark
    too, so the commit never writes the note over the row later
    (:meth:`gateway.store.Store.stage_handoff`)."""
    store = opener()
    note = b'{"tool":"t","approval_id":"a1","handoff":{"params":{},"expires_at":1.0}}'
    store.stage_handoff("s1", "h1", note)
    store.stage_handoff("s1", "h2", note)
    store.stage_call("s1", "h2", "done", b'{"x":1}')
    store.stage_handoff("s1", "h3", note)
    store.stage_forget_call("s1", "h3")
    if isinstance(store, PgStore):
        assert list(store._batch.handoffs) == [("s1", "h1")]
    store.commit()
    assert store.running_calls() == [("s1", "h1", note)]
    assert store.call("s1", "h2") == ("done", b'{"x":1}')
    assert store.call("s1", "h3") is None
    store.close()


def test_jobs_by_user_tenant_and_state(opener: Opener) -> None:
    """SPEC J1-J3: a job reads back whole; a user's jobs newest first, by tenant and state,
    limited; unfinished jobs listed for recovery."""
    store = opener()
    store.stage_job(job("j1", 10.0, "done"))
    store.stage_job(job("j2", 20.0))
    store.stage_job(job("j3", 30.0, "queued"))
    store.stage_job(job("t2", 40.0, tenant="t2"))
    store.commit()
    assert store.job("j1") == job("j1", 10.0, "done")
    assert store.job("nope") is None
    assert [j.job_id for j in store.jobs("alice", None, None, 10)] == ["j3", "j2", "j1"]
    assert [j.job_id for j in store.jobs("alice", None, None, 2)] == ["j3", "j2"]
    assert [j.job_id for j in store.jobs("alice", None, "done", 10)] == ["j1"]
    assert [j.job_id for j in store.jobs("alice", "t2", None, 10)] == ["t2"]
    assert store.jobs("bob", None, None, 10) == []
    assert sorted(j.job_id for j in store.unfinished_jobs()) == ["j2", "j3", "t2"]
    store.close()


def test_ledger_staged_committed_running_purged(opener: Opener) -> None:
    """SPEC I15: a ledger row is visible once staged, durable once committed, listed while
    running, rewritten done, and purged by age."""
    store = opener()
    row = LedgerRow("", "alice", "c\x001", "report", "ab", "running", None, 100.0)
    store.stage_ledger(row)
    assert store.ledger("", "alice", "c\x001") == row
    store.commit()
    store.close()
    store = opener()
    assert store.ledger("", "alice", "c\x001") == row
    assert store.running_ledger() == [row]
    done = LedgerRow("", "alice", "c\x001", "report", "ab", "done", b'{"type":"result"}', 100.0)
    store.stage_ledger(done)
    store.stage_ledger(LedgerRow("t", "alice", "new", "x", "cd", "done", b"{}", 200.0))
    store.commit()
    assert store.running_ledger() == []
    assert store.ledger("", "alice", "c\x001") == done
    assert store.ledger("t", "bob", "new") is None
    store.purge_ledger(150.0)
    assert store.ledger("", "alice", "c\x001") is None
    assert store.ledger("t", "alice", "new") is not None
    store.close()


def test_delete_and_purge_run_last_in_the_commit(opener: Opener) -> None:
    """SPEC D2: a session's deletion is staged and takes its events and calls; the purge
    drops expired sessions and finished jobs past retention, never live ones."""
    store = opener()
    for row in (session("gone"), session("expired", expires_at=5.0), session("live")):
        store.stage_session(row)
        store.stage_event(row.session_id, 1, b"{}")
        store.stage_call(row.session_id, "c", "done", b"{}")
    store.stage_job(job("old", 1.0, "done"))
    store.stage_job(job("young", 90.0, "done"))
    store.commit()
    store.delete_session("gone")
    assert store.load_session("gone") is not None  # staged, not yet committed
    store.commit()
    assert store.load_session("gone") is None
    assert store.events_after("gone", 0) == []
    assert store.call("gone", "c") is None
    store.purge(now=10.0, job_retention=5.0)
    assert [r.session_id for r in store.all_sessions()] == ["live"]
    assert store.events_after("expired", 0) == []
    assert (store.job("old"), store.job("young") is not None) == (None, True)
    store.close()


def terminate(store: PgStore) -> None:
    """End the store's connection from the server side, as a database restart does."""
    db = store.link._db
    assert db is not None
    with psycopg.connect(store.url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (db.info.backend_pid,))


def _when_connected(op: Callable[[], object], failure: str = "never connected again") -> None:
    """Run ``op`` (a store call) as soon as the store serves it again, within 10 s, else
    fail with ``failure``: a poll of the outcome, nothing is ordered by it (SPEC D6)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            op()
            return
        except StoreUnavailable:
            assert time.monotonic() < deadline, f"the store {failure}"
            time.sleep(0.005)


def test_pg_lost_connection_fails_closed_and_recovers(pg_url: str) -> None:  # noqa: F811
    """SPEC N7, D6: the server ends the store's connection: the commit fails at once with
    everything kept staged; a thread connects again; the next commit writes it all."""
    store = PgStore(pg_url)
    store.stage_session(session("s1"))
    store.stage_event("s1", 1, b"{}")
    store.commit()
    terminate(store)
    store.stage_event("s1", 2, b'{"n":2}')
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        store.commit()
    assert time.monotonic() - started < 1.0
    _when_connected(store.commit)
    assert store.events_after("s1", 0) == [(1, b"{}"), (2, b'{"n":2}')]
    store.close()


def test_d6_n7_pg_connection_left_busy_is_replaced(pg_url: str) -> None:  # noqa: F811
    """SPEC D6, N7: a connection libpq holds as still running a command (a result never
    read: every statement then fails "another command is already in progress", and the
    connection is not broken) is dropped and replaced; the store recovers by itself
    with everything staged kept. Seen once in a full run under load: a node's inbox,
    request and claim reads failed that way for the rest of the test, and no resume
    could be served."""
    store = PgStore(pg_url)
    store.stage_session(session("s1"))
    store.stage_event("s1", 1, b"{}")
    store.commit()
    busy = store.link._db
    assert busy is not None
    busy.pgconn.send_query(b"SELECT 1")  # libpq now waits for a result nobody reads
    store.stage_event("s1", 2, b'{"n":2}')
    with pytest.raises(StoreUnavailable):
        store.commit()
    _when_connected(store.commit)
    assert busy.closed
    assert store.events_after("s1", 0) == [(1, b"{}"), (2, b'{"n":2}')]
    store.close()


def test_d6_n7_pg_commit_cut_off_inside_its_pipeline_recovers(pg_url: str) -> None:  # noqa: F811
    """SPEC D6, N7: the backend is terminated while a commit's pipeline is in flight (a
    database restart, or ``pg_terminate_backend`` returning before the backend is
    gone). In about one kill of ten psycopg then fails "cannot exit pipeline mode while
    busy" and leaves the connection neither broken nor closed, its transaction
    ``ACTIVE``: a statement without parameters on it (a recovery read) then fails at
    once without reading the socket, forever. The store must replace it, serve that
    read, and commit everything staged, in order (found by a helper hunting the cause
    of the busy connection above). Rounds until that case comes (each a real kill at a
    random 0-5 ms into a run of commits); fails if it never came in 400 rounds, or if
    the store does not recover from it."""
    import random

    store = PgStore(pg_url)
    store.stage_session(session("s1"))
    store.commit()
    seq, cut_off = 0, 0
    for _ in range(400):
        db = store.link._db
        assert db is not None
        pid = db.info.backend_pid

        def kill(pid: int = pid) -> None:
            time.sleep(random.random() * 0.005)
            with psycopg.connect(pg_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

        killer = threading.Thread(target=kill)
        killer.start()
        try:
            while True:
                seq += 1
                store.stage_event("s1", seq, b"{}")
                try:
                    store.commit()
                except StoreUnavailable as exc:
                    failure = str(exc)
                    break
        finally:
            killer.join()
        if "cannot exit pipeline mode" in failure:
            cut_off += 1
            # A read without parameters, as recovery's and the claim's are: on the
            # stuck connection it never touches the socket, so only a new one serves it.
            _when_connected(store.running_calls, "kept the stuck connection")
        _when_connected(store.commit)
        if cut_off:
            break
    assert cut_off, "no kill cut a commit off inside its pipeline in 400 rounds"
    assert [n for n, _ in store.events_after("s1", 0)] == list(range(1, seq + 1))
    store.close()


def test_pg_text_it_cannot_hold_is_refused_at_staging(pg_url: str) -> None:  # noqa: F811
    """SPEC D6: text with U+0000 is BadValue to its one caller, nothing of it staged; the
    rest of the batch commits."""
    store = PgStore(pg_url)
    store.stage_event("s1", 1, b"{}")
    with pytest.raises(BadValue, match="U\\+0000"):
        store.stage_session(session("s1", user="a\x00b"))
    store.commit()
    assert store.load_session("s1") is None
    assert store.events_after("s1", 0) == [(1, b"{}")]
    store.close()


def test_pg_migrates_once_even_when_nodes_start_together(pg_url: str) -> None:  # noqa: F811
    """SPEC N1: processes migrating one new database at once apply each version once."""
    errors: list[BaseException] = []

    def open_close() -> None:
        try:
            with psycopg.connect(pg_url, autocommit=True) as db:
                migrate(db, "test")
        except BaseException as exc:  # reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=open_close) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    with psycopg.connect(pg_url, autocommit=True) as db:
        rows = db.execute("SELECT version FROM toolbus_schema ORDER BY version").fetchall()
    assert rows == [(v,) for v in range(1, SCHEMA_VERSION + 1)]


def test_pg_start_waits_for_another_nodes_migration_past_the_serving_lock_timeout(
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N1: a node starting while another migrates waits for it, though its serving
    connection gives up a lock wait after LOCK_TIMEOUT_MS (SPEC D6); it then finds the
    schema current and applies nothing."""
    with psycopg.connect(pg_url, autocommit=True) as holder:
        migrate(holder, "test")
        # The serving connection's timeouts, added to the URL's own options (the test's
        # search_path): an ``options`` keyword would replace them, and the start would
        # migrate another schema than the one the holder locks.
        url_options = conninfo_to_dict(pg_url).get("options") or ""
        timeouts = f"-c lock_timeout={LOCK_TIMEOUT_MS} -c statement_timeout={STATEMENT_TIMEOUT_MS}"
        options = f"{url_options} {timeouts}".strip()
        done: list[list[int] | BaseException] = []
        paths: list[tuple[str] | None] = []

        def start() -> None:
            try:
                with psycopg.connect(pg_url, autocommit=True, options=options) as db:
                    paths.append(db.execute("SHOW search_path").fetchone())
                    done.append(migrate(db, "test"))
            except BaseException as exc:  # reported by the assert below
                done.append(exc)

        with holder.transaction():
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            thread = threading.Thread(target=start)
            thread.start()
            deadline = time.monotonic() + 10
            while not holder.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype='advisory' AND NOT granted "
                "AND classid=%s AND objid=%s",
                (_LOCK_KEY >> 32, _LOCK_KEY & 0xFFFFFFFF),
            ).fetchone()[0]:  # type: ignore[index]
                assert time.monotonic() < deadline, "the second start never waited"
            # Held well past the serving lock_timeout: the waiter must still be waiting.
            time.sleep(3 * LOCK_TIMEOUT_MS / 1000)
            assert done == [], done
        thread.join(timeout=30)
        assert paths == [holder.execute("SHOW search_path").fetchone()]
    assert done == [[]], done


def test_pg_refuses_a_schema_newer_than_the_code(pg_url: str) -> None:  # noqa: F811
    """SPEC N1, O5: a database migrated by a newer toolbus is refused with one line."""
    PgStore(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("INSERT INTO toolbus_schema (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    with pytest.raises(SchemaTooNew) as info:
        PgStore(pg_url)
    assert str(info.value) == (
        f"store {redact(pg_url)}: database schema version "
        f"{SCHEMA_VERSION + 1} is newer than this toolbus's {SCHEMA_VERSION}; run the newer "
        f"toolbus, or point store.url at another database"
    )


def test_pg_commits_do_not_wait_for_the_wal_flush_unless_asked(pg_url: str) -> None:  # noqa: F811
    """SPEC N1, D1: synchronous_commit is off by default (the SQLite store's durability
    class) and the URL's options can turn it on."""
    store = PgStore(pg_url)
    assert store.link.read("SHOW synchronous_commit") == [("off",)]
    store.close()
    store = PgStore(pg_url + "%20-csynchronous_commit%3Don")
    assert store.link.read("SHOW synchronous_commit") == [("on",)]
    assert store.link.read("SHOW statement_timeout") == [("2s",)]
    assert store.link.read("SHOW lock_timeout") == [("100ms",)]
    store.close()


def test_pg_several_nodes_share_one_store(pg_url: str) -> None:  # noqa: F811
    """SPEC N2: a second node on a store in use starts (no node lock any more); each
    commits through its own connection."""
    first, second = PgStore(pg_url), PgStore(pg_url)
    first.stage_session(session("s1"))
    first.commit()
    second.stage_session(session("s2"))
    second.commit()
    assert {row.session_id for row in first.all_sessions()} == {"s1", "s2"}
    first.close()
    second.close()


def test_pg_locked_table_fails_the_commit_fast_and_keeps_it_staged(
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC D6 (the PostgreSQL twin of a locked SQLite file): a table another connection
    holds locked fails the commit within the lock timeout, everything stays staged, and
    the commit after the lock is released writes it all."""
    store = PgStore(pg_url)
    store.stage_session(session("s1"))
    store.commit()
    store.stage_event("s1", 1, b"{}")
    store.stage_call("s1", "c1", "done", b"{}")
    with psycopg.connect(pg_url, autocommit=True) as admin, admin.transaction():
        admin.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="lock timeout"):
            store.commit()
        assert time.monotonic() - started < 1.0
    store.commit()
    assert store.events_after("s1", 0) == [(1, b"{}")]
    assert store.call("s1", "c1") == ("done", b"{}")
    store.close()


def test_credential_ref_is_stored_with_the_session(opener: Opener) -> None:
    """SPEC S6, A7: a session's credential reference survives a reopen on both stores."""
    store = opener()
    ref = '{"kind":"token","sha256":"ab","profile":"demo"}'
    store.stage_session(replace(session("s1"), credential_ref=ref))
    store.commit()
    store.close()
    store = opener()
    loaded = store.load_session("s1")
    assert loaded is not None
    assert loaded.credential_ref == ref
    assert [row.credential_ref for row in store.all_sessions()] == [ref]
    store.close()


_V1_SESSIONS_SQLITE = """
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY, token_hash TEXT NOT NULL, user TEXT NOT NULL,
    tenant TEXT, profile TEXT NOT NULL, context BLOB NOT NULL, options BLOB NOT NULL,
    grants BLOB NOT NULL, last_seq INTEGER NOT NULL, acked_seq INTEGER NOT NULL,
    floor_seq INTEGER NOT NULL, created_at REAL NOT NULL, expires_at REAL,
    catalog_version TEXT
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL
);
CREATE TABLE calls (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL, call_id TEXT NOT NULL, state TEXT NOT NULL, body BLOB
);
CREATE TABLE jobs (
    job_id TEXT PRIMARY KEY, tool TEXT NOT NULL, state TEXT NOT NULL,
    session_id TEXT NOT NULL, user TEXT NOT NULL, tenant TEXT, profile TEXT NOT NULL,
    call_id TEXT, params BLOB NOT NULL, context BLOB NOT NULL, created_at REAL NOT NULL,
    started_at REAL, finished_at REAL, summary TEXT, artifacts BLOB NOT NULL,
    result BLOB, error BLOB
);
INSERT INTO sessions VALUES
    ('s1', 'h', 'alice', NULL, 'demo', '{}', '{}', '[]', 0, 0, 0, 1.5, NULL, 'v1');
PRAGMA user_version=1;
"""


def _old_session_takes_a_ref(store: Store) -> None:
    """Session ``s1`` of a migrated schema-1 store reads ``credential_ref`` ``None``
    (re-validated as revoked, SPEC S6) and stores ``"r"`` once given one."""
    loaded = store.load_session("s1")
    assert loaded is not None
    assert (loaded.user, loaded.credential_ref) == ("alice", None)
    store.stage_session(replace(loaded, credential_ref="r"))
    store.commit()


def test_sqlite_store_of_schema_1_gains_the_credential_ref_column(tmp_path: Path) -> None:
    """SPEC S6, D6, O5: a schema-1 store opens (additive migration to version 2), keeps
    its sessions, whose missing reference reads ``None`` (re-validated as revoked)."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(_V1_SESSIONS_SQLITE)
    store = SqliteStore(path)
    _old_session_takes_a_ref(store)
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SQLITE_SCHEMA_VERSION,)
        assert db.execute("SELECT credential_ref FROM sessions").fetchall() == [("r",)]
    assert SQLITE_SCHEMA_VERSION == 2


def test_pg_store_of_schema_1_gains_the_credential_ref_column(pg_url: str) -> None:  # noqa: F811
    """SPEC S6, N1: a database at schema version 1 is migrated to the newest at open and
    keeps its sessions; a row without a reference reads ``None``."""
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute(
            "CREATE TABLE toolbus_schema (version INTEGER PRIMARY KEY, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        db.execute(MIGRATIONS[0][1].encode())
        db.execute("INSERT INTO toolbus_schema (version) VALUES (1)")
        db.execute(
            "INSERT INTO sessions VALUES ('s1', 'h', 'alice', NULL, 'demo', '{}', '{}', "
            "'[]', 0, 0, 0, 1.5, NULL, 'v1')"
        )
    store = PgStore(pg_url)
    _old_session_takes_a_ref(store)
    assert [row.credential_ref for row in store.all_sessions()] == ["r"]
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as db:
        rows = db.execute("SELECT version FROM toolbus_schema ORDER BY version").fetchall()
    assert rows == [(v,) for v in range(1, SCHEMA_VERSION + 1)]


def test_n1_o5_migration_4_is_refused_while_an_older_node_holds_a_live_lease(
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N1, N6, O5: a database at schema 3 whose ``nodes`` table holds a live lease
    of another node (a node of the older toolbus, which would write ``TEXT`` into the
    columns version 4 makes ``BYTEA``), longer than a start waits: the start is refused
    at once with one line naming the nodes, and nothing is migrated. Expired leases do
    not count."""
    at_schema(pg_url, 3)
    lease(pg_url, "old-b", 3600.0)
    lease(pg_url, "old-a", 10 * LEASE_WAIT_S)
    lease(pg_url, "gone-c", -5.0)
    started = time.monotonic()
    with pytest.raises(OlderNodesRunning) as info:
        PgStore(pg_url)
    assert time.monotonic() - started < LEASE_WAIT_S / 2
    assert str(info.value) == older_nodes_message(pg_url, "old-a, old-b")
    assert schema_of(pg_url) == (3, "text")


def test_n1_migration_4_is_refused_when_a_lease_is_renewed_while_the_start_waits(
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N1, N6, O5: a live lease that would run out soon (as a node just stopped
    leaves it) is waited for; a node that renews it meanwhile is running, and the start
    is refused with the same line."""
    at_schema(pg_url, 3)
    lease(pg_url, "old-a", 0.4)
    stop = threading.Event()

    def renew() -> None:  # the older node's lease thread
        while not stop.wait(0.05):
            lease(pg_url, "old-a", 0.4)

    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        with pytest.raises(OlderNodesRunning) as info:
            PgStore(pg_url)
    finally:
        stop.set()
        renewer.join(timeout=10)
    assert str(info.value) == older_nodes_message(pg_url, "old-a")
    assert schema_of(pg_url) == (3, "text")


def test_n1_migration_4_waits_for_the_lease_of_a_node_just_stopped(
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N1, N6: a lease that runs out while the start waits (its node stopped, so
    nothing renews it) lets the migration run: no node is left that writes ``TEXT``."""
    at_schema(pg_url, 3)
    lease(pg_url, "old-a", 0.3)
    PgStore(pg_url).close()
    assert schema_of(pg_url) == (SCHEMA_VERSION, "bytea")


def test_n1_d6_migration_4_keeps_the_rows_written_before_it(pg_url: str) -> None:  # noqa: F811
    """SPEC N1, D6, I15, J3, N3: with the older nodes' leases run out, a schema-3
    database is migrated (``TEXT`` to UTF-8 ``BYTEA``) and what they wrote reads back the
    same: a job with its call id and summary, a ledger row with its tool, a routed
    request's target; a job without them stays without."""
    at_schema(pg_url, 3)
    lease(pg_url, "old-a", -1.0)
    with psycopg.connect(pg_url, autocommit=True) as db:
        for job_id, call_id, summary in (("j1", "c1", "report \u00e9 done"), ("j2", None, None)):
            db.execute(
                'INSERT INTO jobs (job_id, tool, state, session_id, "user", tenant, profile, '
                "call_id, params, context, created_at, started_at, finished_at, summary, "
                "artifacts, result, error, node_id) VALUES (%s, 'report', 'done', 's1', "
                "'alice', NULL, 'demo', %s, %s, '{}', 10.0, 10.0, 11.0, %s, '[]', %s, NULL, "
                "'old-a')",
                (job_id, call_id, b'{"p":1}', summary, b'{"r":1}'),
            )
        db.execute(
            "INSERT INTO call_ledger VALUES ('', 'alice', %s, 'report', 'ab', 'done', %s, "
            "100.0, 'old-a')",
            (b"c1", b'{"type":"result"}'),
        )
        db.execute(
            'INSERT INTO node_requests (kind, session_id, "user", target, decision, '
            "created_at) VALUES ('cancel_call', 's1', 'alice', 'c\u00e9', NULL, 1.0)"
        )
    store = PgStore(pg_url)
    try:
        assert store.job("j1") == JobRow(
            "j1", "report", "done", "s1", "alice", None, "demo", "c1", {"p": 1}, {},
            10.0, 10.0, 11.0, "report \u00e9 done", [], {"r": 1}, None,
        )  # fmt: skip
        second = store.job("j2")
        assert second is not None
        assert (second.call_id, second.summary) == (None, None)
        assert store.ledger("", "alice", "c1") == LedgerRow(
            "", "alice", "c1", "report", "ab", "done", b'{"type":"result"}', 100.0
        )
        assert store.link.read("SELECT target FROM node_requests") == [("c\u00e9".encode(),)]
    finally:
        store.close()
    assert schema_of(pg_url) == (SCHEMA_VERSION, "bytea")


def test_i12_a_call_row_staged_after_its_forget_is_kept(opener: Opener) -> None:
    """SPEC I12 (found in review): within one commit, a session's call record leaves its
    window (`max_call_records`, a forget) and the same call id is staged again (a new
    call): the new row is written; the forget deletes only the row before it."""
    store = opener()
    try:
        store.stage_session(session("s1"))
        store.stage_call("s1", "c1", "done", b'{"old":1}')
        store.commit()
        store.stage_forget_call("s1", "c1")
        store.stage_call("s1", "c1", "running", b'{"tool":"t"}')
        store.commit()
        assert store.call("s1", "c1") == ("running", b'{"tool":"t"}')
        store.stage_forget_call("s1", "c1")
        store.commit()
        assert store.call("s1", "c1") is None
    finally:
        store.close()


def test_d2_a_session_row_staged_after_a_floor_still_trims_the_log(opener: Opener) -> None:
    """SPEC D2 (found with the journaled flushes of issue 13): the log's floor moves
    (the unacked cap or an ack stages the counters), then the session's whole row is
    staged before the next commit (it parks): the row's counters are written and the
    events at or below its floor are still dropped."""
    store = opener()
    try:
        store.stage_session(session("s1"))
        for seq in (1, 2, 3):
            store.stage_event("s1", seq, b'{"seq":%d}' % seq)
        store.commit()
        store.stage_seq("s1", 3, 0, 2)
        store.stage_session(replace(session("s1"), last_seq=3, floor_seq=2, expires_at=9.0))
        store.commit()
        assert [seq for seq, _ in store.events_after("s1", 0)] == [3]
        row = store.load_session("s1")
        assert row is not None
        assert (row.last_seq, row.floor_seq, row.expires_at) == (3, 2, 9.0)
    finally:
        store.close()
