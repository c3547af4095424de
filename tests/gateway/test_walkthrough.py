"""The README's message walk-through, end to end against the real server (SPEC S1-D3)."""

from __future__ import annotations

import pytest

from gateway.demo import handlers
from gateway.server import Gateway
from tests.support import MS, peer


@pytest.fixture(autouse=True)
def quick_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo report waits between sections; one scaled unit is enough here."""
    monkeypatch.setattr(handlers, "REPORT_SECTION_SECONDS", MS)


async def test_walkthrough(gateway: Gateway) -> None:
    """hello -> catalog -> invoke -> tool_start -> confirm -> result -> job -> job.done
    -> drop -> resume -> replay, with exact seq numbers (SPEC S1, C3, I8, A2-A6, I9, J4, D1, D3)."""
    async with peer(gateway) as p:
        welcome = p.welcome
        assert (welcome["type"], welcome["protocol"], welcome["resumed"]) == (
            "welcome",
            "toolbus.v1",
            False,
        )
        catalog = await p.expect("catalog")
        assert catalog["seq"] == 1
        names = {t["name"] for t in catalog["tools"]}
        assert {"convert_units", "notes_delete", "report"} <= names

        await p.invoke("c1", "convert_units", {"value": 2, "from_unit": "kg", "to_unit": "g"})
        assert (await p.expect("tool_start", call_id="c1"))["seq"] == 2
        result = await p.terminal("c1")
        assert (result["type"], result["seq"], result["result"]["result"]) == ("result", 3, 2000.0)

        await p.invoke("c2", "notes_create", {"title": "walk", "body": "through"})
        created = await p.terminal("c2")
        note_id = created["result"]["note_id"]
        await p.invoke("c3", "notes_delete", {"note_id": note_id})
        start = await p.expect("tool_start", call_id="c3")
        assert start["approval_id"].startswith("ap_")
        assert start["expires_at"] > 0
        await p.send(
            {
                "type": "tool.confirm",
                "id": "r1",
                "approval_id": start["approval_id"],
                "decision": "allow",
            }
        )
        confirm = await p.expect("confirm.result", id="r1")
        assert confirm == {
            "type": "confirm.result",
            "id": "r1",
            "approval_id": start["approval_id"],
            "accepted": True,
        }
        resolved = await p.expect("tool.resolved", call_id="c3")
        assert (resolved["resolution"], resolved["reason"]) == ("allowed", "user")
        deleted = await p.terminal("c3")
        assert deleted["type"] == "result"
        assert deleted["declined"] is False

        await p.invoke("c4", "report", {"topic": "walk", "sections": 2})
        dispatched = await p.terminal("c4")
        assert dispatched["type"] == "dispatched"
        job_id = dispatched["job_id"]
        done = await p.expect("job.done", job_id=job_id)
        last_seen = done["seq"]
        await p.send({"type": "ack", "seq": last_seen})
        session_id, token = welcome["session_id"], welcome["resume_token"]

        await p.invoke("c5", "report", {"topic": "offline", "sections": 1})
        second = await p.terminal("c5")
        # Drop the socket abruptly before the second job's completion is read.
        p.ws.transport.abort()

    async with peer(
        gateway, session_id=session_id, resume_token=token, last_seq=second["seq"]
    ) as q:
        assert q.welcome["resumed"] is True
        assert q.welcome["session_id"] == session_id
        replayed = await q.expect("job.done", job_id=second["job_id"])
        assert replayed["seq"] > second["seq"]
        seqs = [m["seq"] for m in q.seen if "seq" in m]
        assert seqs == list(range(second["seq"] + 1, replayed["seq"] + 1))
