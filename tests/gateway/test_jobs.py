"""The job runner over real sockets (SPEC J1-J5, I9; case F11 for jobs)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import tests.gateway.tools_for_tests as tt
from tests.gateway.tools_for_tests import first_terminal, serve, wait_thread_event
from tests.support import WAIT, Peer, peer


async def dispatch(p: Peer, call_id: str, **params: Any) -> str:
    """Invoke ``hold_job`` and return the job id from ``dispatched``."""
    await p.invoke(call_id, "hold_job", params)
    reply = await first_terminal(p, call_id)
    assert reply["type"] == "dispatched"
    return str(reply["job_id"])


async def started(key: str) -> None:
    async with asyncio.timeout(WAIT):
        await tt.STATE.job_event(tt.STATE.job_started, key).wait()


def release(key: str) -> None:
    tt.STATE.job_event(tt.STATE.job_release, key).set()


async def job_get(p: Peer, job_id: str, rid: str) -> dict[str, Any]:
    await p.send({"type": "job.get", "id": rid, "job_id": job_id})
    reply = await p.expect("job", id=rid)
    return dict(reply["job"])


async def job_list(p: Peer, rid: str, status: str | None = None) -> list[str]:
    message: dict[str, Any] = {"type": "job.list", "id": rid}
    if status is not None:
        message["status"] = status
    await p.send(message)
    return [job["job_id"] for job in (await p.expect("jobs", id=rid))["jobs"]]


async def test_j1_states_and_per_session_bound(tmp_path: Path) -> None:
    """SPEC J1: with max_per_session 1 the second job stays queued until the first is done."""
    async with serve(tmp_path, jobs={"max_per_session": 1}) as gw, peer(gw) as p:
        first = await dispatch(p, "c1", key="a")
        second = await dispatch(p, "c2", key="b")
        await started("a")
        running = await job_get(p, first, "g1")
        queued = await job_get(p, second, "g2")
        assert (running["state"], running["tool"], running["call_id"]) == (
            "running",
            "hold_job",
            "c1",
        )
        assert running["started_at"] >= running["created_at"]
        assert queued["state"] == "queued"
        assert "started_at" not in queued
        assert not tt.STATE.job_event(tt.STATE.job_started, "b").is_set()
        assert await job_list(p, "l1", "queued") == [second]
        assert await job_list(p, "l2", "running") == [first]
        release("a")
        await p.expect("job.done", job_id=first)
        await started("b")
        assert (await job_get(p, second, "g3"))["state"] == "running"
        release("b")
        await p.expect("job.done", job_id=second)
        assert await job_list(p, "l3", "done") == [second, first]
        assert await job_list(p, "l4", "running") == []
        assert tt.STATE.calls == {"hold_job": 2}


async def test_j2_progress_is_rate_limited(tmp_path: Path) -> None:
    """SPEC J2: five quick progress reports within one interval give one job.progress event."""
    async with serve(tmp_path, jobs={"progress_interval": 3600.0}) as gw, peer(gw) as p:
        job_id = await dispatch(p, "c1", key="a", progress=5)
        progress = await p.expect("job.progress", job_id=job_id)
        assert progress == {
            "type": "job.progress",
            "seq": progress["seq"],
            "job_id": job_id,
            "tool": "hold_job",
            "progress": 0.2,
            "message": "step 1",
            "call_id": "c1",
        }
        await started("a")
        latest = await job_get(p, job_id, "g1")
        assert (latest["progress"], latest["progress_message"]) == (1.0, "step 5")
        release("a")
        await p.expect("job.done", job_id=job_id)
        assert [m["type"] for m in p.seen].count("job.progress") == 1


async def test_j2_every_progress_sent_without_interval(tmp_path: Path) -> None:
    """SPEC J2: with progress_interval 0 every report becomes a job.progress event, in order."""
    async with serve(tmp_path, jobs={"progress_interval": 0.0}) as gw, peer(gw) as p:
        job_id = await dispatch(p, "c1", key="a", progress=5)
        release("a")
        done = await p.expect("job.done", job_id=job_id)
        events = [m for m in p.seen if m["type"] == "job.progress"]
        assert [(e["progress"], e["message"]) for e in events] == [
            (0.2, "step 1"),
            (0.4, "step 2"),
            (0.6, "step 3"),
            (0.8, "step 4"),
            (1.0, "step 5"),
        ]
        assert [e["seq"] for e in events] == list(range(events[0]["seq"], events[0]["seq"] + 5))
        assert done["seq"] == events[-1]["seq"] + 1


async def test_j3_only_own_jobs_are_visible(tmp_path: Path) -> None:
    """SPEC J3: bob cannot get, list or cancel alice's job; alice can."""
    async with serve(tmp_path) as gw, peer(gw) as alice, peer(gw, token="bob-token") as bob:
        job_id = await dispatch(alice, "c1", key="a")
        await bob.send({"type": "job.get", "id": "b1", "job_id": job_id})
        assert await bob.expect("error", id="b1") == {
            "type": "error",
            "id": "b1",
            "code": "unknown_job",
            "message": f"no job {job_id!r}",
        }
        await bob.send({"type": "job.cancel", "id": "b2", "job_id": job_id})
        assert (await bob.expect("error", id="b2"))["code"] == "unknown_job"
        assert await job_list(bob, "b3") == []
        assert await job_list(alice, "a1") == [job_id]
        assert await job_list(alice, "a2", "done") == []
        await alice.send({"type": "job.cancel", "id": "a3", "job_id": job_id})
        cancelled = await alice.expect("job.cancelled", job_id=job_id)
        assert (cancelled["summary"], cancelled["call_id"], cancelled["ok"]) == (
            "hold_job was cancelled",
            "c1",
            False,
        )
        # The reply follows the event and shows the stored final state.
        reply = await alice.expect("job", id="a3")
        assert (reply["job"]["job_id"], reply["job"]["state"]) == (job_id, "cancelled")
        await alice.send({"type": "job.cancel", "id": "a4", "job_id": job_id})
        assert (await alice.expect("error", id="a4"))["code"] == "job_finished"
        assert await job_list(alice, "a5", "cancelled") == [job_id]
        assert [m["type"] for m in bob.seen if "seq" in m] == ["catalog"]


async def test_j4_completion_push_with_default_summary(tmp_path: Path) -> None:
    """SPEC J4: job.done carries job_id, tool, ok, a default summary when none was given, time."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        job_id = await dispatch(p, "c1", key="a")
        release("a")
        done = await p.expect("job.done", job_id=job_id)
        assert done == {
            "type": "job.done",
            "seq": done["seq"],
            "job_id": job_id,
            "tool": "hold_job",
            "ok": True,
            "summary": "hold_job finished",
            "artifacts": [],
            "result": {"key": "a", "job_id": job_id},
            "finished_at": done["finished_at"],
            "call_id": "c1",
        }


async def test_j4_summary_and_artifacts_lifted_out_of_the_result(tmp_path: Path) -> None:
    """SPEC J4: a tool's summary and artifacts go on job.done, not inside result."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        artifacts = [{"name": "r.md", "mime_type": "text/markdown"}]
        job_id = await dispatch(p, "c1", key="a", summary="Report ready.", artifacts=artifacts)
        release("a")
        done = await p.expect("job.done", job_id=job_id)
        assert (done["summary"], done["artifacts"]) == ("Report ready.", artifacts)
        assert done["result"] == {"key": "a", "job_id": job_id}
        stored = await job_get(p, job_id, "g1")
        assert (stored["summary"], stored["artifacts"], stored["result"]) == (
            "Report ready.",
            artifacts,
            done["result"],
        )


async def test_j5_final_state_stored_before_the_event(tmp_path: Path) -> None:
    """SPEC J5: when job.done arrives, the store row already says done."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        job_id = await dispatch(p, "c1", key="a")
        await started("a")
        assert (await job_get(p, job_id, "g0"))["state"] == "running"
        release("a")
        done = await p.expect("job.done", job_id=job_id)
        row = gw.store.job(job_id)  # read at once: no await since the event arrived
        assert row is not None
        assert (row.state, row.finished_at, row.summary) == (
            "done",
            done["finished_at"],
            "hold_job finished",
        )
        assert (row.user, row.profile, row.session_id, row.params) == (
            "alice",
            "demo",
            p.welcome["session_id"],
            {"key": "a"},
        )
        assert (await job_get(p, job_id, "g1"))["state"] == "done"


async def test_case_f11_cancelled_job_late_result_dropped(tmp_path: Path) -> None:
    """Case F11 / SPEC J3: a cancelled running job: one job.cancelled; late result dropped."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "block_job")
        job_id = (await p.terminal("c1"))["job_id"]
        await wait_thread_event(tt.STATE.started)
        await p.send({"type": "job.cancel", "id": "x1", "job_id": job_id})
        cancelled = await p.expect("job.cancelled", job_id=job_id)
        assert (await p.expect("job", id="x1"))["job"]["state"] == "cancelled"
        tt.STATE.release.set()
        await wait_thread_event(tt.STATE.returned)
        assert tt.STATE.cancelled_seen.is_set()
        await p.invoke("c2", "scalar")  # a sentinel: anything late for the job would come first
        await p.terminal("c2")
        events = [m for m in p.seen if m.get("job_id") == job_id and "seq" in m]
        assert [m["type"] for m in events] == ["dispatched", "job.cancelled"]
        row = gw.store.job(job_id)
        assert row is not None
        assert (row.state, row.result, row.finished_at) == (
            "cancelled",
            None,
            cancelled["finished_at"],
        )
        assert tt.STATE.calls == {"block_job": 1, "scalar": 1}
