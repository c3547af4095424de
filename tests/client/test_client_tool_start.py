"""The client's hello option ``tool_start`` (SPEC A6, K1) against the real server."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gateway.server import Gateway
from protocol import messages as m
from tests.client.test_client import KM, connect


def _options(gateway: Gateway, session_id: str | None) -> dict[str, Any]:
    session = gateway.sessions.get(session_id)
    assert session is not None
    return session.options


async def test_a6_client_asks_for_gated_tool_start_only_by_default(gateway: Gateway) -> None:
    """SPEC A6: without `on_message` the client acts on gated `tool_start` only, so it
    asks for those alone; the call's result is the same."""
    async with connect(gateway) as bus:
        out = await bus.invoke("convert_units", KM)
        assert isinstance(out, m.Result)
        assert _options(gateway, bus.session_id)["tool_start"] == "gated"


async def test_a6_client_with_on_message_gets_every_tool_start(gateway: Gateway) -> None:
    """SPEC A6: with `on_message` (it sees every frame) the default is `all`, and an
    explicit `tool_start` wins over the default."""
    seen: list[BaseModel] = []
    async with connect(gateway, on_message=seen.append) as bus:
        out = await bus.invoke("convert_units", KM, call_id="k1")
        assert isinstance(out, m.Result)
        starts = [msg for msg in seen if isinstance(msg, m.ToolStart)]
        assert [(s.call_id, s.approval_id) for s in starts] == [("k1", None)]
        assert _options(gateway, bus.session_id)["tool_start"] == "all"
    async with connect(gateway, tool_start=m.ToolStarts.GATED, on_message=seen.append) as bus:
        await bus.invoke("convert_units", KM, call_id="k2")
        assert not [msg for msg in seen if isinstance(msg, m.ToolStart) and msg.call_id == "k2"]
