"""A call promoted to a job holds a job slot while its handler runs (SPEC J1, I14, E2).

A sync call still running at its tool's ``promote_after`` becomes a job (``dispatched``
with a ``job_id``, then ``job.done``). Its handler runs already and cannot be paused, so
it takes its slots at once, under every job bound (``jobs.max_concurrent``,
``jobs.max_per_user``, ``jobs.max_per_session``), even past the bound; jobs submitted
after it wait ``queued`` until the count is back under the bound. The handlers here
wait for the test's release (an :class:`asyncio.Event` per call id) and say when they
start, so no test sleeps to order events.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.config import JobsConfig
from gateway.context import ToolContext
from gateway.job_slots import JobSlots
from tests.support import WAIT, Peer, own_catalog, peer, running, settings_for

TOOLS = """
tools:
  - name: promo
    description: A sync call promoted to a job after 50 ms; waits for the test's release.
    capability: r.basic
    timeout: 0
    promote_after: 0.05
    handler: tests.gateway.test_j1_promoted_slots:held
  - name: held_job
    description: An async job that waits for the test's release.
    capability: r.basic
    mode: async
    handler: tests.gateway.test_j1_promoted_slots:held
  - name: promo_thread
    description: A plain sync call promoted after 50 ms; holds its thread until released.
    capability: r.basic
    timeout: 0
    promote_after: 0.05
    handler: tests.gateway.test_j1_promoted_slots:held_thread
  - name: thread_job
    description: An async job with a plain handler; holds its thread until released.
    capability: r.basic
    mode: async
    handler: tests.gateway.test_j1_promoted_slots:held_thread
"""
PROFILES = "profiles:\n  demo:\n    capabilities: [r.basic]\n"

STARTED: dict[str, asyncio.Event] = {}
RELEASE: dict[str, asyncio.Event] = {}


def _event(table: dict[str, asyncio.Event], call_id: str) -> asyncio.Event:
    if call_id not in table:
        table[call_id] = asyncio.Event()
    return table[call_id]


async def held(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Say it started, then wait until the test releases ``ctx.call_id``."""
    _event(STARTED, ctx.call_id).set()
    await _event(RELEASE, ctx.call_id).wait()
    return {"summary": f"{ctx.call_id} done"}


THREAD_STARTED = threading.Event()
THREAD_RELEASE = threading.Event()


def held_thread(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """In its worker thread: say it started, then wait for the test's release (it does
    not look at ``ctx.cancelled``: a thread cannot be interrupted)."""
    THREAD_STARTED.set()
    THREAD_RELEASE.wait(WAIT)
    return {"summary": f"{ctx.call_id} done"}


async def _started(call_id: str) -> None:
    async with asyncio.timeout(WAIT):
        await _event(STARTED, call_id).wait()


async def _dispatch(p: Peer, call_id: str, tool: str) -> str:
    await p.invoke(call_id, tool, {})
    reply = await p.terminal(call_id)
    assert reply["type"] == "dispatched", reply
    assert reply["promoted"] is tool.startswith("promo"), reply
    return str(reply["job_id"])


async def _state(p: Peer, job_id: str) -> str:
    rid = f"get-{job_id}-{len(p.seen)}"
    await p.send({"type": "job.get", "id": rid, "job_id": job_id})
    return str((await p.expect("job", id=rid))["job"]["state"])


def _settings(tmp: Path, jobs: dict[str, int]) -> Any:
    return settings_for(tmp, catalog=own_catalog(tmp, TOOLS, PROFILES), jobs=jobs)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    STARTED.clear()
    RELEASE.clear()
    THREAD_STARTED.clear()
    THREAD_RELEASE.clear()


@pytest.mark.parametrize(
    ("bound", "other"),
    [
        ("max_concurrent", {"token": "bob-token"}),  # another user's job
        ("max_per_user", {}),  # another session of the same user
        ("max_per_session", None),  # the same session
    ],
)
async def test_j1_i14_a_promoted_job_holds_a_slot_and_a_later_job_waits_queued(
    tmp_path: Path, bound: str, other: dict[str, str] | None
) -> None:
    """SPEC J1, I14, E2: with ``jobs.<bound>`` 1, call `p1` is promoted to a job while
    its handler runs (`running`). A job submitted then (`j2`, from the session or
    principal that bound counts) is `queued` until `p1`'s handler returns, then
    `running`, then `done`. Before, a promoted job took no slot: `j2` ran at once
    beside it, two jobs under a bound of 1."""
    async with running(_settings(tmp_path, {bound: 1})) as gw, peer(gw) as p:
        first = await _dispatch(p, "p1", "promo")
        await _started("p1")
        assert await _state(p, first) == "running"
        async with peer(gw, **other) if other is not None else contextlib.nullcontext(p) as q:
            second = await _dispatch(q, "j2", "held_job")
            assert await _state(q, second) == "queued"
            assert not _event(STARTED, "j2").is_set()
            _event(RELEASE, "p1").set()
            await p.expect("job.done", job_id=first)
            await _started("j2")
            assert await _state(q, second) == "running"
            _event(RELEASE, "j2").set()
            await q.expect("job.done", job_id=second)
        assert gw.tracked()["job_session_bounds"] == 0


async def test_j1_i14_a_job_after_a_promotion_past_the_bound_waits_for_both(
    tmp_path: Path,
) -> None:
    """SPEC J1, I14: ``jobs.max_concurrent`` 1 and job `j1` runs. Call `p2` is promoted
    all the same (its handler runs and cannot be paused): both are `running`, one past
    the bound. Job `j3` then waits `queued` until the count is back under the bound:
    still `queued` once `j1` is done (`p2` holds the slot), `running` once `p2` is done.
    Before, `j3` ran as soon as `j1` ended, beside `p2`."""
    async with running(_settings(tmp_path, {"max_concurrent": 1})) as gw, peer(gw) as p:
        j1 = await _dispatch(p, "j1", "held_job")
        await _started("j1")
        p2 = await _dispatch(p, "p2", "promo")
        await _started("p2")
        j3 = await _dispatch(p, "j3", "held_job")
        assert [await _state(p, job) for job in (j1, p2, j3)] == ["running", "running", "queued"]
        _event(RELEASE, "j1").set()
        await p.expect("job.done", job_id=j1)
        assert await _state(p, j3) == "queued"
        assert not _event(STARTED, "j3").is_set()
        _event(RELEASE, "p2").set()
        await p.expect("job.done", job_id=p2)
        await _started("j3")
        assert await _state(p, j3) == "running"
        _event(RELEASE, "j3").set()
        await p.expect("job.done", job_id=j3)


async def test_j1_f33_slots_given_back_by_cancelled_waiters_reach_the_next_one() -> None:
    """SPEC J1, E3, case F33: the bounds' own wait (an ``asyncio.Semaphore`` cannot be
    taken past its value, a promotion must be). A slot taken at once goes past the
    bound (one job holds the one slot); a waiter cancelled while queued leaves nothing
    behind; a waiter granted the slot in the tick it is cancelled gives it to the next
    one; every entry is gone once nobody holds or awaits a slot."""
    slots = JobSlots(JobsConfig(max_concurrent=1))
    session: Any = SimpleNamespace(id="s1", tenant=None, user="alice")
    holding = {name: asyncio.Event() for name in ("first", "granted", "third")}
    done = {name: asyncio.Event() for name in holding}

    async def job(name: str) -> None:
        async with slots.hold(session):
            holding[name].set()
            await done[name].wait()

    async def waiting(count: int) -> None:
        async with asyncio.timeout(WAIT):
            # The bound's queue is the state under test; tasks reach it in their steps.
            while len(slots._global._waiters) != count:  # noqa: ASYNC110
                await asyncio.sleep(0)

    first = asyncio.create_task(job("first"))
    async with asyncio.timeout(WAIT):
        await holding["first"].wait()
    with slots.take(session):  # past the bound: two held
        gone = asyncio.create_task(job("gone"))
        granted = asyncio.create_task(job("granted"))
        third = asyncio.create_task(job("third"))
        await waiting(3)
        gone.cancel()  # cancelled while queued
        await waiting(2)
        done["first"].set()
        await first  # one held now (the taken one): nobody is granted
        assert not holding["granted"].is_set()
    # The taken slot is given back here and granted to `granted`, cancelled at once.
    granted.cancel()
    async with asyncio.timeout(WAIT):
        await holding["third"].wait()
    done["third"].set()
    async with asyncio.timeout(WAIT):
        await third
    assert gone.cancelled()
    assert granted.cancelled()
    assert not holding["granted"].is_set()
    assert slots.tracked() == {"job_session_bounds": 0, "job_user_bounds": 0}
    assert (slots._global.held, slots._global._waiters) == (0, deque())


@pytest.mark.parametrize("tool", ["promo_thread", "thread_job"])
async def test_j1_i14_a_cancelled_plain_job_holds_its_slot_until_its_thread_returns(
    tmp_path: Path, tool: str
) -> None:
    """SPEC J1, I14, E3 (docs/configuration.md ``jobs.max_concurrent``: a job holds its
    slots until its handler really returns): with ``max_concurrent`` 1, job `p1` runs a
    plain handler (a promoted sync call, or an async tool's job), then `job.cancel` ends
    it `cancelled` while the handler still runs in its thread (a thread cannot be
    interrupted). Job `j2` submitted then waits `queued` until that handler returns,
    then runs. Before, `j2` ran at once beside it."""
    async with running(_settings(tmp_path, {"max_concurrent": 1})) as gw, peer(gw) as p:
        first = await _dispatch(p, "p1", tool)
        assert await asyncio.to_thread(THREAD_STARTED.wait, WAIT)
        await p.send({"type": "job.cancel", "id": "x1", "job_id": first})
        await p.expect("job.cancelled", job_id=first)
        second = await _dispatch(p, "j2", "held_job")
        try:
            assert await _state(p, second) == "queued"
            assert not _event(STARTED, "j2").is_set()
        finally:
            THREAD_RELEASE.set()
            _event(RELEASE, "j2").set()
        await p.expect("job.done", job_id=second)
        assert gw.tracked()["job_session_bounds"] == 0


async def test_j1_e3_fifty_submitters_never_pass_a_bound_and_leave_nothing_held() -> None:
    """SPEC J1, E3, case F33: 50 jobs of 5 users x 2 sessions submitted at once under
    ``max_concurrent`` 4, ``max_per_user`` 2, ``max_per_session`` 1; every fifth is
    cancelled while queued, every seventh raises inside its slot, two promotions take
    slots past the bounds meanwhile. No bound is ever passed by the waiting jobs, all
    the others run, and every count is back to zero with no entry left."""
    slots = JobSlots(JobsConfig(max_concurrent=4, max_per_user=2, max_per_session=1))
    sessions: list[Any] = [
        SimpleNamespace(id=f"s{u}-{k}", tenant=None, user=f"u{u}") for u in range(5) for k in (0, 1)
    ]
    now = {"all": 0, **{s.id: 0 for s in sessions}, **{s.user: 0 for s in sessions}}
    peak = dict.fromkeys(now, 0)
    ran: list[int] = []

    async def job(n: int, session: Any) -> None:
        async with slots.hold(session):
            for key in ("all", session.id, session.user):
                now[key] += 1
                peak[key] = max(peak[key], now[key])
            try:
                ran.append(n)
                await asyncio.sleep(0)
                if n % 7 == 3:
                    raise ValueError(n)
                await asyncio.sleep(0)
            finally:
                for key in ("all", session.id, session.user):
                    now[key] -= 1

    tasks = [asyncio.create_task(job(n, sessions[n % 10])) for n in range(50)]
    await asyncio.sleep(0)
    cancelled = [t for n, t in enumerate(tasks) if n % 5 == 4 and not t.done()]
    for task in cancelled:
        task.cancel()
    with slots.take(sessions[0]), slots.take(sessions[3]):
        for _ in range(20):  # the others go on meanwhile, past the two taken slots
            await asyncio.sleep(0)
    async with asyncio.timeout(WAIT):
        await asyncio.gather(*tasks, return_exceptions=True)
    # The peaks count the waiting jobs only (the taken slots leave them fewer).
    assert peak["all"] <= 4, peak
    assert all(peak[s.id] <= 1 and peak[s.user] <= 2 for s in sessions), peak
    assert len(ran) == 50 - sum(t.cancelled() for t in tasks)
    assert slots.tracked() == {"job_session_bounds": 0, "job_user_bounds": 0}
    assert (slots._global.held, slots._global._waiters) == (0, deque())
