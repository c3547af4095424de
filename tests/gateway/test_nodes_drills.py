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
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from pydantic import BaseModel

import toolbus
from protocol import messages as m
from tests.gateway.drill_tools import DrillNode, runs
from tests.gateway.lb_tools import haproxy
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import WAIT

SESSIONS = 50
DRILL = 25.0
"""Seconds one drill may take end to end on the project's loaded 2-core machine."""

TERMINAL_CALL = (m.Result, m.Dispatched, m.CallError)
TERMINAL_JOB = (m.JobDone, m.JobFailed, m.JobCancelled)


@dataclass
class Seen:
    """What one client processed (after its own ``seq`` dedup), for the counts."""

    seqs: list[int] = field(default_factory=list)
    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    jobs: collections.Counter[str] = field(default_factory=collections.Counter)
    resolved: dict[str, list[m.ToolResolved]] = field(
        default_factory=lambda: collections.defaultdict(list)
    )

    def __call__(self, msg: BaseModel) -> None:
        seq = getattr(msg, "seq", None)
        if not seq:
            return
        self.seqs.append(seq)
        if isinstance(msg, TERMINAL_CALL):
            self.calls[msg.call_id] += 1
        elif isinstance(msg, TERMINAL_JOB):
            self.jobs[msg.job_id] += 1
        elif isinstance(msg, m.ToolResolved):
            self.resolved[msg.call_id].append(msg)

    def gaps(self) -> int:
        """Seqs missing between 1 and the highest processed (events lost)."""
        return max(self.seqs, default=0) - len(set(self.seqs))

    def duplicates(self) -> int:
        """Events processed twice: one seq twice, or one outcome under two seqs."""
        again = len(self.seqs) - len(set(self.seqs))
        settled = [*self.calls.values(), *self.jobs.values()]
        settled += [len(v) for v in self.resolved.values()]
        return again + sum(n - 1 for n in settled if n > 1)


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
    ``disconnected`` and their calls end ``cancelled`` (never run); its plain jobs end
    ``failed`` ``interrupted`` and its idempotent ones re-run once and end ``done``;
    every other call and job runs exactly once; every job has a terminal event."""
    began = time.monotonic()
    async with _gateway(tmp_path, pg_url) as (nodes, front), AsyncExitStack() as stack:
        folder = {"dir": str(tmp_path)}
        seen = [Seen() for _ in range(SESSIONS)]
        buses = [
            await stack.enter_async_context(_client(front, s, confirm_tool_calls=True))
            for s in seen
        ]
        handles: list[toolbus.JobHandle] = []
        asks: list[asyncio.Task[Any]] = []
        for i, bus in enumerate(buses):
            tool = "held_idem" if i % 2 else "held_job"
            job = asyncio.create_task(bus.invoke(tool, folder, call_id=f"s{i}-job"))
            await until(lambda b=bus: len(b.pending_approvals) == 1, "the job's approval")
            await bus.pending_approvals[0].decide(m.Decision.ALLOW)
            handle = await job
            assert isinstance(handle, toolbus.JobHandle)
            handles.append(handle)
            asks.append(asyncio.create_task(bus.invoke("count_call", folder, call_id=f"s{i}-ask")))
        await until(lambda: all(len(b.pending_approvals) == 1 for b in buses), "50 approvals")
        await until(lambda: len(runs(tmp_path)) == SESSIONS, "50 jobs running")
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
            assert with_error[0].code == "cancelled", with_error
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
