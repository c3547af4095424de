"""The fencing token on the PostgreSQL store itself (SPEC N2, N3, D1): two stores as two
nodes, no notifications involved, so the guarantee holds whether or not a NOTIFY
arrives."""

from __future__ import annotations

import dataclasses

import psycopg
import pytest

from gateway.pg_fence import Fence, claim_all
from gateway.store import StoreUnavailable
from gateway.store_pg import PgStore
from gateway.store_rows import SessionRow
from tests.pg_support import admin, pg_url  # noqa: F401 (fixture)


def _row(sid: str) -> SessionRow:
    return SessionRow(sid, "h", "alice", None, "demo", {}, {}, [], 0, 0, 0, 1.5, None, None)


def _node(url: str, name: str, fenced: list[str]) -> PgStore:
    """A store with a fence, as node ``name`` with a lease that does not expire."""
    store = PgStore(url)
    store.fence = Fence(name, fenced.append)
    store.link.execute(
        "INSERT INTO nodes (node_id, lease_until, started_at) VALUES (%s, 1e12, 0)", (name,)
    )
    return store


def test_n2_a_fenced_commit_writes_nothing_of_the_session_and_forwards_its_events(
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N2, N3: after B took the session over, A's next commit stores none of A's
    events, row or counters for it (the log stays B's, gap-free), puts A's events in the
    inbox for B, still commits A's other sessions, and tells A it lost the session."""
    lost_a: list[str] = []
    a, b = _node(pg_url, "a", lost_a), _node(pg_url, "b", [])
    a.stage_session(_row("s1"))
    a.stage_session(_row("s2"))
    a.stage_event("s1", 1, b'{"type":"catalog","seq":1}')
    a.commit()
    taken = b.take_over("s1")
    assert taken is not None
    row, took = taken
    assert (row.last_seq, took.previous, took.epoch, took.kept) == (1, "a", 2, False)
    b.stage_event("s1", 2, b'{"type":"result","seq":2}')
    b.commit()
    a.stage_event("s1", 2, b'{"type":"job.done","seq":2}')
    a.stage_seq("s1", 2, 2, 2)
    a.stage_event("s2", 1, b'{"type":"catalog","seq":1}')
    a.commit()
    assert lost_a == ["s1"]
    assert b.events_after("s1", 0) == [
        (1, b'{"type":"catalog","seq":1}'),
        (2, b'{"type":"result","seq":2}'),
    ]
    assert b.load_session("s1") is not None
    assert b.events_after("s2", 0) == [(1, b'{"type":"catalog","seq":1}')]
    assert [(sid, body) for _, sid, body in b.inbox(10)] == [("s1", b'{"type":"job.done","seq":2}')]
    assert a.inbox(10) == []  # A owns none of it
    a.close()
    b.close()


def test_n3_an_inbox_row_is_consumed_once_even_when_its_reader_is_fenced(
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N3: the owner emits an inbox row and deletes it in the same commit; an owner
    fenced before that commit drops the event and leaves the row for the next owner."""
    a, b, c = _node(pg_url, "a", []), _node(pg_url, "b", []), _node(pg_url, "c", [])
    a.stage_session(_row("s1"))
    a.commit()
    assert b.take_over("s1") is not None
    a.stage_event("s1", 5, b'{"type":"job.done","seq":5}')
    a.commit()  # fenced: forwarded to b
    [(row_id, _, body)] = b.inbox(10)
    b.stage_event("s1", 1, body)
    b.fence.consumed(row_id, "s1", 1)  # type: ignore[union-attr]
    assert c.take_over("s1") is not None  # c takes over before b commits
    b.commit()  # fenced: the event is dropped, the row stays
    assert c.events_after("s1", 0) == []
    assert [r[2] for r in c.inbox(10)] == [b'{"type":"job.done","seq":5}']
    [(row_id, _, body)] = c.inbox(10)
    c.stage_event("s1", 1, body)
    c.fence.consumed(row_id, "s1", 1)  # type: ignore[union-attr]
    c.commit()
    assert c.events_after("s1", 0) == [(1, b'{"type":"job.done","seq":5}')]
    assert c.inbox(10) == []
    for store in (a, b, c):
        store.close()


def test_n4_a_node_declared_dead_forwards_nothing(pg_url: str) -> None:  # noqa: F811
    """SPEC N4, D1: once another node claimed this node's work (its ``nodes`` row is
    gone), a commit that would forward its events fails, writes nothing, and every later
    commit fails too: the claimer settled that work."""
    a, b = _node(pg_url, "a", []), _node(pg_url, "b", [])
    a.stage_session(_row("s1"))
    a.commit()
    assert b.take_over("s1") is not None
    b.link.execute("DELETE FROM nodes WHERE node_id='a'", ())
    a.stage_event("s1", 2, b'{"type":"job.done","seq":2}')
    with pytest.raises(StoreUnavailable):
        a.commit()
    assert a.fence is not None
    assert a.fence.dead
    assert b.inbox(10) == []
    with pytest.raises(StoreUnavailable):
        a.commit()
    a.close()
    b.close()


def test_n4_a_dead_nodes_claim_leaves_a_session_its_client_resumed_elsewhere(
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N4, N2: node A died holding s1 and s2; s1's client already resumed on B when
    C claims A's work. C takes s2 over (still A's) but not s1: B keeps it, its token
    unchanged, and B's next commit of s1 is not fenced."""
    lost_b: list[str] = []
    a, b, c = _node(pg_url, "a", []), _node(pg_url, "b", lost_b), _node(pg_url, "c", [])
    a.stage_session(_row("s1"))
    a.stage_session(_row("s2"))
    a.commit()
    assert b.take_over("s1") is not None  # the client resumed on B
    assert c.take_over("s1", only_from="a") is None
    taken = c.take_over("s2", only_from="a")
    assert taken is not None
    assert taken[1].previous == "a"
    b.stage_event("s1", 1, b'{"type":"result","seq":1}')
    b.commit()
    assert lost_b == []
    assert b.events_after("s1", 0) == [(1, b'{"type":"result","seq":1}')]
    for store in (a, b, c):
        store.close()


def test_n2_a_commit_checking_a_session_never_waits_for_its_owners_row_updates(
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N2, N3, D6: A forwards events of s1, which B now holds. While A's commit has
    checked s1 (its transaction open, the check's lock held), B's commits of s1 (an
    event, its counters, its session row) go through at once: the check's lock (``FOR
    KEY SHARE``) does not conflict with the owner's row updates. With ``FOR SHARE``,
    B's `UPDATE` waited for A's transaction and failed at ``lock_timeout`` (100 ms): under
    load, a commit failed that had nothing to wait for. A take-over still waits for the
    check (the fencing order): C's fails while A's transaction is open, succeeds after."""
    a, b, c = _node(pg_url, "a", []), _node(pg_url, "b", []), _node(pg_url, "c", [])
    a.stage_session(_row("s1"))
    a.commit()
    assert b.take_over("s1") is not None
    fence = a.fence
    assert fence is not None
    db = a.link.conn()
    with db.transaction(), db.cursor() as cur:
        assert fence.check(cur, {"s1"}) == {"s1": "b"}  # A sees it fenced, holds the lock
        b.stage_event("s1", 1, b'{"type":"result","seq":1}')
        b.stage_seq("s1", 1, 1, 0)
        b.stage_session(_row("s1"))
        b.commit()  # no wait: StoreUnavailable here with FOR SHARE
        with pytest.raises(StoreUnavailable, match="lock timeout"):
            c.take_over("s1")  # waits on A's check until lock_timeout
    assert b.events_after("s1", 0) == [(1, b'{"type":"result","seq":1}')]
    taken = c.take_over("s1")
    assert taken is not None
    assert (taken[1].previous, taken[1].epoch) == ("b", 3)
    for store in (a, b, c):
        store.close()


def test_n4_a_node_claiming_every_session_waits_for_a_commit_checking_one(
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N4, N2: a node that starts alone claims every stored session
    (:func:`gateway.pg_fence.claim_all`). A commit of a node that is still checking one
    of them (a node declared dead that still runs) holds the check's lock: the claim
    waits for it, as a take-over does, and fails at ``lock_timeout`` while it is held;
    once it ends, the claim raises every epoch."""
    a, c = _node(pg_url, "a", []), _node(pg_url, "c", [])
    a.stage_session(_row("s1"))
    a.stage_session(_row("s2"))
    a.commit()
    fence = a.fence
    assert fence is not None
    db, other = a.link.conn(), c.link.conn()
    with db.transaction(), db.cursor() as cur:
        assert fence.check(cur, {"s1"}) == {}  # A's own session: held, checked
        with pytest.raises(psycopg.errors.LockNotAvailable), other.transaction():
            claim_all(other, "c")
    with other.transaction():
        assert claim_all(other, "c") == {"s1": 2, "s2": 2}
    for store in (a, c):
        store.close()


def test_n4_a_forwarding_commit_never_waits_for_its_nodes_lease_renewal(
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N3, N4, D6: a commit that forwards events first reads its own ``nodes`` row
    (a node declared dead forwards nothing). While a lease renewal of that row (an
    `UPDATE` of ``lease_until``, as the node's lease connection runs every
    ``lease_interval``) is in flight, the forward goes through: the read is ``FOR KEY
    SHARE``. With ``FOR SHARE`` it waited for the renewal and failed at ``lock_timeout``."""
    a, b = _node(pg_url, "a", []), _node(pg_url, "b", [])
    a.stage_session(_row("s1"))
    a.commit()
    assert b.take_over("s1") is not None
    renewal = b.link.conn()  # any other connection: the lease has one of its own
    with renewal.transaction():
        renewal.execute("UPDATE nodes SET lease_until = 2e12 WHERE node_id = 'a'")
        a.stage_event("s1", 2, b'{"type":"job.done","seq":2}')
        a.commit()  # forwarded: StoreUnavailable here with FOR SHARE
    assert [(sid, body) for _, sid, body in b.inbox(10)] == [("s1", b'{"type":"job.done","seq":2}')]
    a.close()
    b.close()


def test_d2_a_session_resumed_after_the_purge_read_it_keeps_its_row_and_log(
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC D2, D3, N2: node B's purge reads s1 as expired (its row's ``expires_at`` has
    passed), but its commit fails: another connection holds ``LOCK TABLE jobs`` (the
    purge's job retention deletes from it). Meanwhile s1's node A resumes it and commits
    its row with ``expires_at`` cleared. When B's commit goes through, s1 keeps its row
    and its events; s2, still expired, is deleted with its events. Before, the purge's
    `DELETE` did not look at ``expires_at`` again and removed the live session's log."""
    a, b = _node(pg_url, "a", []), _node(pg_url, "b", [])
    for sid in ("s1", "s2"):
        a.stage_session(dataclasses.replace(_row(sid), expires_at=10.0))
        a.stage_event(sid, 1, b'{"type":"catalog","seq":1}')
    a.commit()
    schema = pg_url.split("search_path%3D")[1]
    with admin() as locker:
        with locker.transaction():
            locker.execute(f"LOCK TABLE {schema}.jobs IN ACCESS EXCLUSIVE MODE")
            b.purge(now=20.0, job_retention=5.0)  # reads s1 and s2; its commit fails
            assert b.dirty
            a.stage_session(_row("s1"))  # resumed: expires_at None
            a.commit()
        b.commit()
    assert b.load_session("s1") is not None
    assert b.events_after("s1", 0) == [(1, b'{"type":"catalog","seq":1}')]
    assert b.load_session("s2") is None
    assert b.events_after("s2", 0) == []
    a.close()
    b.close()
