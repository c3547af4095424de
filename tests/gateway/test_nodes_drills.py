"""Failure drills of three nodes behind HAProxy (round robin, no stickiness) with 50
sessions of the real client (``toolbus.connect``) under load (SPEC N4, D1-D3, I15, J5).

Each drill counts, and prints, what a client would notice: events lost (a gap in a
session's ``seq``, or an expected event that never came), duplicates after the client's
``seq`` dedup (a call, approval or job settled twice under two seqs), how many times each
call's handler ran (counted by the handler itself, in a file, on whichever node), jobs
with no terminal event, and client-visible failures. The counts are also written to
``counts.json`` under the test's folder.
"""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg

import toolbus
from protocol import messages as m
from tests.gateway.drill_tools import DrillNode, Seen, runs
from tests.gateway.lb_tools import haproxy
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import WAIT

SESSIONS = 50
DRILL = 25.0
"""Seconds one drill may take end to end on the project's loaded 2-core machine."""
ROLLING = 60.0
"""Seconds the rolling restart may take end to end (three drains and three starts)."""


def _client(front: str, seen: Seen, **options: Any) -> toolbus.Client:
    return toolbus.connect(
        front,
        token="alice-token",
        profile="demo",
        request_timeout=WAIT,
        on_message=seen,
        backoff=toolbus.Backoff(initial=0.05, cap=0.5),
        **options,
    )


@asynccontextmanager
async def _gateway(folder: Path, url: str) -> AsyncIterator[tuple[list[DrillNode], str]]:
    """Nodes a, b, c on the store ``url`` (one after the other), HAProxy in front."""
    nodes = [DrillNode(folder, url, name) for name in "abc"]
    try:
        for node in nodes:
            await node.start()
        async with haproxy(folder, [(n.name, n.address) for n in nodes]) as front:
            yield nodes, front
    finally:
        for node in nodes:
            if node.proc is not None:
                await node.stop()


async def _load(
    stack: AsyncExitStack, front: str, folder: Path, seen: list[Seen], ask: str
) -> tuple[list[toolbus.Client], list[toolbus.JobHandle], list[asyncio.Task[Any]]]:
    """The drills' load: one client per ``seen`` (every call gated), each with an
    approved job held running (every other one idempotent) and a ``count_call``
    ``s<i>-<ask>`` waiting for approval. Returns the clients, job handles and call tasks."""
    params = {"dir": str(folder)}
    buses = [
        await stack.enter_async_context(_client(front, s, confirm_tool_calls=True)) for s in seen
    ]
    handles: list[toolbus.JobHandle] = []
    asks: list[asyncio.Task[Any]] = []
    for i, bus in enumerate(buses):
        tool = "held_idem" if i % 2 else "held_job"
        job = asyncio.create_task(bus.invoke(tool, params, call_id=f"s{i}-job"))
        await until(lambda b=bus: len(b.pending_approvals) == 1, "the job's approval")
        await bus.pending_approvals[0].decide(m.Decision.ALLOW)
        handle = await job
        assert isinstance(handle, toolbus.JobHandle)
        handles.append(handle)
        asks.append(asyncio.create_task(bus.invoke("count_call", params, call_id=f"s{i}-{ask}")))
    await until(lambda: all(len(b.pending_approvals) == 1 for b in buses), "every approval")
    await until(lambda: len(runs(folder)) == len(seen), "every job running")
    return buses, handles, asks


def _owners(url: str) -> dict[str, str]:
    with psycopg.connect(url, autocommit=True) as db:
        rows = db.execute("SELECT session_id, owner_node FROM sessions").fetchall()
    return {str(s): str(o) for s, o in rows}


async def until(check: Callable[[], bool], what: str, within: float = WAIT) -> None:
    """Poll ``check`` until it holds (another process changes what it reads)."""
    try:
        async with asyncio.timeout(within):
            while not check():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"not within {within} s: {what}") from None


def _record(folder: Path, counts: dict[str, Any]) -> None:
    (folder / "counts.json").write_text(json.dumps(counts, indent=2, sort_keys=True))
    print("\n" + json.dumps(counts, sort_keys=True))


async def test_n4_drill_kill9_one_of_three_nodes_behind_haproxy_loses_nothing(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N4, N2, J5, A4, I15: 50 sessions through HAProxy over 3 nodes, each with a
    job running (every other one idempotent) and a call waiting for approval; one node
    is killed with SIGKILL. Every client of it resumes through HAProxy on a live node;
    no event is lost or settled twice; the dead node's pending approvals resolve
    ``disconnected`` and their calls end ``unavailable`` (never run, J6); its plain jobs end
    ``failed`` ``interrupted`` and its idempotent ones re-run once and end ``done``;
    every other call and job runs exactly once; every job has a terminal event."""
    began = time.monotonic()
    async with _gateway(tmp_path, pg_url) as (nodes, front), AsyncExitStack() as stack:
        seen = [Seen() for _ in range(SESSIONS)]
        buses, handles, asks = await _load(stack, front, tmp_path, seen, "ask")
        owners = _owners(pg_url)
        on = {
            n.name: [
                i
                for i, b in enumerate(buses)
                if owners[str(b.session_id)].startswith(n.node_prefix)
            ]
            for n in nodes
        }
        victim = max(nodes, key=lambda n: len(on[n.name]))
        moved = on[victim.name]
        live = [n for n in nodes if n is not victim]
        killed = time.monotonic()
        await victim.kill()

        def resumed() -> bool:
            now = _owners(pg_url)
            return all(
                buses[i].reconnects >= 1
                and buses[i].connected
                and any(now[str(buses[i].session_id)].startswith(n.node_prefix) for n in live)
                for i in moved
            )

        await until(resumed, "every client of the dead node resumed on a live node")
        failover = time.monotonic() - killed
        sessions = [bus.session_id for bus in buses]
        # The dead node's approvals resolve (SPEC A4, N4); the others still wait.
        for i in moved:
            with_error = await asyncio.wait_for(
                asyncio.gather(asks[i], return_exceptions=True), WAIT
            )
            assert isinstance(with_error[0], toolbus.CallFailed), with_error
            assert with_error[0].code == "unavailable", with_error  # SPEC J6: never ran
        for i, bus in enumerate(buses):
            if i not in moved:
                await bus.pending_approvals[0].decide(m.Decision.ALLOW)
                out = await asyncio.wait_for(asks[i], WAIT)
                assert isinstance(out, m.Result)
        (tmp_path / "go").touch()
        outcomes = [await h.result(timeout=2 * WAIT) for h in handles]
        for bus in buses:
            await bus.jobs(timeout=WAIT)  # a round trip: every event before it has arrived
        assert [bus.session_id for bus in buses] == sessions
        assert all(
            bus.welcome is not None and bus.welcome.resumed
            for i, bus in enumerate(buses)
            if i in moved
        )
    ran = runs(tmp_path)
    expected = collections.Counter[str]()
    for i in range(SESSIONS):
        expected[f"s{i}-job"] = 2 if (i in moved and i % 2) else 1
        if i not in moved:
            expected[f"s{i}-ask"] = 1
    reruns = sorted(k for k, n in ran.items() if n > 1)
    states = collections.Counter((o.state, o.error.code if o.error else None) for o in outcomes)
    missing_resolved = sum(1 for i in moved if len(seen[i].resolved[f"s{i}-ask"]) != 1)
    denied = [
        seen[i].resolved[f"s{i}-ask"][0].reason for i in moved if seen[i].resolved[f"s{i}-ask"]
    ]
    counts = {
        "drill": "kill -9 one of 3 nodes",
        "sessions": SESSIONS,
        "sessions_on_killed_node": len(moved),
        "lost_events": sum(s.gaps() for s in seen) + missing_resolved,
        "duplicates_after_dedup": sum(s.duplicates() for s in seen),
        "duplicated": [d for s in seen for d in s.twice()],
        "calls_not_run_exactly_as_expected": sum(
            1 for k in expected | ran if ran[k] != expected[k]
        ),
        "idempotent_reruns": len(reruns),
        "jobs_without_terminal_event": sum(
            1 for i, h in enumerate(handles) if seen[i].jobs[h.job_id] != 1
        ),
        "job_outcomes": {f"{s}:{c}": n for (s, c), n in sorted(states.items(), key=str)},
        "failover_seconds": round(failover, 3),
        "drill_seconds": round(time.monotonic() - began, 1),
    }
    _record(tmp_path, counts)
    assert counts["lost_events"] == 0
    assert counts["duplicates_after_dedup"] == 0
    assert ran == expected
    assert reruns == sorted(f"s{i}-job" for i in moved if i % 2)
    assert counts["jobs_without_terminal_event"] == 0
    assert set(denied) == {"disconnected"}
    dead_plain = sum(1 for i in moved if not i % 2)
    assert (
        states
        == collections.Counter(
            {("done", None): SESSIONS - dead_plain, ("failed", "interrupted"): dead_plain}
        )
        - collections.Counter()
    )
    assert counts["drill_seconds"] < DRILL


def _jobs_running_on(url: str, node_prefix: str) -> list[str]:
    """The call ids of the jobs running on the node whose id starts with the prefix."""
    with psycopg.connect(url, autocommit=True) as db:
        rows = db.execute(
            "SELECT call_id FROM jobs WHERE state='running' AND node_id LIKE %s",
            (node_prefix + "%",),
        ).fetchall()
    return [bytes(r[0]).decode() for r in rows]  # UTF-8 BYTEA (schema version 4, SPEC D6)


async def test_n6_drill_rolling_restart_of_three_nodes_behind_haproxy_no_client_visible_failure(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N6, S4, N3, J6, A3, I15: 50 sessions through HAProxy over 3 nodes, each with a
    job running (every other one idempotent) and a call waiting for approval; the nodes
    are drained (SIGTERM) and restarted one at a time. Each drained node's clients
    resume through HAProxy on the other nodes at once; their pending approvals are
    decided there (routed to the draining node, which runs the call) and its jobs end
    during its drain: every outcome reaches the client on its new node. Counted: 0
    client-visible failures (no call or job fails, every session resumes as itself),
    0 events lost, 0 duplicates, every handler ran exactly once."""
    began = time.monotonic()
    rolls: list[dict[str, Any]] = []
    async with _gateway(tmp_path, pg_url) as (nodes, front), AsyncExitStack() as stack:
        folder = {"dir": str(tmp_path)}
        seen = [Seen() for _ in range(SESSIONS)]
        buses, handles, first = await _load(stack, front, tmp_path, seen, "ask0")
        asks = {f"s{i}-ask0": task for i, task in enumerate(first)}
        sessions = [bus.session_id for bus in buses]
        for turn, node in enumerate(nodes, start=1):
            owners = _owners(pg_url)
            prefix = node.node_prefix
            moved = [i for i, b in enumerate(buses) if owners[str(b.session_id)].startswith(prefix)]
            before = [buses[i].reconnects for i in moved]
            assert node.proc is not None
            started = time.monotonic()
            node.proc.send_signal(signal.SIGTERM)
            # Its jobs may end now: they end during its drain, as they really end (J6).
            for call_id in _jobs_running_on(pg_url, prefix):
                (tmp_path / f"go-{call_id}").touch()

            def resumed(
                moved: list[int] = moved, before: list[int] = before, prefix: str = prefix
            ) -> bool:
                now = _owners(pg_url)
                return all(
                    buses[i].reconnects > was
                    and buses[i].connected
                    and not now[str(buses[i].session_id)].startswith(prefix)
                    for i, was in zip(moved, before, strict=True)
                )

            await until(resumed, f"the clients of node {node.name} resumed on other nodes")
            moved_after = time.monotonic() - started
            # Their approvals, waiting on the draining node, are decided on the new one.
            for i in moved:
                for approval in list(buses[i].pending_approvals):
                    await approval.decide(m.Decision.ALLOW)
                call_id = f"s{i}-ask{turn}"
                asks[call_id] = asyncio.create_task(
                    buses[i].invoke("count_call", folder, call_id=call_id)
                )
            assert await asyncio.wait_for(node.proc.wait(), 30) == 0  # drained, exit 0
            drained = time.monotonic() - started
            await node.start()
            rolls.append(
                {
                    "node": node.name,
                    "sessions_moved": len(moved),
                    "seconds_to_resume_all": round(moved_after, 3),
                    "seconds_to_drain": round(drained, 3),
                }
            )
        # Every job got its go during its node's drain; the last calls wait for approval.
        outcomes = [await h.result(timeout=2 * WAIT) for h in handles]
        await until(lambda: all(len(b.pending_approvals) == 1 for b in buses), "the last approvals")
        for bus in buses:
            await bus.pending_approvals[0].decide(m.Decision.ALLOW)
        answers = await asyncio.wait_for(
            asyncio.gather(*asks.values(), return_exceptions=True), WAIT
        )
        for bus in buses:
            await bus.jobs(timeout=WAIT)  # a round trip: every event before it has arrived
        assert [bus.session_id for bus in buses] == sessions
        resumed_as_itself = sum(
            1 for b in buses if b.reconnects and b.welcome is not None and b.welcome.resumed
        )
        reconnects = sum(b.reconnects for b in buses)
    ran = runs(tmp_path)
    expected = collections.Counter[str]({f"s{i}-job": 1 for i in range(SESSIONS)})
    expected.update(asks.keys())
    failures = [a for a in answers if not isinstance(a, m.Result)]
    failures += [o for o in outcomes if o.state != m.JobState.DONE]
    counts = {
        "drill": "rolling restart of 3 nodes",
        "sessions": SESSIONS,
        "rolls": rolls,
        "client_reconnects": reconnects,
        "client_visible_failures": len(failures),
        "lost_events": sum(s.gaps() for s in seen),
        "duplicates_after_dedup": sum(s.duplicates() for s in seen),
        "duplicated": [d for s in seen for d in s.twice()],
        "calls_not_run_exactly_once": sum(1 for k in expected | ran if ran[k] != expected[k]),
        "calls": len(asks),
        "jobs_without_terminal_event": sum(
            1 for i, h in enumerate(handles) if seen[i].jobs[h.job_id] != 1
        ),
        "drill_seconds": round(time.monotonic() - began, 1),
    }
    _record(tmp_path, counts)
    assert failures == []
    assert counts["lost_events"] == 0
    assert counts["duplicates_after_dedup"] == 0
    assert ran == expected
    assert counts["jobs_without_terminal_event"] == 0
    assert sum(r["sessions_moved"] for r in rolls) >= SESSIONS
    assert resumed_as_itself == SESSIONS
    assert counts["drill_seconds"] < ROLLING
