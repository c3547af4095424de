"""Fair share of worker threads, job slots and the event loop (SPEC E3; cases F22, F23,
F30, F33), over real sockets against the real server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import tests.gateway.fair_tools as ft
from tests.gateway.fair_tools import (
    http_get,
    serve,
    server_process,
    until,
    write_config,
)
from tests.gateway.tools_for_tests import first_terminal
from tests.support import WAIT, Peer, peer, peer_at

QUICK_BOUND = 1.0
"""Seconds a quick call may take while others hold threads: far above its normal
latency (milliseconds), far below a wait behind a held thread (the test's WAIT)."""


async def timed_quick(p: Peer, call_id: str, tool: str = "quick") -> tuple[dict[str, Any], float]:
    """Invoke the quick plain tool; its terminal reply and the seconds it took."""
    began = time.perf_counter()
    await p.invoke(call_id, tool, {})
    reply = await first_terminal(p, call_id)
    return reply, time.perf_counter() - began


async def test_case_f22_timed_out_threads_count_until_they_return(tmp_path: Path) -> None:
    """SPEC E3, case F22: plain handlers past their timeout keep counting against their
    session and user until they really return; the session's cap keeps the rest of the
    pool for another user, whose quick call answers at once."""
    calls = {"worker_threads": 8, "threads_per_session": 4, "threads_per_user": 4}
    async with (
        serve(tmp_path, calls={**calls, "thread_wait": 0.1}) as gw,
        peer(gw, token="alice-token") as alice,
        peer(gw, token="bob-token") as bob,
    ):
        lane = gw.workers.calls
        session = alice.welcome["session_id"]
        first = [f"a{i}" for i in range(6)]
        for call_id in first:
            await alice.invoke(call_id, "stuck", {})
        replies = [await first_terminal(alice, call_id) for call_id in first]
        assert sorted(r["code"] for r in replies) == ["busy"] * 2 + ["timeout"] * 4
        assert ft.STATE.started == {"stuck": 4}
        await until(lambda: lane.stats().overdue == 4, lane.changed)
        busy = next(r for r in replies if r["code"] == "busy")
        assert busy == {
            "type": "call.error",
            "seq": busy["seq"],
            "call_id": busy["call_id"],
            "tool": "stuck",
            "code": "busy",
            "message": "no worker thread became free in time: this session holds 4 of 4, "
            "its user 4 of 4, the calls lane 4 of 8",
        }
        second = [f"b{i}" for i in range(6)]
        for call_id in second:
            await alice.invoke(call_id, "stuck", {})
        assert [(await first_terminal(alice, c))["code"] for c in second] == ["busy"] * 6
        # The timed-out handlers never returned: their threads still count.
        assert ft.STATE.started == {"stuck": 4}
        assert ft.STATE.returned == {}
        assert (lane.held_by_session(session), lane.held_by_user(None, "alice")) == (4, 4)
        reply, took = await timed_quick(bob, "q1")
        assert reply["type"] == "result"
        assert reply["result"]["thread"].startswith("toolbus-calls-")
        assert took < QUICK_BOUND
        assert lane.stats().busy == 4  # bob's call did not wait for any of alice's
        _, body = await http_get(gw.port, "/metrics")
        assert b'toolbus_worker_threads{lane="calls",state="overdue"} 4.0' in body
        ft.STATE.release.set()
        await until(lambda: lane.stats().busy == 0, lane.changed)
        assert ft.STATE.returned == {"stuck": 4}
        assert (lane.held_by_session(session), lane.held_by_user(None, "alice")) == (0, 0)
        assert (lane.stats().sessions, lane.stats().users) == (0, 0)
        # With its threads back, alice's session runs plain handlers again.
        again, _ = await timed_quick(alice, "a-again")
        assert again["type"] == "result"


async def test_case_f30_quick_call_does_not_queue_behind_jobs(tmp_path: Path) -> None:
    """SPEC E3, case F30: 40 plain job handlers (5 sessions x 8) hold every job thread;
    another session's quick plain call answers at once from the calls lane."""
    jobs = {
        "worker_threads": 40,
        "threads_per_session": 8,
        "threads_per_user": 40,
        "max_per_user": 40,
    }
    async with serve(tmp_path, jobs=jobs) as gw, peer(gw, token="bob-token") as bob:
        lane = gw.workers.jobs
        _, normal = await timed_quick(bob, "q0")
        async with asyncio.TaskGroup() as group:
            sessions = [group.create_task(_eight_jobs(gw, n)) for n in range(5)]
            await until(lambda: lane.stats().busy == 40, lane.changed)
            reply, took = await timed_quick(bob, "q1")
            assert reply["type"] == "result"
            assert reply["result"]["thread"].startswith("toolbus-calls-")
            assert took < QUICK_BOUND, (took, normal)
            assert lane.stats().busy == 40  # every job handler still holds its thread
            assert ft.STATE.returned == {}
            ft.STATE.release.set()
        for task in sessions:
            assert task.result() == ["done"] * 8


async def _eight_jobs(gw: Any, n: int) -> list[str]:
    async with peer(gw, token="alice-token") as p:
        ids = []
        for i in range(8):
            await p.invoke(f"j{n}-{i}", "held_job", {})
            ids.append((await first_terminal(p, f"j{n}-{i}"))["job_id"])
        return [(await _finished(p, job_id))["type"].split(".")[1] for job_id in ids]


async def _finished(p: Peer, job_id: str) -> dict[str, Any]:
    for message in p.seen:
        if message.get("job_id") == job_id and message["type"] in ("job.done", "job.failed"):
            return message
    async with asyncio.timeout(WAIT):
        while True:
            message = await p.recv()
            if message.get("job_id") == job_id and message["type"] in ("job.done", "job.failed"):
                return message


async def test_case_f33_per_session_resources_return_to_baseline(tmp_path: Path) -> None:
    """SPEC E3, case F33: 30 sessions come and go, each running jobs and calls; some end
    with ``bye`` while their jobs still run, some are dropped and expire, some leave a
    handler running past its timeout and their end. Afterwards every
    per-session and per-user entry (job bounds, call records, thread counts, timers) is
    back at its baseline, as the accessor and ``/metrics`` both show."""
    async with serve(tmp_path, sessions={"resume_window": 0.05}, jobs={"max_per_session": 2}) as gw:
        baseline = gw.tracked()
        assert set(baseline.values()) == {0}
        ended, next_end = _count_ends(gw)
        for n in range(30):
            token = ("alice-token", "bob-token", "alice-t2-token")[n % 3]
            async with peer(gw, token=token) as p:
                ids = []
                for i in range(3):
                    # Call ids are keys of the principal (SPEC I15): new ones each time.
                    await p.invoke(f"{n}-j{i}", "quick_job", {})
                    ids.append((await first_terminal(p, f"{n}-j{i}"))["job_id"])
                reply, _ = await timed_quick(p, f"{n}-q")
                assert reply["type"] == "result"
                if n % 5 == 0:  # a handler that outlives its timeout and its session
                    await p.invoke(f"{n}-s", "stuck", {})
                    assert (await first_terminal(p, f"{n}-s"))["code"] == "timeout"
                if n % 2:
                    await p.send({"type": "bye"})  # its jobs may still be queued or running
                    await _closed(p)
                else:
                    assert [(await _finished(p, j))["type"] for j in ids] == ["job.done"] * 3
                    p.ws.transport.abort()  # parked, then expires after the resume window
        await until(lambda: ended[0] == 30, next_end)
        await asyncio.gather(*(job.task for job in list(gw.jobs.active.values()) if job.task))
        lanes = gw.workers.calls, gw.workers.jobs
        # The stuck handlers still count against their ended sessions until they return.
        stats = gw.workers.calls.stats()
        assert (stats.busy, stats.overdue, stats.waiting, stats.sessions, stats.users) == (
            6,
            6,
            0,
            6,
            3,
        )
        ft.STATE.release.set()
        await until(
            lambda: all(lane.stats().busy == 0 for lane in lanes), *(lane.changed for lane in lanes)
        )
        assert gw.tracked() == baseline
        assert ft.STATE.quick == 30 * 4
        _, body = await http_get(gw.port, "/metrics")
        for kind in baseline:
            assert f'toolbus_tracked{{kind="{kind}"}} 0.0'.encode() in body


def _count_ends(gw: Any) -> tuple[list[int], Callable[[], Awaitable[None]]]:
    """A counter of ended sessions, and an awaitable factory for the next end."""
    count: list[int] = [0]
    waiters: list[asyncio.Event] = []
    original = gw.sessions.end

    def end(session: Any) -> None:
        was = session.ended
        original(session)
        if not was:
            count[0] += 1
            for waiter in waiters:
                waiter.set()
            waiters.clear()

    async def next_end() -> None:
        waiter = asyncio.Event()
        waiters.append(waiter)
        await waiter.wait()

    gw.sessions.end = end
    return count, next_end


async def _closed(p: Peer) -> None:
    async with asyncio.timeout(WAIT):
        await p.ws.wait_closed()


async def test_case_f23_blocked_loop_is_logged_with_tool_and_stack(tmp_path: Path) -> None:
    """SPEC E3, case F23: an ``async def`` tool calls ``time.sleep(1.5)``; within a second
    of the stall the server logs the tool's name with the loop thread's stack and counts
    it in ``toolbus_loop_stalls_total``; another session's quick call still answers."""
    config = write_config(tmp_path, server={"loop_stall_threshold": 0.5})
    async with (
        server_process(config) as srv,
        peer_at(srv.url, token="alice-token") as alice,
        peer_at(srv.url, token="bob-token") as bob,
    ):
        await alice.invoke("s1", "stall", {"seconds": 1.5})
        begins = await srv.record(lambda r: r.get("msg") == "stall begins")
        await bob.invoke("q1", "quick", {})
        # On a loaded machine the loop may also be starved before the handler runs; such
        # a stall is reported too (tool "none"), so look for this tool's report.
        stalled = await srv.record(
            lambda r: r.get("logger") == "gateway.watchdog" and r.get("tool") == "stall"
        )
        assert stalled["level"] == "WARNING"
        assert (stalled["session_id"], stalled["call_id"]) == (alice.welcome["session_id"], "s1")
        assert stalled["ts"] - begins["ts"] < 1.0
        assert stalled["stalled_seconds"] > 0.5
        assert 'time.sleep(params["seconds"])' in stalled["stack"]
        assert "fair_tools.py" in stalled["stack"]
        assert stalled["msg"].startswith("event loop blocked for ")
        assert (await first_terminal(bob, "q1"))["type"] == "result"
        assert (await first_terminal(alice, "s1"))["result"] == {"slept": 1.5}
        resumed = await srv.record(
            lambda r: r.get("logger") == "gateway.watchdog" and r["level"] == "INFO"
        )
        assert resumed["msg"].startswith("event loop turning again after a stall of about ")
        _, body = await http_get(srv.port, "/metrics")
        assert b'toolbus_loop_stalls_total{tool="stall"} 1.0' in body
        # A quick call on a loop that turns is never reported.
        await bob.invoke("q2", "quick", {})
        assert (await first_terminal(bob, "q2"))["type"] == "result"
        _, body = await http_get(srv.port, "/metrics")
        assert b'toolbus_loop_stalls_total{tool="stall"} 1.0' in body
        assert sum(1 for r in srv.logs if r.get("tool") == "stall") == 1


async def test_e3_one_user_cannot_take_every_job_slot(tmp_path: Path) -> None:
    """SPEC E3, J1: ``jobs.max_per_user`` bounds one user's running jobs over all their
    sessions; their other jobs wait ``queued`` while another user's job runs at once."""
    jobs = {"max_per_user": 2, "max_concurrent": 4}
    async with (
        serve(tmp_path, jobs=jobs) as gw,
        peer(gw, token="alice-token") as a1,
        peer(gw, token="alice-token") as a2,
        peer(gw, token="bob-token") as bob,
    ):
        lane = gw.workers.jobs
        ids = []
        for n, p in enumerate((a1, a2, a1, a2)):
            await p.invoke(f"a{n}", "held_job", {})
            ids.append((await first_terminal(p, f"a{n}"))["job_id"])
        await until(lambda: lane.stats().busy == 2, lane.changed)
        await bob.invoke("b0", "held_job", {})
        bob_job = (await first_terminal(bob, "b0"))["job_id"]
        await until(lambda: lane.stats().busy == 3, lane.changed)
        states = [(await _job(a1, job_id))["state"] for job_id in ids]
        assert sorted(states) == ["queued", "queued", "running", "running"]
        assert (await _job(bob, bob_job))["state"] == "running"
        assert lane.held_by_user(None, "alice") == 2
        ft.STATE.release.set()
        for job_id in ids:
            assert (await _finished(a1 if ids.index(job_id) % 2 == 0 else a2, job_id))[
                "type"
            ] == "job.done"
        assert (await _finished(bob, bob_job))["type"] == "job.done"


async def _job(p: Peer, job_id: str) -> dict[str, Any]:
    await p.send({"type": "job.get", "id": job_id, "job_id": job_id})
    return dict((await p.expect("job", id=job_id))["job"])
