"""The client library against the real server (SPEC K1, with I, A, J, D, S5 behind it)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from pydantic import BaseModel

import toolbus
from gateway.server import Gateway
from protocol import messages as m
from protocol.errors import ErrorCode
from tests.support import WAIT

KM = {"value": 1, "from_unit": "km", "to_unit": "m"}


def connect(gateway: Gateway, **options: Any) -> toolbus.Client:
    options.setdefault("token", "alice-token")
    options.setdefault("profile", "demo")
    options.setdefault("request_timeout", WAIT)
    return toolbus.connect(gateway.url, **options)


class Recorder:
    """Collects every processed server message (the ``on_message`` callback)."""

    def __init__(self) -> None:
        self.messages: list[BaseModel] = []
        self.arrived = asyncio.Event()

    def __call__(self, message: BaseModel) -> None:
        self.messages.append(message)
        self.arrived.set()

    def of(self, kind: type[BaseModel]) -> list[Any]:
        return [msg for msg in self.messages if isinstance(msg, kind)]

    def seqs(self) -> list[int]:
        return [msg.seq for msg in self.messages if isinstance(getattr(msg, "seq", None), int)]  # type: ignore[attr-defined]

    async def wait_for(self, predicate: Any) -> Any:
        async with asyncio.timeout(WAIT):
            while True:
                for msg in self.messages:
                    if predicate(msg):
                        return msg
                self.arrived.clear()
                await self.arrived.wait()


async def note(bus: toolbus.Client, title: str = "t") -> int:
    out = await bus.invoke("notes_create", {"title": title, "body": "b"}, timeout=WAIT)
    assert isinstance(out, m.Result)
    note_id: int = out.result["note_id"]
    return note_id


async def test_invoke_sync(gateway: Gateway) -> None:
    """SPEC K1, I8, C3: open gives the catalog; a sync invoke returns the result message."""
    async with connect(gateway) as bus:
        assert bus.catalog_version
        assert bus.tool("convert_units") is not None
        assert bus.welcome is not None
        assert bus.welcome.resumed is False
        out = await bus.invoke("convert_units", KM, call_id="c1", timeout=WAIT)
        assert isinstance(out, m.Result)
        assert out.call_id == "c1"
        assert out.result["result"] == 1000.0
        assert not out.declined


async def test_same_call_id_returns_recorded_outcome(gateway: Gateway) -> None:
    """SPEC I12, I15, D1: a re-used call_id gets the recorded result although its seq was
    seen; with other parameters it is refused call_id_conflict."""
    async with connect(gateway) as bus:
        first = await bus.invoke("convert_units", KM, call_id="same", timeout=WAIT)
        again = await bus.invoke("convert_units", KM, call_id="same", timeout=WAIT)
        assert again == first
        with pytest.raises(toolbus.RequestRefused) as refused:
            await bus.invoke(
                "convert_units",
                {"value": 5, "from_unit": "m", "to_unit": "cm"},
                call_id="same",
                timeout=WAIT,
            )
        assert refused.value.code == "call_id_conflict"


async def test_async_job_handle_and_events(gateway: Gateway) -> None:
    """SPEC K1, I9, J2, J4: dispatched -> JobHandle; progress and job.done arrive as events."""
    async with connect(gateway) as bus, bus.job_events() as events:
        handle = await bus.invoke("report", {"topic": "tests", "sections": 2}, timeout=WAIT)
        assert isinstance(handle, toolbus.JobHandle)
        assert handle.tool == "report"
        outcome = await handle.result(timeout=WAIT)
        assert outcome.ok
        assert outcome.state is m.JobState.DONE
        assert "tests" in outcome.summary
        assert outcome.artifacts[0]["mime_type"] == "text/markdown"
        seen = [await events.next(timeout=WAIT)]
        while not isinstance(seen[-1], m.JobDone):
            seen.append(await events.next(timeout=WAIT))
        assert isinstance(seen[0], m.JobProgress)
        assert all(e.job_id == handle.job_id for e in seen)
        assert handle.progress is not None
        info = await bus.job(handle.job_id)
        assert info.state is m.JobState.DONE
        assert [j.job_id for j in await bus.jobs(status="done")] == [handle.job_id]


async def test_job_callback_and_cancel_job(gateway: Gateway) -> None:
    """SPEC K1, J3: cancel_job ends the handle cancelled; on_job_event sees job.cancelled."""
    got: list[toolbus.JobEvent] = []
    async with connect(gateway, on_job_event=got.append) as bus:
        handle = await bus.invoke("report", {"topic": "stop", "sections": 10}, timeout=WAIT)
        assert isinstance(handle, toolbus.JobHandle)
        await handle.cancel()
        outcome = await handle.result(timeout=WAIT)
        assert outcome.state is m.JobState.CANCELLED
        assert not outcome.ok
        assert isinstance(got[-1], m.JobCancelled)
        with pytest.raises(toolbus.RequestRefused) as refused:
            await bus.cancel_job(handle.job_id)
        assert refused.value.code is ErrorCode.JOB_FINISHED
        with pytest.raises(toolbus.RequestRefused) as unknown:
            await bus.job("job_nope")
        assert unknown.value.code is ErrorCode.UNKNOWN_JOB


async def test_approval_callback_allow(gateway: Gateway) -> None:
    """SPEC K1, A2, A3: a sync on_approval callback returning allow lets the call run."""
    asked: list[toolbus.ApprovalRequest] = []

    def approve(req: toolbus.ApprovalRequest) -> m.Decision:
        asked.append(req)
        return m.Decision.ALLOW

    async with connect(gateway, on_approval=approve) as bus:
        note_id = await note(bus)
        out = await bus.invoke("notes_delete", {"note_id": note_id}, timeout=WAIT)
        assert isinstance(out, m.Result)
        assert out.result == {"deleted": note_id}
        assert [r.tool for r in asked] == ["notes_delete"]
        assert asked[0].params == {"note_id": note_id}
        resolved = await asked[0].wait_settled(timeout=WAIT)
        assert resolved is not None
        assert resolved.resolution is m.Resolution.ALLOWED


async def test_approval_async_callback_deny(gateway: Gateway) -> None:
    """SPEC K1, A5: an async callback denying gives a declined result, not an exception."""

    async def refuse(req: toolbus.ApprovalRequest) -> m.Decision:
        return m.Decision.DENY

    async with connect(gateway, on_approval=refuse) as bus:
        out = await bus.invoke("notes_delete", {"note_id": 1}, timeout=WAIT)
        assert isinstance(out, m.Result)
        assert out.declined
        assert out.result["declined"] is True


async def test_approval_iterator_allow_and_deny(gateway: Gateway) -> None:
    """SPEC K1, A3, A5: approvals() yields requests; allow runs the call, deny declines it."""
    async with connect(gateway) as bus, bus.approvals() as approvals:
        note_id = await note(bus)
        call = asyncio.create_task(bus.invoke("notes_delete", {"note_id": note_id}, timeout=WAIT))
        req = await approvals.next(timeout=WAIT)
        assert req.tool == "notes_delete"
        assert req.approval_id
        assert req.expires_at
        answer = await req.allow()
        assert answer.accepted
        out = await call
        assert isinstance(out, m.Result)
        assert not out.declined
        again = await req.deny()
        assert not again.accepted
        assert again.reason is not None

        call = asyncio.create_task(bus.invoke("notes_delete", {"note_id": note_id}, timeout=WAIT))
        req = await approvals.next(timeout=WAIT)
        await req.deny()
        out = await call
        assert isinstance(out, m.Result)
        assert out.declined


async def test_approval_allow_always_then_not_gated(gateway: Gateway) -> None:
    """SPEC A1, A3: allow_always grants the tool; the next call has no approval; revoke ends it."""
    recorder = Recorder()
    async with connect(gateway, on_message=recorder) as bus, bus.approvals() as approvals:
        first, second = await note(bus, "one"), await note(bus, "two")
        call = asyncio.create_task(bus.invoke("notes_delete", {"note_id": first}, timeout=WAIT))
        await (await approvals.next(timeout=WAIT)).allow_always()
        await call
        assert await bus.grants() == ["notes_delete"]
        out = await bus.invoke("notes_delete", {"note_id": second}, call_id="second", timeout=WAIT)
        assert isinstance(out, m.Result)
        assert out.result == {"deleted": second}
        start = next(s for s in recorder.of(m.ToolStart) if s.call_id == "second")
        assert start.approval_id is None
        assert bus.pending_approvals == []
        assert await bus.revoke("notes_delete") == []


async def test_typed_errors(gateway: Gateway) -> None:
    """SPEC K1, I1, I4, I3: call errors raise typed exceptions under one root."""
    async with connect(gateway) as bus:
        with pytest.raises(toolbus.UnknownTool) as unknown:
            await bus.invoke("convert_unit", {}, timeout=WAIT)
        assert "convert_units" in unknown.value.suggestions
        assert unknown.value.code is ErrorCode.UNKNOWN_TOOL
        with pytest.raises(toolbus.InvalidParams) as invalid:
            await bus.invoke("convert_units", {"value": "x", "from_unit": "km"}, timeout=WAIT)
        pointers = {v.pointer for v in invalid.value.violations}
        assert "/value" in pointers
        assert str(invalid.value) == (
            '2 parameter problem(s): /: "to_unit" is a required property; '
            '/value: "x" is not of type "number"'
        )
        assert isinstance(invalid.value, toolbus.ToolbusClientError)
        with pytest.raises(toolbus.WrongRoute):
            await bus.invoke("show_map", {"lat": 1, "lon": 2}, timeout=WAIT)
        with pytest.raises(toolbus.UnknownTool):
            await bus.invoke("get_weather", timeout=WAIT)


async def test_cancel_call(gateway: Gateway) -> None:
    """SPEC I8: cancel() ends a pending call with Cancelled; an unknown call is refused."""
    async with connect(gateway) as bus, bus.approvals() as approvals:
        call = asyncio.create_task(
            bus.invoke("notes_delete", {"note_id": 1}, call_id="x", timeout=WAIT)
        )
        await approvals.next(timeout=WAIT)
        await bus.cancel("x")
        with pytest.raises(toolbus.Cancelled):
            await call
        with pytest.raises(toolbus.RequestRefused) as refused:
            await bus.cancel("x")
        assert refused.value.code is ErrorCode.UNKNOWN_CALL


async def test_catalog_follows_context(gateway: Gateway) -> None:
    """SPEC S5, C3: update_context re-filters the catalog: project_summary needs project_id."""
    async with connect(gateway) as bus:
        assert bus.tool("project_summary") is None
        before = bus.catalog_version
        assert await bus.update_context({"project_id": "p1"}) == {"project_id": "p1"}
        assert bus.tool("project_summary") is not None
        assert bus.catalog_version != before
        out = await bus.invoke("project_summary", {}, timeout=WAIT)
        assert isinstance(out, m.Result)
        assert out.result["project_id"] == "p1"
        await bus.update_context({"project_id": None})
        assert bus.tool("project_summary") is None


async def test_stale_catalog(gateway: Gateway) -> None:
    """SPEC I13: an old catalog_version raises StaleCatalog naming the current one."""
    async with connect(gateway) as bus:
        old = bus.catalog_version
        await bus.update_context({"project_id": "p1"})
        with pytest.raises(toolbus.StaleCatalog) as stale:
            await bus.invoke("convert_units", KM, catalog_version=old, timeout=WAIT)
        assert stale.value.catalog_version == bus.catalog_version


async def test_resume_after_dropped_socket(gateway: Gateway) -> None:
    """SPEC K1, D1-D3: abrupt drop mid-job: resume; job.done once, seq in order."""
    recorder = Recorder()
    async with (
        connect(gateway, on_message=recorder, ack_every=1) as bus,
        bus.job_events() as events,
    ):
        handle = await bus.invoke("report", {"topic": "drop", "sections": 3}, timeout=WAIT)
        assert isinstance(handle, toolbus.JobHandle)
        first = await events.next(timeout=WAIT)
        assert isinstance(first, m.JobProgress)
        assert bus._ws is not None
        bus._ws.transport.abort()
        outcome = await handle.result(timeout=WAIT)
        assert outcome.ok
        assert bus.reconnects == 1
        assert bus.welcome is not None
        assert bus.welcome.resumed is True
        # One more round trip: anything replayed twice would have arrived before this reply.
        await bus.grants()
        done = [e for e in recorder.of(m.JobDone) if e.job_id == handle.job_id]
        assert len(done) == 1
        seqs = recorder.seqs()
        assert seqs == sorted(set(seqs))
        assert seqs == list(range(1, len(seqs) + 1))


async def test_pending_approval_survives_drop(gateway: Gateway) -> None:
    """SPEC A4, I12: a gated call waiting across a drop is re-sent and completes once."""
    async with connect(gateway) as bus, bus.approvals() as approvals:
        note_id = await note(bus)
        call = asyncio.create_task(bus.invoke("notes_delete", {"note_id": note_id}, timeout=WAIT))
        req = await approvals.next(timeout=WAIT)
        assert bus._ws is not None
        bus._ws.transport.abort()
        answer = await req.allow(timeout=WAIT)
        assert answer.accepted
        out = await call
        assert isinstance(out, m.Result)
        assert out.result == {"deleted": note_id}
        assert bus.reconnects == 1


async def test_not_resumed_resyncs_jobs(gateway: Gateway) -> None:
    """SPEC D3: on resumed false the client takes the new session; job.get gives the job's end."""
    async with connect(gateway, backoff=toolbus.Backoff(initial=0.01, cap=0.5)) as bus:
        handle = await bus.invoke("report", {"topic": "lost", "sections": 2}, timeout=WAIT)
        assert isinstance(handle, toolbus.JobHandle)
        old_session = bus.session_id
        bus._resume_token = "not-the-token"
        assert bus._ws is not None
        bus._ws.transport.abort()
        outcome = await handle.result(timeout=WAIT)
        assert outcome.ok
        assert outcome.event is None
        assert bus.session_id != old_session
        assert bus.welcome is not None
        assert not bus.welcome.resumed
        out = await bus.invoke("convert_units", KM, timeout=WAIT)
        assert isinstance(out, m.Result)


async def test_connect_refused(gateway: Gateway) -> None:
    """SPEC S2: a refused hello raises ConnectFailed with the wire code."""
    with pytest.raises(toolbus.ConnectFailed) as failed:
        async with connect(gateway, token="wrong-token"):
            pass
    assert failed.value.code is ErrorCode.AUTH_FAILED
    with pytest.raises(toolbus.ConnectFailed) as denied:
        async with connect(gateway, token="bob-token", profile="voice"):
            pass
    assert denied.value.code is ErrorCode.PROFILE_DENIED


async def test_close_fails_waiters(gateway: Gateway) -> None:
    """SPEC K1: closing the client fails a waiting call with SessionClosed and ends streams."""
    bus = await connect(gateway).open()
    approvals = bus.approvals()
    call = asyncio.create_task(bus.invoke("notes_delete", {"note_id": 1}, timeout=WAIT))
    await approvals.next(timeout=WAIT)
    await bus.close()
    with pytest.raises(toolbus.SessionClosed):
        await call
    with pytest.raises(StopAsyncIteration):
        await approvals.next(timeout=WAIT)
    with pytest.raises(toolbus.SessionClosed):
        await bus.invoke("convert_units", KM)


async def test_drain_hint_then_gives_up(gateway: Gateway) -> None:
    """SPEC S4: after reconnect + 1012 the client retries; server gone: stops after max_attempts."""
    backoff = toolbus.Backoff(initial=0.01, cap=0.02, max_attempts=2)
    bus = await connect(gateway, backoff=backoff, connect_timeout=2.0).open()
    call = asyncio.create_task(bus.invoke("notes_delete", {"note_id": 1}, timeout=WAIT))
    await gateway.drain()
    with pytest.raises(toolbus.SessionClosed, match="gave up"):
        await call
    assert bus.closed
    await bus.close()


def test_backoff_full_jitter() -> None:
    """SPEC K1: delays are uniform in [0, min(cap, initial * factor**n)]."""
    backoff = toolbus.Backoff(initial=0.5, cap=4.0, factor=2.0)
    rng = random.Random(7)
    for attempt in range(12):
        bound = min(4.0, 0.5 * 2**attempt)
        delays = [backoff.delay(attempt, rng) for _ in range(50)]
        assert all(0.0 <= d <= bound for d in delays)
    assert max(backoff.delay(30, rng) for _ in range(200)) > 2.0


async def test_connect_unreachable() -> None:
    """SPEC K1: an unreachable server raises ConnectFailed, not a bare OSError."""
    with pytest.raises(toolbus.ConnectFailed, match="cannot connect"):
        async with toolbus.connect("ws://127.0.0.1:9/", token="t", connect_timeout=WAIT):
            pass


@pytest.mark.parametrize(
    ("url", "example"),
    [
        ("http://127.0.0.1:9/", "ws://127.0.0.1:9/"),
        ("https://bus.example/", "wss://bus.example/"),
        ("127.0.0.1:9", "ws://127.0.0.1:8765/"),
    ],
)
async def test_connect_needs_a_websocket_url(url: str, example: str) -> None:
    """SPEC K1: a URL that is not ws:// or wss:// raises ConnectFailed naming the fix,
    not websockets' InvalidURI."""
    with pytest.raises(toolbus.ConnectFailed) as failed:
        async with toolbus.connect(url, token="t", connect_timeout=WAIT):
            pass
    assert str(failed.value) == (
        f"{url!r} is not a WebSocket URL: toolbus needs a ws:// or wss:// URL, e.g. {example}"
    )


def test_invalid_params_names_the_first_violations() -> None:
    """SPEC I4, K1: str(InvalidParams) names the first three violations (pointer: what),
    then counts the rest."""
    event = m.CallError(
        call_id="c1",
        tool="t",
        code=ErrorCode.INVALID_PARAMS,
        message="5 parameter problem(s)",
        violations=[m.Violation(pointer=f"/p{i}", message=f"bad {i}") for i in range(5)],
    )
    assert str(toolbus.InvalidParams(event)) == (
        "5 parameter problem(s): /p0: bad 0; /p1: bad 1; /p2: bad 2; and 2 more"
    )
