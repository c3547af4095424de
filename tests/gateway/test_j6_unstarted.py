"""A call or job whose plain handler still waits for a worker thread has not started,
and is never reported as started or as cut off while it ran (SPEC J6, I8, I14, S4).

Each test runs a real gateway on 127.0.0.1 and a real websockets client. The session's
one worker thread is held by ``hog`` until the test releases it; the handlers record
each run in :data:`RUNS` and set :data:`RAN`, so no test sleeps to order events.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gateway.pipeline import STOPPED
from gateway.server import Gateway
from protocol.errors import ErrorCode
from tests.gateway import edge_tools as et
from tests.gateway import thread_tools
from tests.gateway.thread_tools import HOG_RELEASE, HOG_STARTED, RAN, RUNS, wait_thread
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import (
    WAIT,
    closed,
    dropped,
    own_catalog,
    park_signal,
    peer,
    running,
    settings_for,
    signal,
)

TOOLS = thread_tools.TOOLS

PROFILES = """
safe_default: []
profiles:
  demo:
    capabilities: [r.basic]
"""

ONE_THREAD = {"worker_threads": 1, "threads_per_session": 1, "threads_per_user": 1}


def _reset() -> None:
    thread_tools.reset()


def _settings(tmp: Path, grace: float = 0.0, **sections: Any) -> Any:
    return settings_for(
        tmp,
        catalog=own_catalog(tmp, TOOLS, PROFILES),
        calls={**ONE_THREAD, "thread_wait": 30.0, "default_timeout": 0},
        server={"port": 0, "heartbeat_interval": 0, "drain_grace": grace},
        **sections,
    )


async def _job(p: Any, job_id: str, request_id: str) -> dict[str, Any]:
    await p.send({"type": "job.get", "id": request_id, "job_id": job_id})
    job: dict[str, Any] = (await p.expect("job", id=request_id))["job"]
    return job


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_j6_promoted_call_turns_running_only_when_its_thread_frees(
    tmp_path: Path,
    backend: str,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC J6, I14, J1: a plain handler promoted while it waits for a worker thread is a
    ``queued`` job without ``started_at``; once the thread frees it starts (its
    ``running`` row made durable first, J5: a journal append or, on PostgreSQL, the
    turn's commit), runs once and ends ``done`` with a ``started_at`` of its start."""
    _reset()
    store = {"url": pg_url} if backend == "postgresql" else {}
    async with running(_settings(tmp_path, store=store)) as gw, peer(gw) as p:
        try:
            await p.invoke("h1", "hog", {})
            await wait_thread(HOG_STARTED)
            await p.invoke("c1", "promo_plain", {})
            dispatched = await p.terminal("c1")
            assert dispatched["type"] == "dispatched", dispatched
            job_id = dispatched["job_id"]
            waiting = await _job(p, job_id, "g1")
            assert (waiting["state"], waiting.get("started_at")) == ("queued", None), waiting
            assert RUNS == []
        finally:
            HOG_RELEASE.set()
        done = await p.expect("job.done", job_id=job_id)
        assert done["result"] == {"ran": "c1"}
        ended = await _job(p, job_id, "g2")
        assert ended["state"] == "done"
        assert ended["started_at"] >= ended["created_at"]
        assert RUNS == ["c1"]


async def test_j6_a_call_that_gets_its_thread_within_the_drain_grace_runs_to_its_result(
    tmp_path: Path,
) -> None:
    """SPEC J6, S4, I15: a drain waits, up to its grace, for plain handlers; a call waiting
    for a thread held by one of them starts once the thread frees inside the grace and
    ends with its real ``result`` (it is not stopped as never started): a re-send after
    the restart gets that result, and the tool ran once. (A guard on the drain's stop of
    calls that never started: stopping them when the drain begins fails it.)"""
    _reset()
    settings = _settings(tmp_path, grace=WAIT)
    gw = Gateway(settings)
    await gw.start()
    try:
        async with peer(gw) as p:
            await p.invoke("h1", "hog", {})
            await wait_thread(HOG_STARTED)
            await p.invoke("c1", "quick", {})
            await p.expect("tool_start", call_id="c1")  # gates passed; waits for the thread
            drain = asyncio.create_task(gw.drain())
            await asyncio.sleep(0)
            assert gw.draining
            HOG_RELEASE.set()
            await closed(p)
            await drain
    finally:
        HOG_RELEASE.set()
        await gw.drain()
    assert RUNS == ["c1"]
    async with running(settings) as again, peer(again) as q:
        await q.invoke("c1", "quick", {})
        answer = await q.terminal("c1")
    assert (answer["type"], answer.get("result")) == ("result", {"ran": "c1"}), answer
    assert RUNS == ["c1"]


async def test_j6_on_a_node_of_several_a_drained_waiting_call_says_it_did_not_run(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC J6, N6, I15: node A of a PostgreSQL gateway drains (grace 0) while its call
    `c1` waits for a worker thread. `c1` never ran: the principal's re-send on node B
    gets ``unavailable`` "the server stopped before this call started; it did not run",
    not a restart's ``cancelled`` "while this call ran", and the tool does not run."""
    _reset()
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
    settings = [
        _settings(f, store={"url": pg_url}, nodes={"node_id": f"n-{f.name}"}) for f in folders
    ]
    a = Gateway(settings[0])
    await a.start()
    try:
        async with peer(a) as p:
            await p.invoke("h1", "hog", {})
            await wait_thread(HOG_STARTED)
            await p.invoke("c1", "quick", {})
            await p.expect("tool_start", call_id="c1")
            drain = asyncio.create_task(a.drain())
            await closed(p)
            await drain
    finally:
        HOG_RELEASE.set()
        await a.drain()
    async with running(settings[1]) as b, peer(b) as q:
        await q.invoke("c1", "quick", {})
        answer = await q.terminal("c1")
    assert RUNS == []
    assert (answer["type"], answer["code"], answer["message"]) == (
        "call.error",
        ErrorCode.UNAVAILABLE,
        STOPPED,
    )


async def test_j6_a_call_promoted_during_a_drain_while_it_waits_stays_queued_and_runs_after(
    tmp_path: Path,
) -> None:
    """SPEC J6, S4, I14: during a drain's grace a plain call waiting for a thread is
    promoted to a job. A drain starts nothing: the job stays ``queued`` (no
    ``started_at``), its handler does not start on the stopping server, and it runs once
    after the restart."""
    _reset()
    settings = _settings(tmp_path, grace=WAIT)
    db = settings.data_dir / "toolbus.db"
    gw = Gateway(settings)
    await gw.start()
    try:
        async with peer(gw) as p:
            await p.invoke("h1", "hog", {})
            await wait_thread(HOG_STARTED)
            drain = asyncio.create_task(gw.drain())
            await asyncio.sleep(0)
            assert gw.draining
            await p.invoke("c1", "promo_plain", {})
            dispatched = await p.terminal("c1")
            assert dispatched["type"] == "dispatched", dispatched
            job_id = dispatched["job_id"]
            HOG_RELEASE.set()
            await closed(p)
            await drain
    finally:
        HOG_RELEASE.set()
        await gw.drain()
    assert RUNS == []
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT state, started_at FROM jobs WHERE job_id=?", (job_id,)
        ).fetchone()
    conn.close()
    assert tuple(row) == ("queued", None)
    async with running(settings):
        await wait_thread(RAN)
    assert RUNS == ["c1"]


# -- J6, I14: a promoted call whose plain handler still waits for a worker thread -------


async def test_j6_promoted_call_waiting_for_a_thread_is_not_reported_started(
    tmp_path: Path,
) -> None:
    """SPEC J6, I14, S4: a plain sync handler that waits for a worker thread (its
    session's one thread is held) is promoted to a job at ``promote_after``. Its handler
    has not started, yet the job is reported ``running`` with a ``started_at``; a drain
    then reports it ``failed`` ``interrupted`` ("the server restarted while this job
    ran") though it never ran."""
    et.reset()
    one = {"worker_threads": 1, "threads_per_session": 1, "threads_per_user": 1}
    settings = et.settings(
        tmp_path,
        calls={**one, "thread_wait": 30.0, "default_timeout": 0},
        server={"port": 0, "heartbeat_interval": 0, "drain_grace": 0},
    )
    gw = Gateway(settings)
    await gw.start()
    try:
        async with peer(gw) as p:
            await p.invoke("h1", "hog", {})
            await wait_thread(HOG_STARTED)
            await p.invoke("c1", "promo_plain", {})
            dispatched = await p.terminal("c1")
            assert dispatched["type"] == "dispatched"
            job_id = dispatched["job_id"]
            await p.send({"type": "job.get", "id": "g1", "job_id": job_id})
            info = (await p.expect("job", id="g1"))["job"]
            assert RUNS == []  # the handler still waits for its thread
            reported = (info["state"], info.get("started_at"))  # omitted when not started
            drain = asyncio.create_task(gw.drain())
            await closed(p)
            await drain
            failed = [m for m in p.seen if m.get("job_id") == job_id and m["type"] == "job.failed"]
            assert RUNS == []
            # What really happened: it never started.
            assert not any(f["error"]["code"] == "interrupted" for f in failed), failed
            assert reported[0] != "running", reported
            assert reported[1] is None, reported
    finally:
        HOG_RELEASE.set()
        await gw.drain()


# -- J1, E2: promoted calls run outside every job and in-flight bound ----------------


async def test_e2_a_promoted_call_counts_in_flight_until_its_handler_returns(
    tmp_path: Path,
) -> None:
    """SPEC E2, I14: ``limits.max_inflight_calls`` 1. A call of a tool promoted to a job
    after 50 ms is `dispatched`; its handler still runs, so the session's next invoke is
    refused `too_many_inflight` until that handler returns. Then the next call runs.
    Before, a promoted call no longer counted: a session ran any number of promoted
    handlers at once (4 with a bound of 1)."""
    et.reset()
    async with (
        running(et.settings(tmp_path, limits={"max_inflight_calls": 1})) as gw,
        peer(gw) as p,
    ):
        await p.invoke("c0", "apromo", {})
        first = await p.terminal("c0")
        assert first["type"] == "dispatched", first
        await p.invoke("c1", "apromo", {}, id="r1")
        refused = await p.expect("error", id="r1")
        assert (refused["code"], refused["details"]) == ("too_many_inflight", {"call_id": "c1"})
        et.release().set()
        await p.expect("job.done", job_id=first["job_id"])
        await p.invoke("c1", "apromo", {})
        assert (await p.terminal("c1"))["type"] == "result"
        assert (et.PEAK[0], RUNS) == (1, ["c0", "c1"])


# -- I8, I15: a call still waiting for a worker thread when its session expires -------


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_i8_expired_session_call_waiting_for_a_thread_never_starts(
    tmp_path: Path,
    backend: str,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC I8, I15, J6, N1 (Pipeline.end_session: an expired session "cancels only
    calls whose handler has not started"): the session's one worker thread is held; its
    call `c1` passed every gate and waits for a thread. The socket drops and the resume
    window (0.3 s) ends, then the thread frees. `c1` never runs (before, it started, for
    a session that was over), and a re-send from the principal's next session answers
    ``cancelled``. On PostgreSQL a call that waited makes its start durable by a commit
    before its handler; the answer is the same."""
    et.reset()
    one = {"worker_threads": 1, "threads_per_session": 1, "threads_per_user": 1}
    store = {"url": pg_url} if backend == "postgresql" else {}
    settings = et.settings(
        tmp_path,
        calls={**one, "thread_wait": 30.0},
        sessions={"resume_window": 0.3},
        store=store,
    )
    async with running(settings) as gw:
        if store:
            assert type(gw.store).__name__ == "PgStore"
        parked, ended = park_signal(gw), signal(gw, "end")
        try:
            async with peer(gw) as p:
                await p.invoke("h1", "hog", {})
                await wait_thread(HOG_STARTED)
                await p.invoke("c1", "quick", {})
                await p.expect("tool_start", call_id="c1")  # gates passed; waits for the thread
                await dropped(p, parked)
            async with asyncio.timeout(WAIT):
                await ended.wait()
            assert not gw.sessions.sessions
        finally:
            HOG_RELEASE.set()
        async with peer(gw) as q:  # the principal's next session re-sends c1 (I15)
            await q.invoke("h1", "hog", {})
            held = await q.terminal("h1")
            await q.invoke("c1", "quick", {})
            answer = await q.terminal("c1")
        assert RUNS == [], f"c1's handler ran after its session ended: {answer}"
        assert held["type"] == "result", held
        assert answer["type"] == "call.error", answer
        assert answer["code"] == "cancelled", answer


# -- J6: a call that never started is not reported as cut off while it ran -------------


async def test_j6_call_waiting_for_a_thread_at_a_drain_is_not_reported_as_run(
    tmp_path: Path,
) -> None:
    """SPEC J6 ("a job or call is reported as what really happened: one that never
    started is never reported as interrupted; after a restart it runs, or says it never
    started"), S4, I15: the session's one worker thread is held; its call `c1` waits
    for a thread when the server drains (grace 0). `c1` never ran. After the restart the
    principal re-sends `c1`: it gets the drain's ``unavailable`` saying it did not run
    (before the fix it answered ``cancelled`` "the server restarted while this call
    ran")."""
    et.reset()
    one = {"worker_threads": 1, "threads_per_session": 1, "threads_per_user": 1}
    settings = et.settings(
        tmp_path,
        calls={**one, "thread_wait": 30.0},
        server={"port": 0, "heartbeat_interval": 0, "drain_grace": 0},
    )
    gw = Gateway(settings)
    await gw.start()
    try:
        async with peer(gw) as p:
            await p.invoke("h1", "hog", {})
            await wait_thread(HOG_STARTED)
            await p.invoke("c1", "quick", {})
            await p.expect("tool_start", call_id="c1")  # gates passed; waits for the thread
            drain = asyncio.create_task(gw.drain())
            await closed(p)
            await drain
    finally:
        HOG_RELEASE.set()
        await gw.drain()
    assert RUNS == []
    async with running(settings) as again, peer(again) as q:
        await q.invoke("c1", "quick", {})
        answer = await q.terminal("c1")
    # The drain ended it (Pipeline.stop_unstarted); the ledger gives a re-send that end.
    assert RUNS == []
    assert (answer["type"], answer["code"], answer["message"]) == (
        "call.error",
        "unavailable",
        STOPPED,
    ), answer
