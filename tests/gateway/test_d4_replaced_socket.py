"""A socket whose session a resume took over acts on it no more (SPEC D4, N2).

Every kind of frame the replaced socket sends after the takeover (it wrote them before
it read its 4000 close) is dropped: the session, its calls, approvals, grants, jobs,
context and log stay as the new socket holds them, and the new socket gets no reply
to a request it never sent.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.connection import ConnectionHandler
from protocol.codec import decode_client
from protocol.errors import DecodeError
from tests.support import (
    CONVERT,
    WAIT,
    barrier,
    closed,
    park_signal,
    peer,
    resume_fields,
    running,
    settings_for,
)

NOTE = {"title": "payroll", "body": "salaries 2027"}

STALE: dict[str, dict[str, Any]] = {
    "invoke": {"type": "invoke", "call_id": "x1", "tool": "convert_units", "params": CONVERT},
    "invoke_resend": {
        "type": "invoke",
        "call_id": "a1",
        "tool": "convert_units",
        "params": CONVERT,
    },
    "call.cancel": {"type": "call.cancel", "call_id": "g1"},
    "tool.confirm": {"type": "tool.confirm", "approval_id": "{approval}", "decision": "allow"},
    "ack": {"type": "ack", "seq": "{last}"},
    "grants.list": {"type": "grants.list"},
    "grants.revoke": {"type": "grants.revoke", "tool": "convert_units"},
    "job.get": {"type": "job.get", "job_id": "{job}"},
    "job.list": {"type": "job.list"},
    "job.cancel": {"type": "job.cancel", "job_id": "{job}"},
    "catalog.get": {"type": "catalog.get"},
    "context.update": {"type": "context.update", "context": {"project_id": "p9"}},
    "auth.refresh": {"type": "auth.refresh", "token": "alice-token"},
    "elicit.answer": {"type": "elicit.answer", "elicitation_id": "el_x", "action": "decline"},
    "bye": {"type": "bye"},
    "malformed": {"raw": "{not json"},
    "unknown type": {"type": "no.such.message"},
}
"""One stale frame per kind; ``{approval}``, ``{job}`` and ``{last}`` are filled in."""


def _frame(kind: str, ids: dict[str, Any]) -> dict[str, Any] | str:
    template = STALE[kind]
    if "raw" in template:
        return str(template["raw"])
    frame = {k: ids.get(v[1:-1], v) if isinstance(v, str) else v for k, v in template.items()}
    if kind != "ack":  # the one request without an id
        frame["id"] = "stale"
    if kind != "unknown type":  # each stale frame is one the server would act on
        assert not isinstance(decode_client(orjson.dumps(frame)), DecodeError), kind
    return frame


@pytest.mark.parametrize("kind", list(STALE))
async def test_d4_no_frame_of_a_replaced_socket_acts_on_the_session(
    tmp_path: Path, kind: str
) -> None:
    """SPEC D4, N2: after a resume took the session over, a frame of any kind from the
    old socket changes nothing (calls, approvals, grants, jobs, context, log, the
    session's life) and the new socket gets no answer to it."""
    async with (
        running(settings_for(tmp_path)) as gw,
        peer(gw, options={"confirm_tool_calls": True}) as old,
    ):
        await old.invoke("a1", "convert_units", CONVERT)
        start = await old.expect("tool_start", call_id="a1")
        decision = {"approval_id": start["approval_id"], "decision": "allow_always"}
        await old.send({"type": "tool.confirm", **decision})
        await old.terminal("a1")
        await old.invoke("r1", "report", {"topic": "x", "sections": 10})
        start = await old.expect("tool_start", call_id="r1")
        await old.send(
            {"type": "tool.confirm", "approval_id": start["approval_id"], "decision": "allow"}
        )
        job = (await old.terminal("r1"))["job_id"]
        await old.invoke("g1", "notes_create", NOTE)
        approval = (await old.expect("tool_start", call_id="g1"))["approval_id"]
        await barrier(old)
        last = max(msg["seq"] for msg in old.seen if "seq" in msg)
        session = gw.sessions.get(old.welcome["session_id"])
        assert session is not None
        before = (session.acked_seq, dict(session.context), set(session.grants))
        old.ws.transport.pause_reading()  # it does not see the 4000 close yet
        parked = park_signal(gw)
        async with peer(gw, hello=False) as new:
            await new.hello(**resume_fields(old, last))
            assert new.welcome["resumed"] is True
            await barrier(new)
            await old.send(_frame(kind, {"approval": approval, "job": job, "last": last}))
            old.ws.transport.resume_reading()
            assert (await closed(old)).rcvd.code == 4000  # type: ignore[union-attr]
            async with asyncio.timeout(WAIT):
                await parked.wait()  # the old socket's handler is done: its frame was read
            after = await barrier(new)
            assert [m for m in after if m["type"] != "job.progress"] == []
            assert gw.sessions.get(session.id) is session
            assert not session.ended
            assert (session.acked_seq, session.context, session.grants) == before
            assert set(session.inflight) == {"g1"}
            assert approval in gw.approvals.pending
            assert job in gw.jobs.active
            # The new socket holds the session whole: it decides the pending call.
            await new.send({"type": "tool.confirm", "approval_id": approval, "decision": "allow"})
            assert (await new.terminal("g1"))["type"] == "result"
            await new.send({"type": "job.cancel", "id": "j", "job_id": job})
            await new.expect("job", id="j")


def test_d4_every_message_kind_is_tried_stale() -> None:
    """SPEC D4: the test above sends every message type an open session dispatches."""
    tried = {STALE[kind]["type"] for kind in STALE if "type" in STALE[kind]}
    assert set(ConnectionHandler.TABLE) <= tried
