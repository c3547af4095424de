"""A call whose approval was just decided commits at once and runs in the same loop
turn, so its ``result`` leaves in one write with ``confirm.result`` and
``tool.resolved`` (SPEC A3, A6, D1, I15; issue 13, P7).

Before, the decided call waited for the tick's flush: that flush sent ``confirm.result``
and ``tool.resolved`` alone, the handler ran one turn later and its ``result`` went in a
second write, a second wake-up of the client. The decision is still committed before
the handler starts (``test_a3_an_allowed_call_killed_in_its_handler_stays_allowed``
kills the process in the handler). Checked on a real gateway: the handler notes how
many frames wait in the outbox when it starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gateway import ledger_tools as lt
from tests.pg_support import fresh_schema
from tests.support import peer, running


async def _decided(tmp_path: Path, decision: str) -> tuple[list[int], list[str], str]:
    """Invoke ``gated_peek`` and answer its approval; return what the handler saw
    queued, the types of the frames that followed the decision, and the store."""
    gate = lt.reset()
    settings = lt.ledger_settings(tmp_path)
    async with running(settings) as gw, peer(gw, options={"tool_start": "gated"}) as p:
        gate.outbox = gw.outbox
        await p.invoke("g1", "gated_peek")
        start = await p.expect("tool_start", call_id="g1")
        confirm = {"type": "tool.confirm", "approval_id": start["approval_id"]}
        await p.send({**confirm, "id": "r1", "decision": decision})
        await p.terminal("g1")
        after = p.seen[p.seen.index(start) + 1 :]
        store = type(gw.store).__name__
    return gate.queued, [m["type"] for m in after], store


async def test_a3_an_allowed_calls_result_leaves_with_its_resolution(tmp_path: Path) -> None:
    """The handler starts with `confirm.result` and `tool.resolved` still queued: the
    commit that made the decision durable did not send them, the flush after the
    handler sends all three."""
    queued, after, store = await _decided(tmp_path, "allow")
    assert store == "SqliteStore"
    assert queued == [2]
    assert after == ["confirm.result", "tool.resolved", "result"]


async def test_a3_on_postgresql_too_the_decided_commit_is_made_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on PostgreSQL, where the commit at once is a real commit before the
    handler (SPEC A3)."""
    with fresh_schema() as url:
        monkeypatch.setenv("TOOLBUS_STORE__URL", url)
        queued, after, store = await _decided(tmp_path, "allow")
    assert store == "PgStore"
    assert queued == [2]
    assert after == ["confirm.result", "tool.resolved", "result"]


async def test_a5_a_denied_call_never_starts_its_handler(tmp_path: Path) -> None:
    """A denied call ends with its declined `result`; the handler never ran."""
    queued, after, _ = await _decided(tmp_path, "deny")
    assert queued == []
    assert after == ["confirm.result", "tool.resolved", "result"]
