"""Session life over real sockets: heartbeats, worker threads, drain, context, bye (SPEC S3-S5)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from gateway.demo import handlers
from gateway.server import Gateway
from tests.support import (
    MS,
    WAIT,
    closed,
    park_signal,
    peer,
    resume_fields,
    running,
    settings_for,
)

# -- S3: heartbeats and worker threads ----------------------------------------------------------


async def test_dead_peer_detected_by_heartbeat_and_parked(tmp_path: Path) -> None:
    """SPEC S3: a peer that stops answering pings is dropped and its session parked, resumable."""
    settings = settings_for(
        tmp_path, server={"heartbeat_interval": 20 * MS, "heartbeat_timeout": 50 * MS}
    )
    async with running(settings) as gw:
        parked = park_signal(gw)
        async with peer(gw) as p:
            await p.expect("catalog")
            p.ws.transport.pause_reading()  # pings go unanswered from now on
            async with asyncio.timeout(WAIT):
                await parked.wait()
            session = gw.sessions.get(p.welcome["session_id"])
            assert session is not None
            assert session.link is None
            assert session.expires_at is not None
            p.ws.transport.abort()
        async with peer(gw, **resume_fields(p, 1)) as again:
            assert again.welcome["resumed"] is True
            assert again.welcome["session_id"] == p.welcome["session_id"]


async def test_plain_handler_runs_in_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC S3: a blocked plain handler (slow_lookup) does not stop another session's call."""
    entered, release = threading.Event(), threading.Event()
    threads: list[str] = []

    def blocking_lookup(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        entered.set()
        release.wait(WAIT)
        return {"query": params["query"]}

    monkeypatch.setattr(handlers, "slow_lookup", blocking_lookup)
    async with (
        running(settings_for(tmp_path)) as gw,
        peer(gw) as a,
        peer(gw, token="bob-token") as b,
    ):
        await a.invoke("slow", "slow_lookup", {"query": "tides"})
        assert await asyncio.to_thread(entered.wait, WAIT)  # the handler is now blocked
        await b.invoke("quick", "convert_units", {"value": 2, "from_unit": "km", "to_unit": "m"})
        quick = await b.terminal("quick")
        assert quick["type"] == "result"
        assert quick["result"]["result"] == 2000.0
        release.set()
        slow = await a.terminal("slow")
        assert slow["type"] == "result"
        assert slow["result"] == {"query": "tides"}
        assert threads
        assert threads[0].startswith("toolbus-calls-")


# -- S4: drain --------------------------------------------------------------------------------


async def test_drain_sends_reconnect_then_1012_and_state_survives(tmp_path: Path) -> None:
    """SPEC S4: drain sends every socket reconnect then close 1012; a new server resumes it."""
    settings = settings_for(tmp_path, server={"drain_retry_after": 2.5})
    gw = Gateway(settings)
    await gw.start()
    async with peer(gw) as a, peer(gw, token="bob-token") as b:
        await a.invoke("c1", "convert_units", {"value": 1, "from_unit": "m", "to_unit": "mm"})
        await a.terminal("c1")
        await b.expect("catalog")
        drain = asyncio.get_running_loop().create_task(gw.drain())
        for p in (a, b):
            hint = await p.expect("reconnect")
            assert hint == {"type": "reconnect", "reason": "server restart", "retry_after": 2.5}
            error = await closed(p)
            assert error.rcvd is not None
            assert error.rcvd.code == 1012
        async with asyncio.timeout(WAIT):
            await drain
        assert gw.ready is False
    again = Gateway(settings)
    await again.start()
    try:
        async with peer(again, **resume_fields(a, 3)) as p:
            assert p.welcome["resumed"] is True
            assert p.welcome["last_seq"] == 3
            await p.invoke("c2", "convert_units", {"value": 1, "from_unit": "m", "to_unit": "mm"})
            assert (await p.terminal("c2"))["seq"] == 5
            await p.invoke("c1", "convert_units", {"value": 1, "from_unit": "m", "to_unit": "mm"})
            recorded = await p.terminal("c1")  # SPEC I12 across the restart
            assert recorded["seq"] == 3
            assert recorded["result"]["result"] == 1000.0
    finally:
        await again.drain()


# -- S5: context updates ------------------------------------------------------------------------


async def test_context_update_pushes_refiltered_catalog(gateway: Gateway) -> None:
    """SPEC S5/C3: linking a project answers context and pushes a catalog with project_summary."""
    async with peer(gateway) as p:
        initial = await p.expect("catalog")
        assert "project_summary" not in {t["name"] for t in initial["tools"]}
        await p.send({"type": "context.update", "id": "u1", "context": {"project_id": "p7"}})
        assert await p.expect("context") == {
            "type": "context",
            "id": "u1",
            "context": {"project_id": "p7"},
        }
        pushed = await p.expect("catalog")
        assert pushed["reason"] == "context"
        assert pushed["seq"] == 2
        assert pushed["version"] != initial["version"]
        assert "project_summary" in {t["name"] for t in pushed["tools"]}
        await p.invoke("c1", "project_summary", {})
        result = await p.terminal("c1")
        assert result["type"] == "result"
        assert result["result"]["project_id"] == "p7"
        # Removing the key hides the tool again; an unchanged context pushes nothing.
        await p.send({"type": "context.update", "id": "u2", "context": {"project_id": None}})
        assert (await p.expect("context"))["context"] == {}
        hidden = await p.expect("catalog", reason="context")
        assert hidden["version"] == initial["version"]
        await p.send({"type": "context.update", "id": "u3", "context": {}})
        await p.expect("context", id="u3")
        await p.send({"type": "grants.list", "id": "g"})
        await p.expect("grants", id="g")
        assert [m["type"] for m in p.seen[-2:]] == ["context", "grants"]


# -- bye ------------------------------------------------------------------------------------


async def test_bye_closes_4001_and_ends_session(gateway: Gateway) -> None:
    """SPEC A4 / protocol: bye closes 4001 and the session cannot be resumed."""
    async with peer(gateway) as p:
        await p.expect("catalog")
        await p.send({"type": "bye", "id": "b1"})
        error = await closed(p)
        assert error.rcvd is not None
        assert error.rcvd.code == 4001
    assert p.welcome["session_id"] not in gateway.sessions.sessions
    async with peer(gateway, **resume_fields(p, 1)) as again:
        assert again.welcome["resumed"] is False
        assert again.welcome["session_id"] != p.welcome["session_id"]
