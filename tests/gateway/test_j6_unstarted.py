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
from tests.gateway import thread_tools
from tests.gateway.thread_tools import HOG_RELEASE, HOG_STARTED, RAN, RUNS, wait_thread
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import WAIT, closed, own_catalog, peer, running, settings_for

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
