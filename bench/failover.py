"""P9: failover, seconds from ``kill -9`` of a node to every session resumed (issue 10,
SPEC N4, N2, N6, D3).

Each phase starts a gateway of its own: a fresh PostgreSQL database
(:func:`bench.nodes.fresh_database`), three ``toolbus serve`` nodes on it
(:class:`tests.gateway.drill_tools.DrillNode`, the N4 drill's node and handlers) and
HAProxy in front (:func:`tests.gateway.lb_tools.haproxy`, the configuration
docs/deploy.md shows, with its default health checks: ``inter 2s fall 2 rise 2``).
N clients of the real client (``toolbus.connect``, default backoff, ``seq`` dedup,
``confirm_tool_calls``) connect through HAProxy; each starts a job whose handler runs
until the bench lets it end (every other one idempotent), and a call left waiting for
its approval: the workload of ``tests/gateway/test_nodes_drills.py``. Then the node
holding the most sessions is

- **kill**: sent SIGKILL; or
- **drain**: sent SIGTERM (a graceful drain, SPEC S4, N6: ``reconnect`` hint, close 1012).

From the signal, the bench polls its clients (every 2 ms) until each client of that node
has a socket again whose ``welcome`` says ``resumed``; the last one's time is the
phase's value. After a kill it also times until every pending approval of the dead
node's calls has resolved (``disconnected``, SPEC A4: a live node claimed the dead one,
within one ``nodes.lease_interval``). Then it lets the jobs end, answers the approvals
still pending, waits for every outcome and counts, with
:class:`tests.gateway.drill_tools.Seen`, events lost (a ``seq`` gap, or an expected
event that never came), duplicates after the client's dedup, sessions that were not
resumed, and clients that failed (ended by a terminal close such as 4000, or a call or job
whose outcome never came; what they did not get is not counted as lost). The nodes run
the gateway's defaults (``lease_interval`` 1 s, ``lease_ttl`` 5 s) except
``server.drain_retry_after``, set to 0 so that the drain is a plain reconnect and resume,
with no deliberate wait (docs/bench.md says why). Full run only
(``bench.run.FULL_ONLY``). Needs PostgreSQL (:data:`bench.nodes.PG_URL`) and HAProxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

import toolbus
from bench import clients as c
from bench.nodes import fresh_database
from protocol import messages as m
from tests.gateway.drill_tools import DrillNode, Seen, runs
from tests.gateway.lb_tools import haproxy

KINDS = ("kill", "drain")
WAIT = 30.0
"""Seconds any one step of a phase may take before the phase fails."""
POLL = 0.002
"""Seconds between two looks at the clients' state."""
OVERRIDES: dict[str, dict[str, Any]] = {
    # The gateway's defaults, but no wait before the drain's reconnect: the baseline is
    # the reconnect and resume itself.
    "nodes": {"lease_interval": 1.0, "lease_ttl": 5.0},
    "server": {"drain_retry_after": 0.0},
}


def _owners(url: str) -> dict[str, str]:
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as db:
        rows = db.execute("SELECT session_id, owner_node FROM sessions").fetchall()
    return {str(s): str(o) for s, o in rows}


async def _until(check: Any, what: str) -> None:
    try:
        async with asyncio.timeout(WAIT):
            while not check():  # noqa: ASYNC110  (other processes change what it reads)
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise RuntimeError(f"not within {WAIT} s: {what}") from None


async def _phase(kind: str, sessions: int, folder: Path, url: str) -> dict[str, Any]:
    """One gateway, ``sessions`` clients with work pending, one node killed or drained."""
    nodes = [DrillNode(folder, url, name, OVERRIDES) for name in "abc"]
    try:
        # The first one alone: it creates the schema (two nodes migrating a fresh
        # database at once: one may fail on the migration's lock timeout).
        await nodes[0].start()
        await asyncio.gather(*(n.start() for n in nodes[1:]))
        servers = [(n.name, n.address) for n in nodes]
        async with haproxy(folder, servers, "inter 2s fall 2 rise 2") as front:
            return await _drive(kind, sessions, folder, url, nodes, front)
    finally:
        for node in nodes:
            if node.proc is not None and node.proc.returncode is None:
                with contextlib.suppress(Exception):
                    await node.stop()


async def _drive(
    kind: str, sessions: int, folder: Path, url: str, nodes: list[DrillNode], front: str
) -> dict[str, Any]:
    params = {"dir": str(folder)}
    seen = [Seen() for _ in range(sessions)]
    async with contextlib.AsyncExitStack() as stack:
        buses = [
            await stack.enter_async_context(
                toolbus.connect(
                    front,
                    token="alice-token",
                    profile="demo",
                    request_timeout=WAIT,
                    on_message=s,
                    confirm_tool_calls=True,
                )
            )
            for s in seen
        ]
        asks: list[asyncio.Task[Any]] = []

        async def start(i: int, bus: toolbus.Client) -> toolbus.JobHandle:
            tool = "held_idem" if i % 2 else "held_job"
            job = asyncio.create_task(bus.invoke(tool, params, call_id=f"s{i}-job"))
            await _until(lambda: len(bus.pending_approvals) == 1, "the job's approval")
            await bus.pending_approvals[0].decide(m.Decision.ALLOW)
            handle = await job
            assert isinstance(handle, toolbus.JobHandle), handle
            return handle

        handles = list(await asyncio.gather(*(start(i, b) for i, b in enumerate(buses))))
        for i, bus in enumerate(buses):
            asks.append(asyncio.create_task(bus.invoke("count_call", params, call_id=f"s{i}-ask")))
        await _until(lambda: all(len(b.pending_approvals) == 1 for b in buses), "approvals")
        await _until(lambda: len(runs(folder)) == sessions, "every job running")
        owners = _owners(url)
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
        assert victim.proc is not None
        resumed_at: dict[int, float] = {}
        settled_at = None
        t0 = time.monotonic()
        victim.proc.send_signal(signal.SIGKILL if kind == "kill" else signal.SIGTERM)
        async with asyncio.timeout(WAIT):
            while (kind == "kill" and settled_at is None) or any(
                i not in resumed_at and not buses[i].closed for i in moved
            ):
                now = time.monotonic() - t0
                for i in moved:
                    bus = buses[i]
                    w = bus.welcome
                    if i not in resumed_at and bus.reconnects and bus.connected and w and w.resumed:
                        resumed_at[i] = now
                if settled_at is None and all(asks[i].done() for i in moved):
                    settled_at = now
                await asyncio.sleep(POLL)
        if kind == "kill":
            await victim.proc.wait()
        owners = _owners(url)
        elsewhere = sum(
            1
            for i in moved
            if any(owners[str(buses[i].session_id)].startswith(n.node_prefix) for n in live)
        )
        # The rest of the work: approvals still pending are answered (on whichever node
        # the client now is; SPEC N3 routes them), the jobs end, every outcome arrives.
        for i, bus in enumerate(buses):
            if kind == "kill" and i in moved:
                continue
            # (A drain that cuts a call off may have ended it already.)
            await _until(
                lambda b=bus, a=asks[i]: bool(b.pending_approvals) or b.closed or a.done(),
                "approval after resume",
            )
            for approval in bus.pending_approvals:
                with contextlib.suppress(toolbus.ToolbusClientError):
                    await approval.decide(m.Decision.ALLOW)
        (folder / "go").touch()
        ask_out = await asyncio.gather(*asks, return_exceptions=True)
        outcomes = await asyncio.gather(
            *(h.result(timeout=WAIT) for h in handles), return_exceptions=True
        )
        for bus in buses:
            if not bus.closed:  # a round trip: every event before it has arrived
                await bus.jobs(timeout=WAIT)
        not_resumed = sum(1 for i in moved if not (buses[i].welcome and buses[i].welcome.resumed))
        # Client-visible failures: a client that ended (a terminal close), or a call or
        # job whose outcome never came (these sessions' events are not counted as lost).
        failed = {
            i: f"{'moved' if i in moved else 'stayed'}: {x!r}"
            for i, x in enumerate(outcomes)
            if isinstance(x, BaseException) or buses[i].closed
        }
        failed.update(
            {
                i: f"{'moved' if i in moved else 'stayed'} (ask): {a!r}"
                for i, a in enumerate(ask_out)
                if isinstance(a, BaseException)
                and not isinstance(a, toolbus.CallFailed)
                and i not in failed
            }
        )
    if kind == "drain":
        async with asyncio.timeout(WAIT):
            await victim.proc.wait()
    lost = sum(s.gaps() for s in seen)
    for i, s in enumerate(seen):
        if i not in failed:
            lost += (len(s.resolved[f"s{i}-ask"]) == 0) + (s.calls[f"s{i}-ask"] == 0)
            lost += s.jobs[handles[i].job_id] == 0
    states: dict[str, int] = {}
    for o in outcomes:
        if isinstance(o, BaseException):
            key = type(o).__name__
        else:
            key = f"{o.state}:{o.error.code}" if o.error else str(o.state)
        states[key] = states.get(key, 0) + 1
    asked: dict[str, int] = {}
    for a in ask_out:
        key = f"failed:{a.code}" if isinstance(a, toolbus.CallFailed) else type(a).__name__
        asked[key] = asked.get(key, 0) + 1
    times = sorted(resumed_at.values())
    return {
        "kind": kind,
        "sessions": sessions,
        "moved": len(moved),
        "all_resumed_s": times[-1] if times else float("nan"),
        "client_p50_s": c.percentile(times, 50),
        "first_s": times[0] if times else float("nan"),
        "settled_s": settled_at,
        "on_live_node": elsewhere,
        "not_resumed": not_resumed,
        "failures": len(failed),
        "failed": failed,
        "lost": lost,
        "duplicates": sum(s.duplicates() for s in seen),
        "duplicated": {i: _twice(s) for i, s in enumerate(seen) if s.duplicates()},
        "job_outcomes": states,
        "ask_outcomes": asked,
        "reconnects": sum(b.reconnects for b in buses),
    }


def _twice(seen: Seen) -> dict[str, Any]:
    """What one client processed twice (for the raw JSON)."""
    seqs = [q for q in set(seen.seqs) if seen.seqs.count(q) > 1]
    outcomes = {k: n for k, n in (seen.calls | seen.jobs).items() if n > 1}
    resolved = {k: [r.reason for r in v] for k, v in seen.resolved.items() if len(v) > 1}
    return {"seqs": sorted(seqs), "outcomes": outcomes, "resolved": resolved}


def p9(bench: Any) -> list[dict[str, Any]]:
    """Measure and return the P9 rows (fields of ``bench.run.Row``): ``kill -9`` against
    a drain of the same node, interleaved round by round, a fresh gateway per phase."""
    plan = bench.plan
    per: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    for r in range(plan.p9_rounds):
        for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
            folder = Path(tempfile.mkdtemp(prefix=f"p9-{kind}-", dir=bench.tmp))
            with fresh_database() as (_, url):
                out = bench.loop(_phase(kind, plan.p9_sessions, folder, url))
            per[kind].append(out)
            bench.log(
                f"  P9 round {r + 1}: {kind} {out['moved']} sessions resumed in "
                f"{out['all_resumed_s']:.3f} s (lost {out['lost']}, dup {out['duplicates']}, "
                f"failed {out['failures']}"
                + (f", settled {out['settled_s']:.3f} s)" if kind == "kill" else ")")
            )
    bench.raw["P9"] = {"rounds": per, "overrides": OVERRIDES}
    med = {
        k: {
            q: c.median([float(x[q]) for x in v])
            for q in ("all_resumed_s", "client_p50_s", "moved", "settled_s")
            if all(x[q] is not None for x in v)
        }
        for k, v in per.items()
    }
    total = {
        k: {q: sum(int(x[q]) for x in v) for q in ("lost", "duplicates", "not_resumed", "failures")}
        for k, v in per.items()
    }
    off_live = {k: sum(x["moved"] - x["on_live_node"] for x in v) for k, v in per.items()}
    kill, drain = med["kill"], med["drain"]
    ttl = OVERRIDES["nodes"]["lease_ttl"]
    interval = OVERRIDES["nodes"]["lease_interval"]

    def cell(k: str) -> str:
        m_, t = med[k], total[k]
        return (
            f"{k}: {m_['all_resumed_s']:.3f} s (client p50 {m_['client_p50_s']:.3f} s), "
            f"lost {t['lost']}, dup {t['duplicates']}, not resumed {t['not_resumed']}"
            + (f", {t['failures']} clients failed" if t["failures"] else "")
            + (f", {off_live[k]} not on a live node" if off_live[k] else "")
        )

    clean = all(not any(t.values()) for t in total.values()) and not any(off_live.values())
    return [
        {
            "id": "P9",
            "metric": f"{plan.p9_sessions} sessions (client `toolbus.connect`) via HAProxy over "
            "3 PostgreSQL nodes, each a job running + a call awaiting approval; the node "
            f"holding most (median {kill['moved']:.0f}) killed -9, or drained: seconds until "
            "its last client resumed on a live node",
            "floor": "",
            "toolbus": "; ".join(cell(k) for k in KINDS),
            "mcp": "",
            "ratio": f"kill -9 {kill['all_resumed_s'] / drain['all_resumed_s']:.2f}x drain; "
            f"{kill['all_resumed_s'] / ttl:.3f}x lease_ttl ({ttl:g} s)",
            "target": "0 lost, 0 duplicates, 0 failed",
            "passed": clean,
            "values": {"median": med, "totals": total, "rounds": plan.p9_rounds},
        },
        {
            "id": "P9s",
            "metric": "same kill -9: seconds until every pending approval of the dead node's "
            "calls resolved `disconnected` (a live node claimed it)",
            "floor": "",
            "toolbus": f"{kill['settled_s']:.3f} s",
            "mcp": "",
            "ratio": f"{kill['settled_s'] / interval:.2f}x lease_interval ({interval:g} s)",
            "target": "(info)",
            "passed": None,
            "values": {"settled_s": kill["settled_s"]},
        },
    ]
