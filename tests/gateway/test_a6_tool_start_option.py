"""Hello option ``tool_start`` (SPEC A6, S1): ``gated`` leaves out ``tool_start`` of
calls that need no approval; gated calls and the default are unchanged."""

from __future__ import annotations

from pathlib import Path

from tests.gateway.tools_for_tests import serve
from tests.support import peer


async def test_a6_gated_option_sends_only_the_reply_of_an_ungated_call(tmp_path: Path) -> None:
    """SPEC A6: with `tool_start: gated` an ungated call's next event is its result (no
    seq skipped); a gated call still gets `tool_start` with its `approval_id`."""
    async with serve(tmp_path) as gw, peer(gw, options={"tool_start": "gated"}) as p:
        catalog = await p.expect("catalog")
        assert catalog["seq"] == 1
        await p.invoke("c1", "echo", {"note": "hi"})
        result = await p.recv()
        assert (result["type"], result["call_id"], result["seq"]) == ("result", "c1", 2)
        await p.invoke("c2", "gated", {})
        start = await p.recv()
        assert (start["type"], start["call_id"], start["seq"]) == ("tool_start", "c2", 3)
        assert start["approval_id"].startswith("ap_")
        session = gw.sessions.get(p.welcome["session_id"])
        assert session is not None
        assert session.options == {"confirm_tool_calls": False, "tool_start": "gated"}


async def test_a6_default_and_all_send_tool_start_for_every_call(tmp_path: Path) -> None:
    """SPEC A6: without the option, and with `tool_start: all`, an ungated call sends
    `tool_start` (no `approval_id`) and then its result."""
    async with serve(tmp_path) as gw:
        for call_id, hello in (("c1", {}), ("c2", {"options": {"tool_start": "all"}})):
            async with peer(gw, **hello) as p:
                await p.expect("catalog")
                await p.invoke(call_id, "echo", {"note": "hi"})
                start = await p.recv()
                assert (start["type"], start["seq"]) == ("tool_start", 2)
                assert "approval_id" not in start
                result = await p.recv()
                assert (result["type"], result["seq"]) == ("result", 3)


async def test_a6_unknown_tool_start_value_is_refused(tmp_path: Path) -> None:
    """SPEC A6, E1: `tool_start` takes `all` or `gated` only; another value refuses hello."""
    async with serve(tmp_path) as gw, peer(gw, hello=False) as p:
        await p.send(
            {
                "type": "hello",
                "token": "alice-token",
                "profile": "demo",
                "options": {"tool_start": "none"},
            }
        )
        error = await p.expect("error")
        assert error["code"] == "invalid_value"
