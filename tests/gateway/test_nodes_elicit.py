"""A mounted MCP server's question during a call on node A, answered on node B (SPEC N3,
M3): the client resumed on B while the call waits on A for the answer.

Two real ``toolbus serve`` nodes share one PostgreSQL schema; each mounts the real MCP
server ``tests/mcp/elicit_server.py`` (tool ``asker_ask``, which sends
``elicitation/create`` and answers with what came back).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import yaml
from websockets.asyncio.client import connect

from tests.gateway.node_tools import START, Node, node_config
from tests.mcp.support import asker_mount
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import Peer, barrier, resume_fields, spawn_serve

SUB: Any = ["toolbus.v1"]
ADA = {"name": "Ada", "email": "ada@example.org", "age": 36}
MADE_UP = "el_" + "A" * 22


@asynccontextmanager
async def asker_nodes(folder: Path, url: str, *names: str) -> AsyncIterator[list[Node]]:
    """One ``toolbus serve`` per name on the store ``url``, each mounting the asker MCP
    server under profile ``demo``; all stopped after (killed when the test failed: a
    drain would wait out a question nobody answers and hide the failure)."""
    started: list[Node] = []
    failed = False
    try:
        for name in names:
            config = node_config(folder, url, name)  # writes the default catalog...
            catalog = {"tools": [], "mcp_servers": [asker_mount()]}
            (folder / "tools.yaml").write_text(yaml.safe_dump(catalog))  # ...replaced here
            profiles = {"profiles": {"demo": {"capabilities": ["asker"]}}}
            (folder / "profiles.yaml").write_text(yaml.safe_dump(profiles))
            proc = await spawn_serve("--config", str(config))
            assert proc.stdout is not None
            async with asyncio.timeout(START):
                banner = (await proc.stdout.readline()).decode()
            started.append(Node(proc, banner.split()[3]))
        yield started
    except BaseException:
        failed = True
        raise
    finally:
        for node in started:
            if failed and node.proc.returncode is None:
                node.proc.kill()
            await node.stop()


async def _asker_listed(p: Peer) -> None:
    """Wait for a catalog that lists ``asker_ask`` (the mount connects after the start)."""
    tools: list[dict[str, Any]] = (await p.expect("catalog"))["tools"]
    while not any(t["name"] == "asker_ask" for t in tools):
        tools = (await p.expect("catalog"))["tools"]


async def _answer(p: Peer, rid: str, elicitation_id: str, **fields: Any) -> tuple[Any, Any]:
    """Send ``elicit.answer`` (``accept`` unless told); ``(accepted, reason)`` of its reply."""
    fields.setdefault("action", "accept")
    await p.send({"type": "elicit.answer", "id": rid, "elicitation_id": elicitation_id, **fields})
    got = await p.expect("elicit.result", id=rid)
    assert got["elicitation_id"] == elicitation_id
    return got["accepted"], got.get("reason")


def _routed_to(url: str, elicitation_id: str) -> int:
    """Rows in ``node_requests`` for ``elicitation_id`` (a routed answer no node holds
    stays there for ``REQUEST_TTL`` s: SPEC N3)."""
    with psycopg.connect(url, autocommit=True) as db:
        row = db.execute(
            "SELECT count(*) FROM node_requests WHERE target=%s", (elicitation_id.encode(),)
        ).fetchone()
    assert row is not None
    return int(row[0])


async def test_n3_m3_question_asked_on_a_is_answered_on_b_once(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N3, M3, A3, A7: the MCP tool of call ``e1`` on A asks its user; the client
    resumes on B, which replays the ``elicit.request``. On B, a made-up id and the real
    id answered from another session of the same user are ``unknown`` (not routed); the
    session's own answer is accepted and reaches the tool on A, a repeat of it is
    ``already_decided``; the call's one result, made from the accepted answer, arrives
    on B, gap-free."""
    async with asker_nodes(tmp_path, pg_url, "a", "b") as (a, b):
        async with connect(a.url, subprotocols=SUB) as ws_a:
            on_a = Peer(ws_a)
            await on_a.hello()
            await _asker_listed(on_a)
            await on_a.invoke("e1", "asker_ask", {"topic": "lunch"})
            asked = await on_a.expect("elicit.request", call_id="e1")
        elicitation_id = asked["elicitation_id"]
        async with (
            connect(b.url, subprotocols=SUB) as ws_b,
            connect(b.url, subprotocols=SUB) as ws_other,
        ):
            on_b, other = Peer(ws_b), Peer(ws_other)
            welcome = await on_b.hello(**resume_fields(on_a, asked["seq"] - 1))
            assert welcome["resumed"] is True
            replayed = await on_b.expect("elicit.request", call_id="e1")
            assert (replayed["seq"], replayed["elicitation_id"]) == (asked["seq"], elicitation_id)
            await other.hello()  # alice again: another session of the same user, on B
            assert await _answer(on_b, "x1", MADE_UP, content=ADA) == (False, "unknown")
            assert _routed_to(pg_url, MADE_UP) == 0  # not routed: nothing waits for it
            mallory = {"content": {**ADA, "name": "Mallory"}}
            assert await _answer(other, "x2", elicitation_id, **mallory) == (False, "unknown")
            assert await _answer(on_b, "ok", elicitation_id, content=ADA) == (True, None)
            again = await _answer(on_b, "x3", elicitation_id, action="decline")
            assert again == (False, "already_decided")
            result = await on_b.terminal("e1")
            assert result["type"] == "result"
            assert result["result"]["text"].startswith("accept {")
            assert '"name": "Ada"' in result["result"]["text"]
            await barrier(on_b)
        events = [msg for msg in on_b.seen if "seq" in msg]
        seqs = [msg["seq"] for msg in events]
        assert seqs == list(range(asked["seq"], seqs[-1] + 1))
        kinds = [msg["type"] for msg in events]
        assert (kinds.count("elicit.request"), kinds.count("result")) == (1, 1)
        assert not [msg for msg in other.seen if msg.get("call_id") == "e1"]
