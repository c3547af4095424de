"""Edge defects of the call and job guarantees, each against a real server on 127.0.0.1
with a real client (SPEC J6, E3, I14, I16, D1, D6).

Handlers here wait on :class:`asyncio.Event` objects the test sets, so no test sleeps
to order events.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from websockets.exceptions import ConnectionClosed

from gateway.context import ToolContext
from gateway.server import Gateway
from gateway.store import BadValue, JobRow, SqliteStore, Store
from tests.gateway.store_faults import LOCKER, first_commit_fails, until
from tests.support import WAIT, Peer, own_catalog, peer, settings_for

TOOLS = """
tools:
  - name: wait_job
    description: An async job that waits until the test releases it.
    capability: t
    mode: async
    handler: tests.gateway.test_edge_guarantees:wait_job
    parameters: {type: object, properties: {key: {type: string}}, additionalProperties: false}
  - name: odd_result
    description: Returns a float JSON has no form for, where the test says.
    capability: t
    handler: tests.gateway.test_edge_guarantees:odd_result
    parameters: {type: object, properties: {kind: {type: string}}, additionalProperties: false}
  - name: odd_job
    description: An async job returning a float JSON has no form for.
    capability: t
    mode: async
    handler: tests.gateway.test_edge_guarantees:odd_job
    parameters: {type: object, properties: {place: {type: string}}, additionalProperties: false}
  - name: odd_progress
    description: An async job reporting a NaN progress fraction.
    capability: t
    mode: async
    handler: tests.gateway.test_edge_guarantees:odd_progress
    parameters: {type: object, additionalProperties: false}
  - name: spoils_params
    description: A sync call that puts a set into its own arguments, then runs on.
    capability: t
    timeout: 0
    promote_after: 0.01
    handler: tests.gateway.test_edge_guarantees:spoils_params
    parameters: {type: object, additionalProperties: false}
  - name: spoils_job
    description: An async job that puts a set into its own arguments, then answers.
    capability: t
    mode: async
    handler: tests.gateway.test_edge_guarantees:spoils_job
    parameters: {type: object, properties: {n: {type: integer}}, additionalProperties: false}
  - name: chatty_job
    description: An async job that, once released, reports progress 300 times.
    capability: t
    mode: async
    handler: tests.gateway.test_edge_guarantees:chatty_job
    parameters: {type: object, additionalProperties: false}
"""
PROFILES = "profiles:\n  demo:\n    capabilities: [t]\n"


class Flags:
    """What the handlers saw; reset by :func:`serve`."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.finished = asyncio.Event()
        self.runs = 0


FLAGS = Flags()


async def wait_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    FLAGS.runs += 1
    FLAGS.started.set()
    await FLAGS.release.wait()
    return {"summary": "released", "key": params.get("key")}


async def odd_result(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    value = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}[params["kind"]]
    return {"ok": 1, "series": [1.5, {"v": value}]}


async def odd_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    if params["place"] == "artifacts":
        return {"summary": "s", "artifacts": [{"score": float("inf")}]}
    return {"summary": "s", "stats": {"mean": float("nan")}}


async def odd_progress(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    ctx.progress(float("nan"), "half")
    return {"summary": "not reached"}


async def spoils_params(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    params["seen"] = {1, 2}  # a set: JSON cannot carry it, so the job row cannot be stored
    FLAGS.started.set()
    try:
        await FLAGS.release.wait()
    except asyncio.CancelledError:
        FLAGS.cancelled.set()
        raise
    return {"late": True}


async def spoils_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    params["seen"] = {1, 2}
    return {"summary": "spoiled", "n": params["n"]}


CHATTY_STEPS = 300


async def chatty_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    await FLAGS.release.wait()
    for step in range(1, CHATTY_STEPS + 1):
        ctx.progress(step / CHATTY_STEPS, f"step {step:03d} " + "x" * 40)
        await asyncio.sleep(0)  # one event per tick: each tick's commit fails apart
    FLAGS.finished.set()
    return {"summary": "chatted"}


@asynccontextmanager
async def serve(
    tmp: Path, own_store: Store | None = None, **sections: Any
) -> AsyncIterator[Gateway]:
    """A gateway on this module's catalog (on ``own_store`` when given)."""
    global FLAGS
    FLAGS = Flags()
    catalog = own_catalog(tmp, TOOLS, PROFILES)
    settings = settings_for(tmp, catalog=catalog, **sections)
    gw = Gateway(settings, store=own_store)
    await gw.start()
    try:
        yield gw
    finally:
        FLAGS.release.set()
        await gw.drain()


class RefusingJobs(SqliteStore):
    """A SQLite store that refuses, when it is staged, the job row of a call whose id
    starts with ``refused``: the :class:`BadValue` of a value a store cannot bind (SPEC
    D6). No call can cause one through the wire any more (on PostgreSQL, U+0000 in a
    call id did until schema version 4), so the test injects it at the ``Store`` seam."""

    def stage_job(self, row: JobRow) -> None:
        if (row.call_id or "").startswith("refused"):
            raise BadValue(f"job {row.job_id}: refused by the test's store")
        super().stage_job(row)


async def job_end(p: Peer, job_id: str) -> dict[str, Any]:
    """The one terminal job event of ``job_id`` (SPEC J4)."""
    async with asyncio.timeout(WAIT):
        while True:
            msg = await p.recv()
            if msg.get("job_id") == job_id and msg["type"] in (
                "job.done",
                "job.failed",
                "job.cancelled",
            ):
                return msg


# -- J6, E3: a job cancelled before its task's first step --------------------------------


async def test_j6_e3_job_cancelled_before_its_first_step_ends_and_frees_its_slot(
    tmp_path: Path,
) -> None:
    """SPEC J6, J3, E3, case F33: a job whose task is cancelled in the tick it was
    submitted (before ``_run`` took a step: no ``except``, no ``finally``) still ends
    ``cancelled`` with one event and a stored row, and frees its active entry, progress
    note and slots: with one slot per session the next job runs."""
    async with serve(tmp_path, jobs={"max_per_session": 1}) as gw, peer(gw) as p:
        session = gw.sessions.get(p.welcome["session_id"])
        assert session is not None
        tool = gw.catalog.current.tools["wait_job"]
        ctx = ToolContext(
            session_id=session.id,
            user=session.user,
            profile=session.profile.name,
            context={},
            call_id="direct",
            tool=tool.name,
            data_dir=tmp_path,
        )

        async def post(result: dict[str, Any]) -> tuple[dict[str, Any], bool]:
            return result, False

        job_id = gw.jobs.submit(session, tool, {"key": "a"}, ctx, post)
        task = gw.jobs.cancel(job_id)  # no await in between: the task never stepped
        assert task is not None
        ended = await job_end(p, job_id)
        assert (ended["type"], ended["summary"]) == ("job.cancelled", "wait_job was cancelled")
        assert FLAGS.runs == 0
        row = gw.store.job(job_id)
        assert row is not None
        assert row.state == "cancelled"
        assert gw.jobs.tracked() == {
            "job_session_bounds": 0,
            "job_user_bounds": 0,
            "jobs_active": 0,
            "job_progress": 0,
        }
        # The one per-session slot is free: the next job of the session runs.
        await p.invoke("c2", "wait_job", {"key": "b"})
        dispatched = await p.terminal("c2")
        async with asyncio.timeout(WAIT):
            await FLAGS.started.wait()
        FLAGS.release.set()
        done = await job_end(p, dispatched["job_id"])
        assert (done["type"], done["result"]) == ("job.done", {"key": "b"})
        assert [m["type"] for m in p.seen if m.get("job_id") == job_id] == ["job.cancelled"]


# -- I14, I16: promotion whose job cannot be created -------------------------------------


async def test_i14_i16_promotion_that_cannot_create_its_job_cancels_the_handler(
    tmp_path: Path,
) -> None:
    """SPEC I14, I9, I16, D6: a store that refuses a job row (:class:`RefusingJobs`). A
    sync call past ``promote_after`` whose job therefore cannot be created ends in
    exactly one typed ``call.error`` naming the problem, its running handler is
    cancelled and no job is left; an async call is never dispatched, ending the same
    way. A re-send returns that terminal; the session goes on serving."""
    (tmp_path / "data").mkdir()
    store = RefusingJobs(tmp_path / "data" / "toolbus.db")
    async with serve(tmp_path, own_store=store) as gw, peer(gw) as p:
        await p.invoke("refused-1", "spoils_params", {})
        err = await p.terminal("refused-1")
        assert err["type"] == "call.error"
        assert err["code"] == "handler_error"
        assert err["message"].startswith("the call could not become a job: job job_")
        assert err["message"].endswith(": refused by the test's store")
        async with asyncio.timeout(WAIT):
            await FLAGS.cancelled.wait()
        await p.invoke("refused-2", "wait_job", {})
        err_async = await p.terminal("refused-2")
        assert (err_async["type"], err_async["code"]) == ("call.error", "handler_error")
        assert err_async["message"].endswith(": refused by the test's store")
        assert FLAGS.runs == 0
        assert gw.jobs.tracked()["jobs_active"] == 0
        assert not [m for m in p.seen if m["type"].startswith("job.")]
        # A re-send returns the recorded terminal (SPEC I12), not a second run.
        await p.invoke("refused-1", "spoils_params", {})
        assert await p.terminal("refused-1") == err
        terminals = ("result", "dispatched", "call.error")
        seen = [m["type"] for m in p.seen if m.get("call_id") == "refused-1"]
        assert [t for t in seen if t in terminals] == ["call.error", "call.error"]
        await p.invoke("c2", "odd_result", {"kind": "nan"})  # the session still serves
        assert (await p.terminal("c2"))["type"] == "call.error"


async def test_i14_j5_promoted_handler_changing_its_arguments_does_not_change_the_job(
    tmp_path: Path,
) -> None:
    """SPEC I14, J5: a promoted sync handler that puts a set into its own arguments does
    not spoil its job: the job is created with the arguments the call was given and
    ends ``done``."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "spoils_params", {})
        dispatched = await p.terminal("c1")
        assert (dispatched["type"], dispatched["promoted"]) == ("dispatched", True)
        FLAGS.release.set()
        done = await job_end(p, dispatched["job_id"])
        assert (done["type"], done["result"]) == ("job.done", {"late": True})
        row = gw.store.job(dispatched["job_id"])
        assert row is not None
        assert (row.state, row.params) == ("done", {})


async def test_j5_i16_job_handler_changing_its_arguments_does_not_change_the_job(
    tmp_path: Path,
) -> None:
    """SPEC J1, J5, I16: a job handler that puts a value JSON cannot carry into its own
    arguments still ends ``done``; the stored job keeps the arguments it was given."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "spoils_job", {"n": 3})
        job_id = (await p.terminal("c1"))["job_id"]
        done = await job_end(p, job_id)
        assert (done["type"], done["result"]) == ("job.done", {"n": 3})
        row = gw.store.job(job_id)
        assert row is not None
        assert (row.state, row.params) == ("done", {"n": 3})
        assert gw.jobs.tracked()["jobs_active"] == 0


# -- I16: NaN and Infinity never become null ----------------------------------------------


async def test_i16_non_finite_floats_in_a_result_end_the_call_naming_the_path(
    tmp_path: Path,
) -> None:
    """SPEC I16: orjson writes NaN and +-Infinity as ``null``; a result holding one
    ends the call ``handler_error`` naming where it is, instead of changed data."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        for call_id, kind, name in (("n", "nan", "NaN"), ("i", "inf", "Infinity")):
            await p.invoke(call_id, "odd_result", {"kind": kind})
            err = await p.terminal(call_id)
            assert (err["type"], err["code"]) == ("call.error", "handler_error")
            assert err["message"] == (
                f"the handler's value cannot be sent: result.series[1].v: {name} is not a "
                "JSON number"
            )
        await p.invoke("m", "odd_result", {"kind": "-inf"})
        err = await p.terminal("m")
        assert err["message"].endswith("result.series[1].v: -Infinity is not a JSON number")


async def test_i16_non_finite_floats_in_job_results_artifacts_and_progress_fail_the_job(
    tmp_path: Path,
) -> None:
    """SPEC I16, J2, J4: the same for a job's result, its artifacts and a progress
    fraction: the job ends ``failed`` ``handler_error`` naming the problem."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        expected = {
            "result": "the handler's value cannot be sent: result.stats.mean: NaN is not a "
            "JSON number",
            "artifacts": "the handler's value cannot be sent: artifacts[0].score: Infinity "
            "is not a JSON number",
        }
        for place, message in expected.items():
            await p.invoke(place, "odd_job", {"place": place})
            job_id = (await p.terminal(place))["job_id"]
            failed = await job_end(p, job_id)
            assert failed["type"] == "job.failed"
            assert failed["error"] == {"code": "handler_error", "message": message}
        await p.invoke("prog", "odd_progress", {})
        job_id = (await p.terminal("prog"))["job_id"]
        failed = await job_end(p, job_id)
        assert failed["error"] == {
            "code": "handler_error",
            "message": "ValueError: progress: fraction must be a finite number or None, not nan",
        }
        assert not [m for m in p.seen if m["type"] == "job.progress"]
        row = gw.store.job(job_id)
        assert row is not None
        assert row.state == "failed"


# -- D1, D6: welcome only after the new session's row is committed -----------------------


async def test_d1_d6_hello_while_the_store_cannot_commit_is_refused_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """SPEC D1, D6, S1: another process holds a write lock on the SQLite file. A first
    ``hello`` gets its ``welcome``: its session row is journaled (durable, D1) and the
    commit it owes is the one that fails on the lock. From then on the store cannot
    commit: a fresh ``hello`` is answered ``error`` ``unavailable`` and closed 1013 (try
    again later), never with a ``welcome`` for a session the store did not keep. Once
    the lock is gone a hello works, and the store holds those two sessions only."""
    db = tmp_path / "data" / "toolbus.db"
    async with serve(tmp_path) as gw:
        locker = await asyncio.create_subprocess_exec(
            sys.executable, "-c", LOCKER, str(db), stdin=PIPE, stdout=PIPE
        )
        try:
            assert locker.stdout is not None
            assert locker.stdin is not None
            assert await locker.stdout.readline() == b"locked\n"
            async with peer(gw) as first:
                kept = first.welcome["session_id"]
                await until(lambda: gw.outbox.failing_since is not None, "a failed commit")
                async with peer(gw, hello=False) as p:
                    await p.send({"type": "hello", "token": "alice-token", "profile": "demo"})
                    err = await p.recv()
                    assert err == {
                        "type": "error",
                        "code": "unavailable",
                        "message": "the store cannot commit right now; try again later",
                    }
                    async with asyncio.timeout(WAIT):
                        await p.ws.wait_closed()
                    assert p.ws.close_code == 1013
                assert list(gw.sessions.sessions) == [kept]
                locker.stdin.write(b"release\n")
                await locker.stdin.drain()
                assert await locker.wait() == 0
                await until(lambda: gw.outbox.failing_since is None, "commits to work again")
        finally:
            if locker.returncode is None:
                locker.kill()
            await locker.communicate()
        async with peer(gw) as p:
            await p.expect("catalog")
            await until(lambda: not gw.store.owed, "the owed commit")
            with sqlite3.connect(db) as conn:
                rows = conn.execute("SELECT session_id FROM sessions").fetchall()
            conn.close()
            assert sorted(rows) == sorted([(kept,), (p.welcome["session_id"],)])


# -- D5, D6: frames held during a store outage are bounded per socket ---------------------


async def test_d5_d6_frames_held_in_a_store_outage_are_bounded_and_resume_recovers_them(
    tmp_path: Path,
) -> None:
    """SPEC D5, D6, D3: while another process holds the SQLite write lock a job emits
    300 ``job.progress`` events and ``job.done``. Nothing is sent unstored; once the
    frames held for the socket pass its queue bound (``server.max_outbound_bytes``) the
    socket is closed 1013 as a slow consumer and the server holds nothing more for it;
    after the lock is released a resume replays every event, gap-free, once."""
    db = tmp_path / "data" / "toolbus.db"
    sections: dict[str, Any] = {
        "server": {"port": 0, "heartbeat_interval": 0, "max_outbound_bytes": 4096},
        "jobs": {"progress_interval": 0},
        "store": {"retry_max": 0.01},
    }
    async with serve(tmp_path, **sections) as gw:
        async with peer(gw) as p:
            await p.invoke("c1", "chatty_job", {})
            job_id = (await p.terminal("c1"))["job_id"]
            seen = max(int(m["seq"]) for m in p.seen if "seq" in m)
            locker = await asyncio.create_subprocess_exec(
                sys.executable, "-c", LOCKER, str(db), stdin=PIPE, stdout=PIPE
            )
            try:
                assert locker.stdout is not None
                assert locker.stdin is not None
                assert await locker.stdout.readline() == b"locked\n"
                await first_commit_fails(gw, p)  # not only when the owed commit is due (D1)
                FLAGS.release.set()
                async with asyncio.timeout(WAIT):
                    while True:  # nothing of the job arrives: it is not stored
                        try:
                            msg = await p.recv()
                        except ConnectionClosed:
                            break
                        assert "seq" not in msg, msg
                assert p.ws.close_code == 1013
                reason = p.ws.close_reason or ""
                assert reason.startswith("slow consumer: "), reason
                assert reason.endswith(" bytes held while the store cannot commit > 4096")
                async with asyncio.timeout(WAIT):
                    await FLAGS.finished.wait()
                assert gw.outbox.held == 0  # nothing more kept for the closed socket
                locker.stdin.write(b"release\n")
                await locker.stdin.drain()
                assert await locker.wait() == 0
            finally:
                if locker.returncode is None:
                    locker.kill()
                await locker.communicate()
        welcome = p.welcome
        async with asyncio.timeout(WAIT):
            while gw.outbox.failing_since is not None:  # noqa: ASYNC110 - retry timer
                await asyncio.sleep(0.01)
        async with peer(
            gw,
            session_id=welcome["session_id"],
            resume_token=welcome["resume_token"],
            last_seq=seen,
        ) as again:
            assert again.welcome["resumed"] is True
            done = await job_end(again, job_id)
            assert done["type"] == "job.done"
            events = [m for m in again.seen if "seq" in m]
            assert [m["seq"] for m in events] == list(range(seen + 1, seen + len(events) + 1))
            progress = [m["message"][:8] for m in events if m["type"] == "job.progress"]
            assert progress == [f"step {n:03d}" for n in range(1, CHATTY_STEPS + 1)]
