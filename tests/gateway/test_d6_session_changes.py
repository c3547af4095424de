"""SPEC D1, D6 with A3, A4, S5, J3: a request that changes a session is answered as done
only once the change is durable. While SQLite commits fail (another process holds the
file), ``context.update`` is made durable by a journal entry of its own and survives a
SIGKILL; on a store that can make it durable neither way (no journal, commits failing),
``context.update``, ``grants.revoke``, ``bye``, ``auth.refresh`` and ``job.cancel`` are
refused ``unavailable`` and nothing changes.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import sqlite3
from pathlib import Path
from typing import Any, cast

import pytest

from gateway.server import Gateway
from gateway.store import SessionRow, SqliteStore, Store, StoreUnavailable
from tests.gateway import proto_tools
from tests.gateway.store_faults import FlakyStore, until
from tests.gateway.test_j6_crash_decided import commits_failing
from tests.support import (
    WAIT,
    Peer,
    barrier,
    gateway_script,
    peer,
    peer_at,
    resume_fields,
    running,
    script_server,
    settings_for,
)


async def _reply(p: Peer, request_id: str) -> dict[str, Any]:
    """The first frame answering ``request_id`` (its reply or an ``error``)."""
    async with asyncio.timeout(WAIT):
        while True:
            msg = await p.recv()
            if msg.get("id") == request_id:
                return msg


async def test_s5_d6_a_context_change_confirmed_in_a_store_outage_survives_a_crash(
    tmp_path: Path,
) -> None:
    """SPEC S5, D1, D6: a ``context.update`` answered ``context`` while another process
    locks the SQLite file holds after a SIGKILL and a restart: the resumed session has
    the new context (it was journaled, not only staged)."""
    script = gateway_script("tests.support:settings_for")
    db = tmp_path / "data" / "toolbus.db"
    async with (
        script_server(script, str(tmp_path)) as srv,
        peer_at(f"ws://127.0.0.1:{srv.port}/") as a,
    ):
        await barrier(a)  # welcome came once the session row was durable
        async with commits_failing(db, a, srv.port):
            change = {"type": "context.update", "id": "cx", "context": {"project_id": "p7"}}
            await a.send(change)
            reply = await _reply(a, "cx")
            assert reply["type"] == "context", reply
            assert reply["context"]["project_id"] == "p7"
            await srv.crash()
    last = max(msg["seq"] for msg in a.seen if "seq" in msg)
    async with running(settings_for(tmp_path)) as gw, peer(gw, hello=False) as again:
        await again.hello(**resume_fields(a, last))
        assert again.welcome["resumed"] is True
        await again.send({"type": "context.update", "id": "now", "context": {}})
        assert (await _reply(again, "now"))["context"].get("project_id") == "p7"


async def _no_journal_gateway(tmp_path: Path) -> tuple[Gateway, FlakyStore]:
    """A gateway on an in-memory SQLite store (no journal) whose commits fail once
    ``failure_rate`` is set to 1.0: nothing can be made durable then (as on PostgreSQL
    with its connection lost, SPEC N7)."""
    settings = settings_for(tmp_path, store={"unavailable_after": 0.05, "retry_max": 0.01})
    flaky = FlakyStore(SqliteStore(":memory:"), random.Random(7), failure_rate=0.0)
    gw = Gateway(settings, store=cast(Store, flaky))
    await gw.start()
    return gw, flaky


async def test_a3_a4_s5_d6_session_changes_the_store_cannot_keep_are_refused(
    tmp_path: Path,
) -> None:
    """SPEC A3, A4, S5, S6, D6: with no journal and every commit failing,
    ``context.update``, ``grants.revoke``, ``bye`` and ``auth.refresh`` are answered
    ``unavailable`` and change nothing: the context and the grant stay, the socket stays
    open; once commits succeed, ``auth.refresh`` is answered and ``bye`` closes 4001."""
    gw, flaky = await _no_journal_gateway(tmp_path)
    try:
        async with peer(gw) as a:
            await a.invoke("d1", "notes_delete", {"note_id": 1})
            start = await a.expect("tool_start", call_id="d1")
            confirm = {"type": "tool.confirm", "approval_id": start["approval_id"]}
            await a.send({**confirm, "decision": "allow_always"})
            await barrier(a)
            await a.send({"type": "grants.list", "id": "g0"})
            assert (await _reply(a, "g0"))["tools"] == ["notes_delete"]
            flaky.failure_rate = 1.0
            await until(lambda: gw.outbox.unavailable, "the store declared unavailable")
            await a.send({"type": "context.update", "id": "cx", "context": {"project_id": "p"}})
            await a.send({"type": "grants.revoke", "id": "rv", "tool": "notes_delete"})
            await a.send({"type": "bye", "id": "bye"})
            await a.send({"type": "auth.refresh", "id": "ar", "token": "alice-token"})
            await a.send({"type": "grants.list", "id": "gl"})
            await a.send({"type": "context.update", "id": "now", "context": {}})
            ids = ("cx", "rv", "bye", "ar", "gl", "now")
            replies = [await _reply(a, rid) for rid in ids]
            codes = [r.get("code") for r in replies[:4]]
            assert codes == ["unavailable"] * 4, replies
            assert replies[4]["tools"] == ["notes_delete"]
            assert "project_id" not in replies[5]["context"]
            flaky.failure_rate = 0.0
            await until(lambda: gw.outbox.failing_since is None, "a good commit")
            await a.send({"type": "auth.refresh", "id": "ar2", "token": "alice-token"})
            assert (await _reply(a, "ar2"))["type"] == "auth.refreshed"
            await a.send({"type": "bye", "id": "bye2"})
            async with asyncio.timeout(WAIT):
                await a.ws.wait_closed()
            assert a.ws.close_code == 4001
    finally:
        await gw.drain()


async def test_j3_d6_a_cancel_the_store_cannot_keep_is_refused_and_the_job_goes_on(
    tmp_path: Path,
) -> None:
    """SPEC J3, J6, D6: a ``job.cancel`` while nothing can be made durable is answered
    ``unavailable`` and cancels nothing: the queued job stays ``queued`` and runs once
    a slot frees; a ``job.cancel`` after the store recovered is answered with the job's
    stored ``cancelled`` state."""
    settings = proto_tools.one_job_at_a_time(tmp_path)
    flaky = FlakyStore(SqliteStore(":memory:"), random.Random(7), failure_rate=0.0)
    gw = Gateway(settings, store=cast(Store, flaky))
    await gw.start()
    try:
        async with peer(gw) as a:
            await a.invoke("j1", "hold_job", {})
            await a.invoke("j2", "mark_job", {})
            await a.invoke("j3", "mark_job", {})
            j2 = (await a.expect("dispatched", call_id="j2"))["job_id"]
            j3 = (await a.expect("dispatched", call_id="j3"))["job_id"]
            flaky.failure_rate = 1.0
            await a.send({"type": "job.cancel", "id": "cx", "job_id": j2})
            refused = await _reply(a, "cx")
            assert (refused["type"], refused.get("code")) == ("error", "unavailable")
            assert gw.jobs.active[j2].row.state == "queued"
            flaky.failure_rate = 0.0
            await until(lambda: gw.outbox.failing_since is None, "a good commit")
            await a.send({"type": "job.cancel", "id": "cx3", "job_id": j3})
            cancelled = await _reply(a, "cx3")
            assert (cancelled["type"], cancelled["job"]["state"]) == ("job", "cancelled")
    finally:
        await gw.drain()


def _row(session_id: str, grants: list[str], context: dict[str, str]) -> SessionRow:
    """A stored session of alice's with ``grants`` and ``context``."""
    return SessionRow(
        session_id, "hash", "alice", None, "demo", context, {}, grants, 0, 0, 0, 1.0, None, None
    )


def test_d6_session_changes_journaled_while_commits_fail_survive_a_restart(
    tmp_path: Path,
) -> None:
    """SPEC D6, A3, A4, S5: while another connection holds the file's write lock (every
    commit fails), a session's new grants and context (``journal_session``) and another
    session's end (``journal_delete``) are journaled; a store opened on the files as
    they are then (what a kill leaves) has both changes."""
    path = tmp_path / "toolbus.db"
    store = SqliteStore(path, checkpoint_interval=3600)
    store.stage_session(_row("s_kept", ["notes_delete"], {}))
    store.stage_session(_row("s_ended", [], {}))
    store.commit()
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    try:
        changed = _row("s_kept", [], {"project_id": "p7"})
        store.stage_session(changed)
        store.delete_session("s_ended")
        with pytest.raises(StoreUnavailable):
            store.commit()
        assert store.journal_session(changed) is True
        assert store.journal_delete("s_ended") is True
        crashed = tmp_path / "crashed"  # the files as a kill leaves them now
        crashed.mkdir()
        for suffix in ("", "-wal", "-intent"):
            shutil.copy(f"{path}{suffix}", crashed / f"toolbus.db{suffix}")
    finally:
        locker.execute("ROLLBACK")
        locker.close()
        store.close()
    again = SqliteStore(crashed / "toolbus.db", checkpoint_interval=3600)
    try:
        kept = again.load_session("s_kept")
        assert kept is not None
        assert (kept.grants, kept.context) == ([], {"project_id": "p7"})
        assert again.load_session("s_ended") is None
    finally:
        again.close()
