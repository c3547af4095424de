"""End-to-end smoke: hello, catalog, a sync invoke (SPEC S1, C3, I8)."""

from __future__ import annotations

from gateway.server import Gateway
from tests.support import peer


async def test_hello_catalog_and_sync_invoke(gateway: Gateway) -> None:
    """SPEC S1/C3/I8: welcome, then the catalog (seq 1), then tool_start and result."""
    async with peer(gateway) as p:
        assert p.welcome["protocol"] == "toolbus.v1"
        assert p.welcome["resumed"] is False
        catalog = await p.expect("catalog")
        assert catalog["seq"] == 1
        assert catalog["reason"] == "initial"
        await p.invoke("c1", "convert_units", {"value": 1, "from_unit": "km", "to_unit": "m"})
        start = await p.expect("tool_start", call_id="c1")
        assert start["seq"] == 2
        assert "approval_id" not in start
        result = await p.terminal("c1")
        assert result["type"] == "result"
        assert result["seq"] == 3
        assert result["result"]["result"] == 1000.0
