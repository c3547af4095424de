"""Delivery over real sockets: seq, ack, replay, takeover, expiry (SPEC D1-D4)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.demo import handlers
from gateway.server import Gateway
from tests.support import (
    CONVERT,
    MS,
    WAIT,
    Clock,
    barrier,
    closed,
    dropped,
    peer,
    resume_fields,
    running,
    sequenced,
    settings_for,
    signal,
)


async def test_seq_gap_free_across_mixed_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC D1: catalog, tool_start, result, call.error, dispatched, job and approval events
    share one gap-free seq from 1; replies (confirm.result, grants) carry none."""
    monkeypatch.setattr(handlers, "REPORT_SECTION_SECONDS", 0.0)
    async with running(settings_for(tmp_path)) as gw, peer(gw) as p:
        await p.invoke("ok", "convert_units", CONVERT)
        await p.terminal("ok")
        await p.invoke("unknown", "search_web", {"q": "x"})
        assert (await p.terminal("unknown"))["code"] == "unknown_tool"
        await p.invoke("bad", "convert_units", {"value": "1"})
        assert (await p.terminal("bad"))["code"] == "invalid_params"
        await p.invoke("job", "report", {"topic": "x", "sections": 1})
        await p.expect("job.done")
        await p.invoke("gated", "notes_delete", {"note_id": 1})
        start = await p.expect("tool_start", call_id="gated")
        await p.send(
            {
                "type": "tool.confirm",
                "id": "k",
                "approval_id": start["approval_id"],
                "decision": "deny",
            }
        )
        declined = await p.terminal("gated")
        assert declined["type"] == "result"
        assert declined["declined"] is True
        got = p.seen + await barrier(p)
        seqs = sequenced(got)
        assert seqs == list(range(1, len(seqs) + 1))
        types = {msg["type"] for msg in got if "seq" in msg}
        assert types >= {
            "catalog",
            "tool_start",
            "result",
            "call.error",
            "dispatched",
            "job.done",
            "tool.resolved",
        }
        assert all(
            "seq" not in msg
            for msg in got
            if msg["type"] in ("welcome", "confirm.result", "grants")
        )


async def test_replay_exactly_missed_events_in_order_once(gateway: Gateway) -> None:
    """SPEC D3: resume replays every event after last_seq, in order, once; seq stays stable."""
    parked = signal(gateway, "park")
    async with peer(gateway) as p:
        await p.invoke("c1", "convert_units", CONVERT)
        first = await p.terminal("c1")
        await p.invoke("c2", "convert_units", CONVERT)
        await p.invoke("c3", "convert_units", CONVERT)
        async with asyncio.timeout(WAIT):
            while {"c2", "c3"} - {msg.get("call_id") for msg in p.seen if msg["type"] == "result"}:
                await p.recv()
        original = [msg for msg in p.seen if "seq" in msg]
        await dropped(p, parked)
    async with peer(gateway, **resume_fields(p, first["seq"])) as again:
        assert again.welcome["resumed"] is True
        assert again.welcome["last_seq"] == original[-1]["seq"]
        got = [msg for msg in await barrier(again) if "seq" in msg]
        assert got == [msg for msg in original if msg["seq"] > first["seq"]]
        await again.invoke("c4", "convert_units", CONVERT)
        assert (await again.expect("tool_start", call_id="c4"))["seq"] == original[-1]["seq"] + 1


async def test_ack_trims_and_resume_below_floor_is_not_resumed(gateway: Gateway) -> None:
    """SPEC D2/D3: acked events are trimmed; resuming below the acked floor gives resumed false."""
    parked = signal(gateway, "park")
    async with peer(gateway) as p:
        await p.invoke("c1", "convert_units", CONVERT)
        await p.terminal("c1")  # seq 3
        await p.send({"type": "ack", "seq": 3})
        await barrier(p)
        assert [seq for seq, _ in gateway.store.events_after(p.welcome["session_id"], 0)] == []
        await p.invoke("c2", "convert_units", CONVERT)
        await p.terminal("c2")  # seq 5
        await dropped(p, parked)
    async with peer(gateway, **resume_fields(p, 3)) as again:  # at the floor: fine
        assert again.welcome["resumed"] is True
        assert sequenced(await barrier(again)) == [4, 5]
        await dropped(again, parked)
    async with peer(gateway, **resume_fields(p, 2)) as late:  # below the floor
        assert late.welcome["resumed"] is False
        assert late.welcome["session_id"] != p.welcome["session_id"]
        assert late.welcome["last_seq"] == 0
    # The old session is left parked (its own window ends it); a bad resume cancels nothing.
    assert p.welcome["session_id"] in gateway.sessions.sessions


async def test_max_unacked_events_drops_oldest(tmp_path: Path) -> None:
    """SPEC D2: past max_unacked_events the oldest events go; a resume that needs them fails."""
    async with running(settings_for(tmp_path, sessions={"max_unacked_events": 3})) as gw:
        parked = signal(gw, "park")
        async with peer(gw) as p:
            for call_id in ("c1", "c2"):
                await p.invoke(call_id, "convert_units", CONVERT)
                await p.terminal(call_id)
            assert sequenced(p.seen) == [1, 2, 3, 4, 5]
            await dropped(p, parked)
        assert [seq for seq, _ in gw.store.events_after(p.welcome["session_id"], 0)] == [3, 4, 5]
        async with peer(gw, **resume_fields(p, 2)) as again:  # 3..5 still kept
            assert again.welcome["resumed"] is True
            assert sequenced(await barrier(again)) == [3, 4, 5]
            await dropped(again, parked)
        async with peer(gw, **resume_fields(p, 1)) as late:  # seq 2 is gone
            assert late.welcome["resumed"] is False


async def test_wrong_resume_token_gets_new_session(gateway: Gateway) -> None:
    """SPEC D3: a wrong resume_token is not resumed (new session); the real one still works."""
    parked = signal(gateway, "park")
    async with peer(gateway) as p:
        await p.expect("catalog")
        await dropped(p, parked)
    forged = resume_fields(p, 1, resume_token="x" * 43)
    async with peer(gateway, **forged) as other:
        assert other.welcome["resumed"] is False
        assert other.welcome["session_id"] != p.welcome["session_id"]
        assert (await other.expect("catalog"))["seq"] == 1
    async with peer(gateway, token="bob-token", **resume_fields(p, 1)) as bob:  # not alice
        assert bob.welcome["resumed"] is False
        assert bob.welcome["user"] == "bob"
    async with peer(gateway, **resume_fields(p, 1)) as again:
        assert again.welcome["resumed"] is True


async def test_expired_session_is_not_resumed(tmp_path: Path) -> None:
    """SPEC D2/D3: after the resume window a session is gone: resumed false."""
    async with running(settings_for(tmp_path, sessions={"resume_window": 50 * MS})) as gw:
        ended = signal(gw, "end")
        async with peer(gw) as p:
            await p.expect("catalog")
            p.ws.transport.abort()
        async with asyncio.timeout(WAIT):
            await ended.wait()
        async with peer(gw, **resume_fields(p, 1)) as again:
            assert again.welcome["resumed"] is False
            assert again.welcome["session_id"] != p.welcome["session_id"]


async def test_d2_past_its_window_by_the_clock_a_session_is_not_resumed(tmp_path: Path) -> None:
    """SPEC D2, D3: a resume window ends on the gateway's clock, the one the purge reads.
    The clock passes a parked session's `expires_at` while its timer (real time, 60 s)
    has not fired, and the purge deletes its rows. A resume then is not resumed: before,
    the session still in memory was resumed, its row and log gone."""
    clock = Clock()
    settings = settings_for(tmp_path, sessions={"resume_window": 60})
    gw = Gateway(settings, clock=clock)
    await gw.start()
    try:
        parked = signal(gw, "park")
        async with peer(gw) as p:
            await p.expect("catalog")
            await dropped(p, parked)
        sid = p.welcome["session_id"]
        clock.ahead = 61.0
        gw.store.purge(gw.clock(), settings.jobs.retention)
        assert gw.store.load_session(sid) is None
        assert sid in gw.sessions.sessions  # its timer has not fired
        async with peer(gw, **resume_fields(p, 1)) as again:
            assert again.welcome["resumed"] is False
            assert again.welcome["session_id"] != sid
    finally:
        await gw.drain()


async def test_e2_d2_a_session_past_its_window_by_the_clock_no_longer_counts(
    tmp_path: Path,
) -> None:
    """SPEC E2, D2: one session per user. Alice's only session is parked; the gateway's
    clock passes its `expires_at` while its timer (real time, 60 s) has not fired. It is
    over (not resumable, purged), so a new hello is welcomed, and the old session is
    ended then, as its timer would. Before, the hello was refused `too_many_sessions`
    (on several nodes the count already skipped it)."""
    clock = Clock()
    limits = {"max_sessions_per_user": 1}
    settings = settings_for(tmp_path, sessions={"resume_window": 60}, limits=limits)
    gw = Gateway(settings, clock=clock)
    await gw.start()
    try:
        parked = signal(gw, "park")
        async with peer(gw) as p:
            await p.expect("catalog")
            await dropped(p, parked)
        async with peer(gw, hello=False) as early:
            await early.send({"type": "hello", "token": "alice-token", "profile": "demo"})
            refused = await early.recv()
            assert (refused["type"], refused["code"]) == ("error", "too_many_sessions")
        clock.ahead = 61.0
        async with peer(gw) as again:
            assert again.welcome["session_id"] != p.welcome["session_id"]
            assert p.welcome["session_id"] not in gw.sessions.sessions
            assert gw.store.load_session(p.welcome["session_id"]) is None
    finally:
        await gw.drain()


async def test_resume_takes_over_and_closes_old_socket_4000(gateway: Gateway) -> None:
    """SPEC D4: a resume on a second socket takes the session; the first is closed 4000."""
    async with peer(gateway) as first:
        await first.expect("catalog")
        async with peer(gateway, **resume_fields(first, 1)) as second:
            assert second.welcome["resumed"] is True
            info = await closed(first)
            assert info.rcvd is not None
            assert info.rcvd.code == 4000
            await second.invoke("c1", "convert_units", CONVERT)
            result = await second.terminal("c1")
            assert result["seq"] == 3
            assert gateway.sessions.count_for("alice", None) == 1
