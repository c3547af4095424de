"""A running server whose PostgreSQL connection is lost (SPEC N7, D6): a request that
needs a read is refused ``unavailable``, nothing unstored is sent, and the server
recovers by itself."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gateway.store_pg import PgStore
from tests.gateway.test_store_backends import terminate
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import (
    CONVERT,
    MS,
    WAIT,
    Peer,
    closed,
    dropped,
    park_signal,
    peer,
    resume_fields,
    running,
    settings_for,
)


async def _answer(p: Peer, call_id: str) -> dict[str, Any]:
    """The terminal event of ``call_id`` or the ``error`` refusing it, whichever comes."""
    while True:
        message = await p.recv()
        if message["type"] == "error" and message.get("details") == {"call_id": call_id}:
            return message
        if message.get("call_id") == call_id and message["type"] in ("result", "call.error"):
            return message


async def test_lost_connection_mid_session_recovers(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N7, D6: the database ends the server's connection between two calls. The next
    call is refused a typed ``unavailable`` (it needed a read) or held until the store is
    back; re-sent, it completes; the log stays gap-free and in order."""
    async with running(settings_for(tmp_path, store={"url": pg_url})) as gw, peer(gw) as p:
        assert isinstance(gw.store, PgStore)
        await p.invoke("c1", "convert_units", CONVERT)
        first = await p.terminal("c1")
        terminate(gw.store)
        refusals = []
        async with asyncio.timeout(WAIT):
            while True:
                await p.invoke("c2", "convert_units", CONVERT)
                answer = await _answer(p, "c2")
                if answer["type"] == "result":
                    break
                refusals.append(answer)
                await asyncio.sleep(10 * MS)  # a poll: the store reconnects on a thread
        assert refusals[0] == {
            "type": "error",
            "code": "unavailable",
            "message": "the store cannot be read right now; try again later",
            "details": {"call_id": "c2"},
        }
        assert {r["code"] for r in refusals} == {"unavailable"}
        assert answer["seq"] == first["seq"] + 2  # tool_start, result: no gap, no extra
        assert [seq for seq, _ in gw.store.events_after(p.welcome["session_id"], 0)] == list(
            range(1, answer["seq"] + 1)
        )


async def test_resume_while_the_connection_is_lost_is_refused_typed(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N7, D6: a resume needs a read of the log; with the database connection lost it
    is refused ``unavailable`` and closed 1013, never 1011; a later resume replays whole."""
    async with running(settings_for(tmp_path, store={"url": pg_url})) as gw:
        assert isinstance(gw.store, PgStore)
        parked = park_signal(gw)
        async with peer(gw) as p:
            await p.invoke("c1", "convert_units", CONVERT)
            result = await p.terminal("c1")
            await dropped(p, parked)
        gw.outbox.flush()  # the park is committed: nothing staged needs the connection
        terminate(gw.store)
        async with peer(gw, hello=False) as again:
            await again.send({"type": "hello", "token": "alice-token", "profile": "demo",
                              **resume_fields(p, 1)})  # fmt: skip
            assert await again.recv() == {
                "type": "error",
                "code": "unavailable",
                "message": "the store cannot be read right now; try again later",
            }
            assert (await closed(again)).rcvd.code == 1013
        async with asyncio.timeout(WAIT):
            while True:  # a poll: the store reconnects on a thread
                async with peer(gw, hello=False) as back:
                    await back.send({"type": "hello", "token": "alice-token",
                                     "profile": "demo", **resume_fields(p, 1)})  # fmt: skip
                    first = await back.recv()
                    if first["type"] == "welcome":
                        assert first["resumed"] is True
                        replayed = [await back.recv() for _ in range(result["seq"] - 1)]
                        assert replayed[-1] == result
                        break
                    assert first["code"] == "unavailable"
                await asyncio.sleep(10 * MS)
