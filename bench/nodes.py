"""P8, P10 and P5p: toolbus on PostgreSQL, one node and several (issue 10, SPEC N1-N6).

- **P8**: the P2 workload (50 sessions of the raw bench client, each calling ``noop``
  sequentially) against three gateways, interleaved round by round: one node on the
  SQLite store (``bench.servers toolbus``), one node on PostgreSQL (the same, with
  ``TOOLBUS_STORE__URL``), and ``toolbus serve --workers 2`` on PostgreSQL (the real
  supervisor, two worker processes on one port). For each round it reads the CPU time of
  the server processes (``/proc/PID/stat``; for ``--workers`` the parent and its
  children) and of the PostgreSQL backends serving that gateway's database. One more
  window per PostgreSQL gateway, between two settled readings of the database's
  transactions (``pg_stat_database.xact_commit``) and the rows inserted, updated and
  deleted in its tables (``pg_stat_user_tables``), gives the store load per call.
- **P8s**: the store load of idle sessions: N sessions open and acknowledge their
  catalog on the one-node PostgreSQL gateway, then stay idle; transactions and rows per
  session opened, and per second while idle.
- **P10**: push latency of a job that ends on node A to a client held by node B, against
  the same job's push when the client stays on A. Each round opens sessions on A, sends
  ``finish_at`` jobs (all told to finish together, as P5), waits for every
  ``dispatched``; the cross-node sessions then resume on B (B takes the session over,
  SPEC N2) before the finish time, so A's ``job.done`` travels by the inbox (commit on
  A, ``NOTIFY``, inbox read and commit on B, send; SPEC N3). **P10a**: the same with
  one session and one job at a time.
- **P5p**: P5's workload (``finish_at`` jobs of 10 sessions, all ending at one wall
  time) against one node on SQLite and one on PostgreSQL, interleaved round by round:
  what the store costs a burst of job ends (on PostgreSQL the flush is a commit, and the
  outbox does not flush a burst early there).

Every PostgreSQL gateway gets a fresh database of its own (``CREATE DATABASE ...
TEMPLATE template0``), dropped afterwards: ``pg_stat_database`` counts per database, and
other work shares the test database. ``TOOLBUS_BENCH_PG_URL`` names the server
(default the test database on 127.0.0.1:5432). Step functions return row dictionaries;
:mod:`bench.run` turns them into rows. Full run only (``bench.run.FULL_ONLY``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import psycopg
import yaml

from bench import clients as c
from bench.servers import toolbus_config

ROOT = Path(__file__).resolve().parents[1]
PG_URL = os.environ.get("TOOLBUS_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
TICKS = os.sysconf("SC_CLK_TCK")
STATS = ("xact_commit", "tup_inserted", "tup_updated", "tup_deleted")
SETTLE = 11.0
"""Seconds to wait before reading ``pg_stat_database``: a PostgreSQL 15 backend publishes
its counters at most once a second, and one that published less than a second before it
went idle does so again only after 10 s idle."""


# -- databases ---------------------------------------------------------------------------


def _admin() -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(PG_URL, autocommit=True, connect_timeout=10)


@contextlib.contextmanager
def fresh_database() -> Iterator[tuple[str, str]]:
    """A new, empty database; yields (its name, a store URL for it); dropped afterwards."""
    name = "tb_bench_" + uuid.uuid4().hex[:12]
    with _admin() as db:
        db.execute(f"CREATE DATABASE {name} TEMPLATE template0")
    try:
        yield name, db_url(name)
    finally:
        with _admin() as db:
            db.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def db_url(name: str) -> str:
    """:data:`PG_URL` naming database ``name``."""
    return urlunsplit(urlsplit(PG_URL)._replace(path="/" + name))


def db_counters(name: str) -> dict[str, int]:
    """Store load counters of database ``name``, read after :data:`SETTLE`: transactions
    from ``pg_stat_database`` (every transaction: read-only ones, autovacuum's and this
    reading's own count too), rows written to toolbus's tables from
    ``pg_stat_user_tables`` (so autovacuum's catalog writes do not count)."""
    time.sleep(SETTLE)
    with psycopg.connect(db_url(name), autocommit=True, connect_timeout=10) as db:
        row = db.execute(
            "SELECT d.xact_commit, sum(t.n_tup_ins), sum(t.n_tup_upd), sum(t.n_tup_del) "
            "FROM pg_stat_database d, pg_stat_user_tables t "
            "WHERE d.datname = current_database() GROUP BY d.xact_commit"
        ).fetchone()
    assert row is not None
    return dict(zip(STATS, (int(v) for v in row), strict=True))


def backend_pids(name: str) -> list[int]:
    """PIDs of the PostgreSQL backends connected to database ``name``."""
    with _admin() as db:
        rows = db.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (name,)).fetchall()
    return [int(r[0]) for r in rows]


# -- processes ---------------------------------------------------------------------------


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of ``pids`` (``/proc/PID/stat``); gone processes count 0."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / TICKS


def children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


@dataclass
class Gateway:
    """One gateway under test: its process, port, and the database it stores in."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    database: str | None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    def pids(self) -> list[int]:
        return [self.proc.pid, *children(self.proc.pid)]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _launch(
    name: str, cmd: list[str], env: dict[str, str], data: Path, database: str | None
) -> Gateway:
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=open(data / "stderr.log", "wb"),  # noqa: SIM115  (the process's for its life)
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 90)
    line = proc.stdout.readline().decode() if ready else ""
    port = None
    if line.startswith("{"):
        port = int(json.loads(line)["port"])
    elif found := re.search(r"ws://[^:]+:(\d+)/", line):
        port = int(found.group(1))
    if port is None:
        proc.kill()
        raise RuntimeError(
            f"{name} did not start ({line!r}); {data / 'stderr.log'}:\n"
            + (data / "stderr.log").read_text()[-2000:]
        )
    return Gateway(name, proc, port, database)


def start_node(name: str, tmp: Path, store_url: str | None, database: str | None) -> Gateway:
    """``bench.servers toolbus``: one node, SQLite unless ``store_url``."""
    data = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=tmp))
    env = dict(os.environ)
    env.pop("TOOLBUS_STORE__URL", None)
    if store_url:
        env["TOOLBUS_STORE__URL"] = store_url
    cmd = [sys.executable, "-m", "bench.servers", "toolbus", "--data", str(data)]
    return _launch(name, cmd, env, data, database)


def sqlite_and_pg(
    stack: contextlib.ExitStack, tmp: Path, prefix: str, store_url: str, database: str
) -> dict[str, Gateway]:
    """One node on SQLite and one on the PostgreSQL ``database`` at ``store_url``, named
    ``{prefix}sqlite`` and ``{prefix}pg``, each stopped when ``stack`` closes."""
    gateways = {
        "sqlite": start_node(f"{prefix}sqlite", tmp, None, None),
        "pg": start_node(f"{prefix}pg", tmp, store_url, database),
    }
    for gateway in gateways.values():
        stack.callback(gateway.stop)
    return gateways


def start_workers(name: str, tmp: Path, store_url: str, database: str, n: int) -> Gateway:
    """``toolbus serve --workers n`` with the bench gateway's configuration."""
    data = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=tmp))
    config = toolbus_config(data)
    config["log"] = {"level": "WARNING"}
    config["store"] = {"url": store_url}
    path = data / "toolbus.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(config, default=str))))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLBUS_")}
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)]
    cmd += ["--port", "0", "--workers", str(n)]
    gateway = _launch(name, cmd, env, data, database)
    deadline = time.monotonic() + 60
    while len(children(gateway.proc.pid)) < n:  # the banner comes once all listen
        if time.monotonic() > deadline:
            gateway.stop()
            raise RuntimeError(f"{name}: fewer than {n} workers")
        time.sleep(0.05)
    return gateway


# -- P8 ----------------------------------------------------------------------------------


SYSTEMS = ("sqlite", "pg", "pg_workers")


def p8(bench: Any) -> list[dict[str, Any]]:
    """Measure and return the P8 and P8s rows (fields of ``bench.run.Row``)."""
    plan = bench.plan
    per: dict[str, dict[str, list[float]]] = {
        k: {"rate": [], "cpu": [], "pg_cpu": [], "calls": [], "elapsed": []} for k in SYSTEMS
    }
    load: dict[str, dict[str, float]] = {}
    with contextlib.ExitStack() as stack:
        name1, url1 = stack.enter_context(fresh_database())
        name2, url2 = stack.enter_context(fresh_database())
        gws = sqlite_and_pg(stack, bench.tmp, "", url1, name1)
        gws["pg_workers"] = start_workers("pg_workers", bench.tmp, url2, name2, 2)
        stack.callback(gws["pg_workers"].stop)
        for r in range(plan.p8_rounds):
            for kind in SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]:
                g = gws[kind]
                pg_pids = backend_pids(g.database) if g.database else []
                cpu0, pg0 = cpu_seconds(g.pids()), cpu_seconds(pg_pids)
                out = bench.loop(c.concurrent("toolbus", g.url, plan.p8_sessions, plan.p8_duration))
                cpu1, pg1 = cpu_seconds(g.pids()), cpu_seconds(pg_pids)
                calls = out["calls"]
                per[kind]["rate"].append(calls / out["elapsed"])
                per[kind]["cpu"].append(cpu1 - cpu0)
                per[kind]["pg_cpu"].append(pg1 - pg0)
                per[kind]["calls"].append(calls)
                per[kind]["elapsed"].append(out["elapsed"])
                bench.log(f"  P8 round {r + 1}: {kind} {calls / out['elapsed']:,.0f}/s")
        for kind in SYSTEMS[1:]:
            load[kind] = _calling_load(bench, gws[kind])
        idle = _idle_load(bench, gws["pg"])
    med = {k: {q: c.median(v) for q, v in s.items()} for k, s in per.items()}
    per_call = load
    bench.raw["P8"] = {"rounds": per, "store_per_call": load, "idle": idle}

    def cell(k: str) -> str:
        m = med[k]
        # calls per CPU-second of the server processes: throughput per core kept busy
        return f"{m['rate']:,.0f}/s, {m['calls'] / m['cpu']:,.0f}/CPU-s" if m["cpu"] else "?"

    sq, pg, pw = med["sqlite"], med["pg"], med["pg_workers"]
    rows: list[dict[str, Any]] = [
        {
            "id": "P8",
            "metric": f"{plan.p8_sessions} sessions (P2): SQLite node; PostgreSQL node; "
            "serve --workers 2 on PostgreSQL",
            "floor": "",
            "toolbus": "; ".join(cell(k) for k in SYSTEMS),
            "mcp": "",
            "ratio": f"PG {pg['rate'] / sq['rate']:.2f}x SQLite; "
            f"2 workers {pw['rate'] / pg['rate']:.2f}x PG node",
            "target": "(info)",
            "passed": None,
            "values": med,
        },
        {
            "id": "P8c",
            "metric": "same: CPU per call, server processes + PostgreSQL backends",
            "floor": "",
            "toolbus": "; ".join(
                f"{med[k]['cpu'] / med[k]['calls'] * 1e6:,.0f} + "
                f"{med[k]['pg_cpu'] / med[k]['calls'] * 1e6:,.0f} us"
                for k in SYSTEMS
            ),
            "mcp": "",
            "ratio": "server cores busy: "
            + "; ".join(f"{med[k]['cpu'] / med[k]['elapsed']:.2f}" for k in SYSTEMS),
            "target": "(info)",
            "passed": None,
            "values": med,
        },
        {
            "id": "P8s",
            "metric": "PostgreSQL store load per call (PG node; 2 workers): transactions, rows "
            "inserted/updated/deleted, and per second",
            "floor": "",
            "toolbus": "; ".join(
                f"{per_call[k]['xact_commit']:.2f} xacts, "
                f"{per_call[k]['tup_inserted']:.1f}/{per_call[k]['tup_updated']:.1f}/"
                f"{per_call[k]['tup_deleted']:.1f} rows "
                f"({per_call[k]['commits_per_s']:,.0f} xacts/s, "
                f"{per_call[k]['rows_per_s']:,.0f} rows/s at "
                f"{per_call[k]['calls_per_s']:,.0f} calls/s)"
                for k in SYSTEMS[1:]
            ),
            "mcp": "",
            "ratio": f"{idle['sessions']:,.0f} idle sessions: "
            f"{idle['open_commits_per_session']:.2f} xacts, "
            f"{idle['open_rows_per_session']:.1f} rows each to open; idle "
            f"{idle['idle_commits_per_s']:.1f} xacts/s, {idle['idle_rows_per_s']:.1f} rows/s "
            f"written (+{idle['idle_deletes_per_s']:.0f}/s deleted by purges of closed sessions)",
            "target": "(info)",
            "passed": None,
            "values": {"per_call": per_call, "idle": idle},
        },
    ]
    return rows


def _calling_load(bench: Any, g: Gateway) -> dict[str, float]:
    """One more P8 window on ``g``, between two settled ``pg_stat_database`` readings:
    transactions and rows per call, and per second of calling. The node's lease renewals
    during the settle waits (about one commit a second) are included."""
    assert g.database is not None
    before = db_counters(g.database)
    out = bench.loop(c.concurrent("toolbus", g.url, bench.plan.p8_sessions, bench.plan.p8_duration))
    after = db_counters(g.database)
    calls, elapsed = out["calls"], out["elapsed"]
    load = {s: (after[s] - before[s]) / calls for s in STATS}
    load["calls_per_s"] = calls / elapsed
    load["commits_per_s"] = (after["xact_commit"] - before["xact_commit"]) / elapsed
    load["rows_per_s"] = sum(after[s] - before[s] for s in STATS[1:]) / elapsed
    return load


def _idle_load(bench: Any, g: Gateway) -> dict[str, float]:
    """N sessions open and ack their catalog, then stay idle: store load of each phase."""
    assert g.database is not None
    n = bench.plan.p8_idle_sessions
    window = bench.plan.p8_idle_seconds

    async def go() -> dict[str, float]:
        import asyncio

        c0 = db_counters(g.database or "")
        clients: list[c.ToolbusClient] = []
        for i in range(0, n, 100):
            clients += await asyncio.gather(
                *(c.ToolbusClient.open(g.url) for _ in range(min(100, n - i)))
            )
        await asyncio.gather(*(x.ack() for x in clients))
        c1 = db_counters(g.database or "")
        t1 = time.monotonic()
        await asyncio.sleep(window)
        c2 = db_counters(g.database or "")
        idle_s = time.monotonic() - t1
        await asyncio.gather(*(x.close() for x in clients), return_exceptions=True)
        rows = ("tup_inserted", "tup_updated", "tup_deleted")
        return {
            "sessions": float(n),
            "open_commits_per_session": (c1["xact_commit"] - c0["xact_commit"]) / n,
            "open_rows_per_session": sum(c1[s] - c0[s] for s in rows) / n,
            "idle_commits_per_s": (c2["xact_commit"] - c1["xact_commit"]) / idle_s,
            "idle_rows_per_s": sum(c2[s] - c1[s] for s in rows[:2]) / idle_s,
            # the purge of sessions closed earlier (SPEC D2), not the idle sessions' load
            "idle_deletes_per_s": (c2["tup_deleted"] - c1["tup_deleted"]) / idle_s,
            "idle_seconds": idle_s,
        }

    out: dict[str, float] = bench.loop(go())
    return out


# -- P10 ---------------------------------------------------------------------------------


async def _pushes(a: str, b: str | None, sessions: int, jobs: int, lead: float) -> dict[str, Any]:
    """``sessions`` x ``jobs`` ``finish_at`` jobs started on node ``a``, all ending at one
    wall time; with ``b``, each session resumes on ``b`` before then. Push latencies (s)
    and how many sessions were not on their node before the finish time."""
    import asyncio

    at = time.time() + lead
    latencies: list[float] = []
    late = 0

    async def one() -> None:
        nonlocal late
        client = await c.ToolbusClient.open(a)
        ws = client.ws
        for _ in range(jobs):
            client.n += 1
            await ws.send(
                '{"type":"invoke","call_id":"%s-%07d","tool":"finish_at","params":{"at":%r}}'
                % (client.prefix, client.n, at)
            )
        dispatched = 0
        while dispatched < jobs:
            message = orjson.loads(await ws.recv())
            client.last_seq = message.get("seq", client.last_seq)
            if message["type"] == "dispatched":
                dispatched += 1
            elif message["type"] in ("job.failed", "call.error", "error"):
                raise RuntimeError(f"job failed: {message}")
        if b is not None:
            welcome = client.welcome
            moved = await c.ToolbusClient.open(
                b,
                session_id=welcome["session_id"],
                resume_token=welcome["resume_token"],
                last_seq=client.last_seq,
            )
            if not moved.welcome.get("resumed"):
                raise RuntimeError(f"resume on node B refused: {moved.welcome}")
            if time.time() > at:
                late += 1
            with contextlib.suppress(Exception):
                await ws.close()
            client = moved
        done = 0
        while done < jobs:
            raw = await client.ws.recv()
            now = time.time()
            message = orjson.loads(raw)
            client.last_seq = message.get("seq", client.last_seq)
            if message["type"] == "job.done":
                latencies.append(now - message["result"]["t"])
                done += 1
            elif message["type"] in ("job.failed", "call.error", "error"):
                raise RuntimeError(f"job failed: {message}")
        await client.ack()
        await client.close()

    await asyncio.gather(*(one() for _ in range(sessions)))
    return {"latencies": latencies, "late": late}


def _add_round(bench: Any, stats: dict[str, list[float]], lat: list[float], label: str) -> None:
    """Add one round's push latencies (s) to ``stats`` (p50, p99, max) and log them."""
    p50, p99 = c.percentile(lat, 50), c.percentile(lat, 99)
    stats["p50"].append(p50)
    stats["p99"].append(p99)
    stats["max"].append(max(lat))
    bench.log(f"  {label} p50 {p50 * 1e3:.2f} ms p99 {p99 * 1e3:.2f} ms")


def _pair(x: dict[str, float]) -> str:
    """``p50 / p99`` of latencies in seconds, as milliseconds."""
    return f"{x['p50'] * 1e3:,.2f} / {x['p99'] * 1e3:,.2f} ms"


def p10(bench: Any) -> list[dict[str, Any]]:
    """Measure and return the P10 rows (fields of ``bench.run.Row``): many jobs ending
    together (P10), and one job at a time (P10a), each with the client on A and on B."""
    plan = bench.plan
    stats: dict[str, dict[str, list[float]]] = {
        k: {"p50": [], "p99": [], "max": []} for k in ("same", "cross")
    }
    lone: dict[str, list[float]] = {"same": [], "cross": []}
    late_total = 0
    with contextlib.ExitStack() as stack:
        name, url = stack.enter_context(fresh_database())
        node_a = start_node("node_a", bench.tmp, url, name)
        stack.callback(node_a.stop)
        node_b = start_node("node_b", bench.tmp, url, name)
        stack.callback(node_b.stop)

        def push(kind: str, sessions: int, jobs: int, lead: float) -> list[float]:
            nonlocal late_total
            b = node_b.url if kind == "cross" else None
            out = bench.loop(_pushes(node_a.url, b, sessions, jobs, lead))
            late_total += out["late"]
            latencies: list[float] = out["latencies"]
            return latencies

        for r in range(plan.p10_rounds):
            for kind in ("same", "cross") if r % 2 == 0 else ("cross", "same"):
                lat = push(kind, plan.p10_sessions, plan.p10_per_session, plan.p10_lead)
                _add_round(bench, stats[kind], lat, f"P10 round {r + 1}: {kind}")
            for i in range(plan.p10_lone):
                for kind in ("same", "cross") if (r + i) % 2 == 0 else ("cross", "same"):
                    lone[kind] += push(kind, 1, 1, plan.p10_lone_lead)
    jobs = plan.p10_sessions * plan.p10_per_session
    bench.raw["P10"] = {
        "round_latency_s": stats,
        "lone_latency_s": lone,
        "jobs": jobs,
        "late_resumes": late_total,
    }
    med = {k: {q: c.median(v) for q, v in s.items()} for k, s in stats.items()}
    same, cross = med["same"], med["cross"]
    note = f" ({late_total} resumes late!)" if late_total else ""
    q = {k: {"p50": c.percentile(v, 50), "p99": c.percentile(v, 99)} for k, v in lone.items()}

    return [
        {
            "id": "P10",
            "metric": f"{jobs:,} jobs ending together on node A (PostgreSQL): push p50 / p99, "
            "client on A; client on B",
            "floor": "",
            "toolbus": f"{_pair(same)}; {_pair(cross)}",
            "mcp": "",
            "ratio": f"cross-node p50 {(cross['p50'] - same['p50']) * 1e3:+,.2f} ms, "
            f"p99 {cross['p99'] / same['p99']:.1f}x{note}",
            "target": "(info)",
            "passed": None,
            "values": med,
        },
        {
            "id": "P10a",
            "metric": f"one job at a time on node A ({len(lone['same'])} each): push p50 / p99, "
            "client on A; client on B",
            "floor": "",
            "toolbus": f"{_pair(q['same'])}; {_pair(q['cross'])}",
            "mcp": "",
            "ratio": f"cross-node p50 {(q['cross']['p50'] - q['same']['p50']) * 1e3:+,.2f} ms",
            "target": "(info)",
            "passed": None,
            "values": q,
        },
    ]


def p5p(bench: Any) -> list[dict[str, Any]]:
    """Measure and return the P5p row (fields of ``bench.run.Row``): P5's burst of job
    ends on a SQLite node and on a PostgreSQL node, interleaved."""
    plan = bench.plan
    stats: dict[str, dict[str, list[float]]] = {
        k: {"p50": [], "p99": [], "max": []} for k in ("sqlite", "pg")
    }
    with contextlib.ExitStack() as stack:
        name, url = stack.enter_context(fresh_database())
        gateways = sqlite_and_pg(stack, bench.tmp, "p5_", url, name)
        for r in range(plan.p5_rounds):
            for kind in ("sqlite", "pg") if r % 2 == 0 else ("pg", "sqlite"):
                sizes = (plan.p5_sessions, plan.p5_per_session, plan.p5_lead)
                out = bench.loop(_pushes(gateways[kind].url, None, *sizes))
                _add_round(bench, stats[kind], out["latencies"], f"P5p round {r + 1}: {kind}")
    jobs = plan.p5_sessions * plan.p5_per_session
    bench.raw["P5p"] = {"round_latency_s": stats, "jobs": jobs}
    med = {k: {q: c.median(v) for q, v in s.items()} for k, s in stats.items()}
    return [
        {
            "id": "P5p",
            "metric": f"{jobs:,} jobs ending together (P5): push p50 / p99, "
            "one node on SQLite; on PostgreSQL",
            "floor": "",
            "toolbus": f"{_pair(med['sqlite'])}; {_pair(med['pg'])}",
            "mcp": "",
            "ratio": f"PostgreSQL p99 {med['pg']['p99'] / med['sqlite']['p99']:.1f}x SQLite",
            "target": "(info)",
            "passed": None,
            "values": med,
        }
    ]
