"""Field cases about delivery and resume over real sockets (F06, F07, F12; SPEC D3, D5)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.demo import handlers
from gateway.server import Gateway
from protocol import messages as m
from tests.gateway.store_faults import until
from tests.support import (
    MS,
    WAIT,
    barrier,
    closed,
    park_signal,
    peer,
    resume_fields,
    running,
    sequenced,
    settings_for,
)


async def test_case_f06_job_done_while_disconnected_delivered_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F06 / SPEC D3: a job finishing while the socket is down arrives exactly once on resume."""
    release = asyncio.Event()
    original = handlers.report

    async def gated_report(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        await release.wait()
        return await original(params, ctx)

    monkeypatch.setattr(handlers, "report", gated_report)
    monkeypatch.setattr(handlers, "REPORT_SECTION_SECONDS", 0.0)
    async with running(settings_for(tmp_path)) as gw:
        parked = park_signal(gw)
        async with peer(gw) as p:
            await p.invoke("c1", "report", {"topic": "tides", "sections": 1})
            dispatched = await p.terminal("c1")
            assert dispatched["type"] == "dispatched"
            last_seen = dispatched["seq"]
            job = gw.jobs.active[dispatched["job_id"]]
            assert job.task is not None
            p.ws.transport.abort()  # J1 started; the socket drops
            async with asyncio.timeout(WAIT):
                await parked.wait()
            release.set()  # J1 finishes while nobody is connected
            async with asyncio.timeout(WAIT):
                await asyncio.shield(job.task)
        async with peer(gw, **resume_fields(p, last_seen)) as again:
            assert again.welcome["resumed"] is True
            got = await barrier(again)
            done = [msg for msg in got if msg["type"] == "job.done"]
            assert len(done) == 1
            assert done[0]["job_id"] == dispatched["job_id"]
            assert done[0]["call_id"] == "c1"
            assert sequenced(got) == list(range(last_seen + 1, again.welcome["last_seq"] + 1))
            assert sequenced(got)[-1] == done[0]["seq"]


async def test_case_f07_resume_after_five_events_sends_six_onward(gateway: Gateway) -> None:
    """F07 / SPEC D3: 5 events delivered, resume with last_seq 5 -> only 6 onward, seq stable."""
    parked = park_signal(gateway)
    convert = {"value": 1, "from_unit": "m", "to_unit": "cm"}
    async with peer(gateway) as p:
        await p.invoke("c1", "convert_units", convert)
        await p.terminal("c1")
        await p.invoke("c2", "convert_units", convert)
        await p.terminal("c2")
        assert sequenced(p.seen) == [1, 2, 3, 4, 5]
        await p.invoke("c3", "convert_units", convert)
        start = await p.expect("tool_start", call_id="c3")
        assert start["seq"] == 6  # received, but the client never processed it
        p.ws.transport.abort()
        async with asyncio.timeout(WAIT):
            await parked.wait()
    # The call's result (seq 7) comes after its tool_start, from the handler's thread:
    # resume once the session has it (the test once raced it under load: last_seq 6).
    session = gateway.sessions.get(p.welcome["session_id"])
    assert session is not None
    await until(lambda: "c3" in session.done_calls, "c3's result")
    async with peer(gateway, **resume_fields(p, 5)) as again:
        assert again.welcome["resumed"] is True
        assert again.welcome["session_id"] == p.welcome["session_id"]
        assert again.welcome["last_seq"] == 7
        got = await barrier(again)
        events = [msg for msg in got if "seq" in msg]
        assert [(e["seq"], e["type"], e["call_id"]) for e in events] == [
            (6, "tool_start", "c3"),
            (7, "result", "c3"),
        ]
        assert events[0] == start
        await again.invoke("c4", "convert_units", convert)
        assert (await again.terminal("c4"))["seq"] == 9


async def test_case_f12_slow_consumer_bounded_closed_1013_nothing_lost(tmp_path: Path) -> None:
    """F12 / SPEC D5, scaled: 2,000 events of 64 KB (128 MB; F12 says 10,000) to a client that
    never reads, with max_outbound_bytes 1 MB (default 8 MB), while 10 other sessions (F12:
    50) invoke tools. The slow socket's queue stays under its bound, it is closed 1013, the
    others' calls complete promptly, and on resume every event is replayed, in order, once."""
    count, size, bound = 2000, 64 * 1024, 1 << 20
    settings = settings_for(tmp_path, server={"max_outbound_bytes": bound})
    async with running(settings) as gw:
        parked = park_signal(gw)
        async with peer(gw) as slow:
            await slow.expect("catalog")
            session = gw.sessions.get(slow.welcome["session_id"])
            assert session is not None
            assert session.link is not None
            link = session.link
            slow.ws.transport.pause_reading()  # a client that never reads
            payload = "x" * size
            peak = 0
            latencies: list[float] = []

            async def flood() -> None:
                nonlocal peak
                for i in range(count):
                    session.emit(m.JobProgress(job_id="job_flood", tool="report", message=payload))
                    peak = max(peak, link.queued_bytes)
                    if i % 16 == 15:
                        await asyncio.sleep(0)  # a yield, not a delay: the outbox commits

            async def other(n: int) -> None:
                async with peer(gw, token="bob-token") as p:
                    for k in range(5):
                        began = time.perf_counter()
                        await p.invoke(
                            f"o{n}-{k}",
                            "convert_units",
                            {"value": k, "from_unit": "kg", "to_unit": "g"},
                        )
                        reply = await p.terminal(f"o{n}-{k}")
                        latencies.append(time.perf_counter() - began)
                        assert reply["type"] == "result"
                        assert reply["result"]["result"] == k * 1000

            async with asyncio.timeout(WAIT * 3):
                await asyncio.gather(flood(), *(other(n) for n in range(10)))
            assert link.closed
            # The bound applies behind the next frame to go (one frame may wait alone).
            assert peak <= bound + len(payload) + 256
            assert len(latencies) == 50
            assert max(latencies) < 2000 * MS, latencies
            slow.ws.transport.resume_reading()
            info = await closed(slow)
            assert info.rcvd is not None
            assert info.rcvd.code == 1013
            received = sequenced(slow.seen)
            assert received == list(range(1, len(received) + 1))
            assert len(received) < count  # the bound cut it off well before the end
            async with asyncio.timeout(WAIT):
                await parked.wait()
        last = received[-1]
        async with peer(gw, **resume_fields(slow, last)) as again:
            assert again.welcome["resumed"] is True
            assert again.welcome["last_seq"] == count + 1
            got = await barrier(again)
            assert sequenced(got) == list(range(last + 1, count + 2))
            assert all(msg["message"] == payload for msg in got if msg["type"] == "job.progress")
