"""Job states tell the truth across a drain and a crash (SPEC J6, J5, S4; cases F29,
F31), with the real server in a subprocess."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import yaml
from websockets.exceptions import ConnectionClosed

import tests.gateway.fair_tools as ft
from gateway.config import load_settings
from tests.gateway.fair_tools import seen_or_next, server_process, write_config
from tests.gateway.tools_for_tests import first_terminal
from tests.support import WAIT, Peer, peer, peer_at, running, settings_for


async def dispatch(p: Peer, call_id: str, tool: str, params: dict[str, Any]) -> str:
    await p.invoke(call_id, tool, params)
    reply = await first_terminal(p, call_id)
    assert reply["type"] == "dispatched", reply
    return str(reply["job_id"])


async def until_closed(p: Peer) -> int:
    """Read until the server closes the socket; the close code."""
    async with asyncio.timeout(WAIT):
        while True:
            try:
                await p.recv()
            except ConnectionClosed as exc:
                return exc.rcvd.code if exc.rcvd is not None else -1


async def job_get(p: Peer, job_id: str, rid: str) -> dict[str, Any]:
    await p.send({"type": "job.get", "id": rid, "job_id": job_id})
    return dict((await p.expect("job", id=rid))["job"])


async def test_case_f29_drain_waits_for_a_threaded_handler(tmp_path: Path) -> None:
    """SPEC J6, S4, case F29: SIGTERM while a plain job handler sleeps before its side
    effect; the drain waits for it, the job is reported ``done`` before the 1012 close,
    the side effect exists, and the restarted server says ``done`` too."""
    config = write_config(tmp_path, server={"drain_grace": WAIT})
    async with server_process(config) as srv, peer_at(srv.url) as p:
        job_id = await dispatch(p, "e1", "effect_job", {"seconds": 1.0})
        await seen_or_next(p, "job.progress", job_id=job_id)  # the handler runs now
        srv.proc.send_signal(signal.SIGTERM)
        assert await until_closed(p) == 1012
        kinds = [m["type"] for m in p.seen]
        assert kinds[-1] == "reconnect"
        assert kinds.index("job.done") < kinds.index("reconnect")
        done = next(m for m in p.seen if m["type"] == "job.done")
        assert (done["job_id"], done["ok"], done["summary"]) == (job_id, True, "effect written")
        async with asyncio.timeout(WAIT):
            assert await srv.proc.wait() == 0
    assert (tmp_path / "data" / f"effect-{job_id}").read_text() == "written"
    resume = {
        "session_id": p.welcome["session_id"],
        "resume_token": p.welcome["resume_token"],
        "last_seq": done["seq"],
    }
    async with running(load_settings(config)) as gw, peer(gw, **resume) as again:
        assert again.welcome["resumed"] is True
        job = await job_get(again, job_id, "g")
        assert (job["state"], job["summary"]) == ("done", "effect written")


async def test_f29_past_the_grace_the_job_is_interrupted_and_never_lands(
    tmp_path: Path,
) -> None:
    """SPEC J6, S4: a plain handler still running when the drain's grace ends is reported
    ``failed`` ``interrupted``, and it dies with the process: its side effect never lands
    after that report (the process does not wait for its 30 s sleep)."""
    config = write_config(tmp_path, server={"drain_grace": 0.2})
    async with server_process(config) as srv, peer_at(srv.url) as p:
        job_id = await dispatch(p, "e1", "effect_job", {"seconds": 30})
        await seen_or_next(p, "job.progress", job_id=job_id)
        srv.proc.send_signal(signal.SIGTERM)
        assert await until_closed(p) == 1012
        failed = next(m for m in p.seen if m["type"] == "job.failed")
        assert (failed["job_id"], failed["error"]) == (
            job_id,
            {"code": "interrupted", "message": "the server restarted while this job ran"},
        )
        async with asyncio.timeout(WAIT):
            assert await srv.proc.wait() == 0
    assert not (tmp_path / "data" / f"effect-{job_id}").exists()
    logged = [r for r in srv.logs if r.get("logger") == "gateway.jobs"]
    assert any("still running after the grace" in r["msg"] for r in logged), logged


async def test_case_f31_queued_jobs_run_after_a_crash(tmp_path: Path) -> None:
    """SPEC J6, J5, case F31: ``max_per_session: 1``, three jobs of a non-idempotent tool;
    ``kill -9`` while the first runs; after the restart the first ends ``failed``
    ``interrupted`` and the two that never started run to ``done``, each tool run once."""
    config = write_config(tmp_path, jobs={"max_per_session": 1})
    async with server_process(config) as srv, peer_at(srv.url) as p:
        first = await dispatch(p, "o1", "once_job", {"n": 1, "hold": True})
        second = await dispatch(p, "o2", "once_job", {"n": 2, "hold": False})
        third = await dispatch(p, "o3", "once_job", {"n": 3, "hold": False})
        await seen_or_next(p, "job.progress", job_id=first)
        queued = await job_get(p, second, "g2")
        assert queued["state"] == "queued"
        assert "started_at" not in queued
        assert (await job_get(p, first, "g1"))["state"] == "running"
        last_seq = max(m["seq"] for m in p.seen if "seq" in m)
        srv.proc.kill()
        async with asyncio.timeout(WAIT):
            assert await srv.proc.wait() == -9
    runs = tmp_path / "data" / "runs.log"
    assert runs.read_text() == "1\n"
    resume = {
        "session_id": p.welcome["session_id"],
        "resume_token": p.welcome["resume_token"],
        "last_seq": last_seq,
    }
    async with running(load_settings(config)) as gw, peer(gw, **resume) as again:
        assert again.welcome["resumed"] is True
        failed = await seen_or_next(again, "job.failed", job_id=first)
        assert failed["error"] == {
            "code": "interrupted",
            "message": "the server restarted while this job ran",
        }
        assert (await seen_or_next(again, "job.done", job_id=second))["summary"] == "run 2"
        assert (await seen_or_next(again, "job.done", job_id=third))["summary"] == "run 3"
        for rid, job_id in (("a", second), ("b", third)):
            job = await job_get(again, job_id, rid)
            assert job["state"] == "done"
            assert job["started_at"] >= job["created_at"]
        assert not [m for m in again.seen if m["type"] == "job.failed" and m["job_id"] != first]
    assert runs.read_text() == "1\n2\n3\n"


async def test_j6_a_queued_job_that_cannot_run_says_it_never_started(tmp_path: Path) -> None:
    """SPEC J6: after a crash, a queued job whose tool left the catalog is reported
    ``failed`` ``not_started``, never ``interrupted``; the one that ran is interrupted."""
    config = write_config(tmp_path, jobs={"max_per_session": 1})
    async with server_process(config) as srv, peer_at(srv.url) as p:
        first = await dispatch(p, "o1", "once_job", {"n": 1, "hold": True})
        second = await dispatch(p, "o2", "once_job", {"n": 2, "hold": False})
        await seen_or_next(p, "job.progress", job_id=first)
        last_seq = max(m["seq"] for m in p.seen if "seq" in m)
        srv.proc.kill()
        async with asyncio.timeout(WAIT):
            await srv.proc.wait()
    tools = tmp_path / "fair-tools.yaml"
    catalog = yaml.safe_load(tools.read_text())
    catalog["tools"] = [t for t in catalog["tools"] if t["name"] != "once_job"]
    tools.write_text(yaml.safe_dump(catalog))
    resume = {
        "session_id": p.welcome["session_id"],
        "resume_token": p.welcome["resume_token"],
        "last_seq": last_seq,
    }
    async with running(load_settings(config)) as gw, peer(gw, **resume) as again:
        interrupted = await seen_or_next(again, "job.failed", job_id=first)
        never = await seen_or_next(again, "job.failed", job_id=second)
        stored = await job_get(again, second, "g")
    assert interrupted["error"]["code"] == "interrupted"
    assert never["error"] == {
        "code": "not_started",
        "message": "the server restarted before this job started; it did not run",
    }
    assert never["summary"] == (
        "once_job failed: the server restarted before this job started; it did not run"
    )
    assert (stored["state"], stored["error"]) == ("failed", never["error"])
    assert "started_at" not in stored
    assert (tmp_path / "data" / "runs.log").read_text() == "1\n"


async def test_j6_a_drain_leaves_queued_jobs_queued_and_they_run_after(tmp_path: Path) -> None:
    """SPEC J6, S4: at a drain (no grace) the running plain job ends ``interrupted``, the
    queued one is not reported at all: it stays ``queued`` and runs after the restart."""
    ft.STATE = ft.State()
    settings = settings_for(
        tmp_path,
        catalog=ft.write_catalog(tmp_path),
        jobs={"max_per_session": 1},
        server={"drain_grace": 0},
    )
    try:
        async with running(settings) as gw, peer(gw) as p:
            first = await dispatch(p, "h1", "held_job", {})
            second = await dispatch(p, "q1", "quick_job", {})
            await ft.until(lambda: gw.workers.jobs.stats().busy == 1, gw.workers.jobs.changed)
            assert (await job_get(p, second, "g"))["state"] == "queued"
            last_seq = max(m["seq"] for m in p.seen if "seq" in m)
    finally:
        ft.STATE.release.set()
    assert ft.STATE.quick == 0
    resume = {
        "session_id": p.welcome["session_id"],
        "resume_token": p.welcome["resume_token"],
        "last_seq": last_seq,
    }
    async with running(settings) as gw, peer(gw, **resume) as again:
        failed = await seen_or_next(again, "job.failed", job_id=first)
        assert failed["error"]["code"] == "interrupted"
        done = await seen_or_next(again, "job.done", job_id=second)
        assert done["result"]["thread"].startswith("toolbus-jobs-")
        assert [m["type"] for m in again.seen if m.get("job_id") == second] == ["job.done"]
    assert ft.STATE.quick == 1
