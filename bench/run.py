"""Run the toolbus benchmarks: ``python -m bench.run [--quick] [--uvloop] [--out FILE]``.

Starts every server it needs on 127.0.0.1, each in its own process
(:mod:`bench.servers`): the raw ``websockets`` echo floor, toolbus (real
:class:`~gateway.server.Gateway`), the MCP SDK over Streamable HTTP, and python-socketio on
aiohttp (P11/P12 drive each system through its own client, :mod:`bench.peers`). Runs each
workload against each system in the same run, interleaved round by round, then prints a
table of medians over rounds, ratios, targets and pass/miss, and writes a JSON file.
Pass/miss is reported, not enforced: the exit status is non-zero only when something
crashed. See docs/bench.md for what each row measures.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing as mp
import os
import platform
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import clients as c
from bench import failover, mcp_mount, nodes, peers
from bench.servers import raise_fd_limit

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Plan:
    """Sizes of one run. ``FULL`` is the issue's; ``QUICK`` is the CI smoke run."""

    p1_calls: int = 10_000
    p1_rounds: int = 5
    p1_mcp_calls: int = 1_000
    p2_sessions: int = 50
    p2_duration: float = 2.0
    p2_rounds: int = 5
    p4_sessions: int = 10_000
    p4_rounds: int = 1
    p5_sessions: int = 10
    p5_per_session: int = 100
    p5_rounds: int = 5
    p5_lead: float = 1.0
    p6_invokes: int = 5_000
    p6_rounds: int = 3
    p7_calls: int = 2_000
    p7_rounds: int = 5
    p11_calls: int = 2_000
    p11_mcp_calls: int = 300
    p11_rounds: int = 5
    p11_warmup: int = 50
    p12_sessions: int = 50
    p12_duration: float = 2.0
    p12_rounds: int = 5
    p8_sessions: int = 50
    p8_duration: float = 2.0
    p8_rounds: int = 5
    p8_idle_sessions: int = 1_000
    p8_idle_seconds: float = 3.0
    p10_sessions: int = 10
    p10_per_session: int = 20
    p10_rounds: int = 5
    p10_lead: float = 1.0
    p10_lone: int = 4
    p10_lone_lead: float = 0.3
    p9_sessions: int = 30
    p9_rounds: int = 5


FULL = Plan()
QUICK = Plan(
    p1_calls=500,
    p1_rounds=5,
    p1_mcp_calls=100,
    p2_duration=0.5,
    p2_rounds=2,
    p4_sessions=500,
    p5_sessions=10,
    p5_per_session=20,
    p5_rounds=2,
    p5_lead=0.4,
    p6_invokes=500,
    p6_rounds=2,
    p7_calls=200,
    p7_rounds=3,
    p11_calls=100,
    p11_mcp_calls=20,
    p11_rounds=2,
    p11_warmup=10,
    p12_sessions=10,
    p12_duration=0.3,
    p12_rounds=1,
    p8_sessions=10,
    p8_duration=0.5,
    p8_rounds=1,
    p8_idle_sessions=100,
    p8_idle_seconds=1.0,
    p10_sessions=4,
    p10_per_session=5,
    p10_rounds=2,
    p10_lead=0.5,
    p10_lone=1,
    p9_sessions=9,
    p9_rounds=1,
)


# -- servers -----------------------------------------------------------------------------


@dataclass
class Server:
    kind: str
    proc: subprocess.Popen[bytes]
    port: int
    pid: int

    @property
    def url(self) -> str:
        return c.client_url(self.kind, self.port)

    def rss_bytes(self) -> int:
        """Resident set size of the server process, from /proc/PID/status."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(kind: str, uvloop: bool, tmp: Path) -> Server:
    data = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=tmp))
    cmd = [sys.executable, "-m", "bench.servers", kind, "--data", str(data)] + (
        ["--uvloop"] if uvloop else []
    )
    proc = subprocess.Popen(
        # The log file belongs to the server process for its whole life.
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=open(data / "stderr.log", "wb"),  # noqa: SIM115
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else b""
    if not line:
        proc.kill()
        raise RuntimeError(
            f"{kind} server did not start; see {data / 'stderr.log'}:\n"
            + (data / "stderr.log").read_text()[-2000:]
        )
    info = json.loads(line)
    return Server(kind, proc, info["port"], info["pid"])


@contextlib.contextmanager
def servers(kinds: list[str], uvloop: bool, tmp: Path) -> Iterator[dict[str, Server]]:
    started: dict[str, Server] = {}
    try:
        for kind in kinds:
            started[kind] = start_server(kind, uvloop, tmp)
        yield started
    finally:
        for server in started.values():
            server.stop()


# -- results -----------------------------------------------------------------------------


@dataclass
class Row:
    id: str
    metric: str
    floor: str
    toolbus: str
    mcp: str
    ratio: str
    target: str
    passed: bool | None
    values: dict[str, Any] = field(default_factory=dict)
    socketio: str = ""
    """The python-socketio peer's cell (P11, P12 only)."""


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} us"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


def per_s(rate: float) -> str:
    return f"{rate:,.0f}/s"


class Bench:
    def __init__(
        self, plan: Plan, uvloop: bool, client_procs: int, tmp: Path, log: Callable[[str], None]
    ) -> None:
        self.plan = plan
        self.uvloop = uvloop
        self.client_procs = client_procs
        self.tmp = tmp
        self.log = log
        self.rows: list[Row] = []
        self.raw: dict[str, Any] = {}
        self.p1_floor_rtt = float("nan")

    def loop(self, coro: Any) -> Any:
        return c.run_loop(coro, self.uvloop)

    # -- P1 + P7 share one set of servers ----------------------------------------------

    def p1(self) -> None:
        p = self.plan
        per_round = max(1, p.p1_calls // p.p1_rounds)
        mcp_per_round = max(1, p.p1_mcp_calls // p.p1_rounds)
        rounds: dict[str, list[float]] = {
            "floor": [],
            "toolbus": [],
            "toolbus_thread": [],
            "toolbus_idempotent": [],
            "mcp": [],
        }
        with servers(["floor", "toolbus", "mcp"], self.uvloop, self.tmp) as srv:

            async def go() -> None:
                floor = await c.FloorClient.open(srv["floor"].url)
                tb = await c.ToolbusClient.open(srv["toolbus"].url)
                peer = await c.McpClient.open(srv["mcp"].url)
                systems = [
                    ("floor", floor, "noop", per_round),
                    ("toolbus", tb, "noop", per_round),
                    ("toolbus_thread", tb, "noop_thread", per_round),
                    ("toolbus_idempotent", tb, "noop_idempotent", per_round),
                    ("mcp", peer, "noop", mcp_per_round),
                ]
                for _, client, tool, _n in systems:  # warm-up, not recorded
                    await c.sequential(client, 50, tool)
                for r in range(p.p1_rounds):
                    order = systems if r % 2 == 0 else systems[::-1]
                    for name, client, tool, n in order:
                        rounds[name].append(c.median(await c.sequential(client, n, tool)))
                await floor.close()
                await tb.close()
                await peer.close()

            self.loop(go())
        self.raw["P1"] = {"round_median_rtt_s": rounds, "calls_per_round": per_round}
        med = {k: c.median(v) for k, v in rounds.items()}
        self.p1_floor_rtt = med["floor"]
        ratio = med["toolbus"] / med["floor"]
        self.rows.append(
            Row(
                "P1",
                "sequential invoke RTT, median",
                us(med["floor"]),
                us(med["toolbus"]),
                us(med["mcp"]),
                f"{ratio:.2f}x floor",
                "<= 2x floor",
                ratio <= 2.0,
                {k: v for k, v in med.items()},
            )
        )
        for id_, kind, metric in (
            ("P1i", "toolbus_idempotent", "tool declared idempotent (no I15 check)"),
            ("P1t", "toolbus_thread", "plain-def handler (thread hop)"),
        ):
            self.rows.append(
                Row(
                    id_,
                    f"same, {metric}",
                    us(med["floor"]),
                    us(med[kind]),
                    "",
                    f"{med[kind] / med['floor']:.2f}x floor",
                    "(info)",
                    None,
                    {kind: med[kind]},
                )
            )
        ratio_m = med["mcp"] / med["toolbus"]
        self.rows.append(
            Row(
                "P1m",
                "sequential call RTT: MCP / toolbus",
                "",
                us(med["toolbus"]),
                us(med["mcp"]),
                f"{ratio_m:.1f}x faster",
                "(info)",
                None,
                {},
            )
        )

    def p7(self) -> None:
        p = self.plan
        rounds: dict[str, list[float]] = {"ungated": [], "gated": []}
        with servers(["toolbus"], self.uvloop, self.tmp) as srv:

            async def go() -> None:
                tb = await c.ToolbusClient.open(srv["toolbus"].url)
                await c.sequential(tb, 50, "noop")
                await c.sequential(tb, 50, "noop_gated")
                for r in range(p.p7_rounds):
                    order = [("ungated", "noop"), ("gated", "noop_gated")]
                    for name, tool in order if r % 2 == 0 else order[::-1]:
                        rounds[name].append(c.median(await c.sequential(tb, p.p7_calls, tool)))
                await tb.close()

            self.loop(go())
        self.raw["P7"] = {"round_median_rtt_s": rounds}
        ungated, gated = c.median(rounds["ungated"]), c.median(rounds["gated"])
        added = gated - ungated
        ratio = added / ungated
        self.rows.append(
            Row(
                "P7",
                "gated call: added cost over ungated",
                f"RTT {us(self.p1_floor_rtt)}",
                f"{us(ungated)} -> {us(gated)} (+{us(added)})",
                "",
                f"{ratio:.2f} RTT",
                "<= 1 RTT (ungated)",
                ratio <= 1.0,
                {"ungated": ungated, "gated": gated, "added": added},
            )
        )

    # -- P2 + P3 -------------------------------------------------------------------------

    def _throughput(self, kind: str, url: str) -> float:
        p = self.plan
        procs = self.client_procs
        if procs <= 1:
            result = self.loop(c.concurrent(kind, url, p.p2_sessions, p.p2_duration))
            return result["calls"] / result["elapsed"]
        ctx = mp.get_context("fork")
        barrier = ctx.Barrier(procs)
        queue = ctx.Queue()
        shares = [
            p.p2_sessions // procs + (1 if i < p.p2_sessions % procs else 0) for i in range(procs)
        ]
        workers = [
            ctx.Process(
                target=_worker, args=(queue, (kind, url, n, p.p2_duration, barrier, self.uvloop))
            )
            for n in shares
        ]
        for w in workers:
            w.start()
        results = [queue.get(timeout=120 + p.p2_duration) for _ in workers]
        for w in workers:
            w.join()
        failed = [r for r in results if "error" in r]
        if failed:
            raise RuntimeError(failed[0]["error"])
        return sum(r["calls"] / r["elapsed"] for r in results)

    def p2_p3(self) -> None:
        p = self.plan
        rounds: dict[str, list[float]] = {"floor": [], "toolbus": [], "mcp": []}
        with servers(["floor", "toolbus", "mcp"], self.uvloop, self.tmp) as srv:
            for r in range(p.p2_rounds):
                order = ["floor", "toolbus", "mcp"] if r % 2 == 0 else ["mcp", "toolbus", "floor"]
                for kind in order:
                    rounds[kind].append(self._throughput(kind, srv[kind].url))
                    self.log(f"  P2/P3 round {r + 1}: {kind} {rounds[kind][-1]:,.0f}/s")
        self.raw["P2"] = {
            "round_calls_per_s": rounds,
            "sessions": p.p2_sessions,
            "client_procs": self.client_procs,
        }
        med = {k: c.median(v) for k, v in rounds.items()}
        ratio = med["toolbus"] / med["floor"]
        self.rows.append(
            Row(
                "P2",
                f"{p.p2_sessions} sessions, sequential invokes: throughput",
                per_s(med["floor"]),
                per_s(med["toolbus"]),
                per_s(med["mcp"]),
                f"{ratio:.2f}x floor",
                ">= 0.3x floor",
                ratio >= 0.3,
                med,
            )
        )
        ratio_m = med["toolbus"] / med["mcp"]
        self.rows.append(
            Row(
                "P3",
                "same concurrency: toolbus vs MCP",
                "",
                per_s(med["toolbus"]),
                per_s(med["mcp"]),
                f"{ratio_m:.1f}x MCP",
                ">= 20x MCP",
                ratio_m >= 20,
                med,
            )
        )

    # -- P4 ------------------------------------------------------------------------------

    def p4(self) -> None:
        p = self.plan
        per: dict[str, list[float]] = {"floor": [], "toolbus": []}
        for r in range(p.p4_rounds):
            for kind in ["floor", "toolbus"] if r % 2 == 0 else ["toolbus", "floor"]:
                server = start_server(kind, self.uvloop, self.tmp)
                try:

                    async def go(server: Server = server, kind: str = kind) -> float:
                        import asyncio

                        await asyncio.sleep(0.3)
                        before = server.rss_bytes()
                        sockets = await c.open_idle(kind, server.url, p.p4_sessions)
                        await asyncio.sleep(1.0)
                        after = server.rss_bytes()
                        server.stop(kill=True)
                        c.abort_all(sockets)
                        return (after - before) / p.p4_sessions

                    per[kind].append(self.loop(go()))
                    gc.collect()
                finally:
                    server.stop(kill=True)
                self.log(
                    f"  P4 round {r + 1}: {kind} {per[kind][-1] / 1024:,.1f} KB per connection"
                )
        self.raw["P4"] = {"round_bytes_per_connection": per, "sessions": p.p4_sessions}
        med = {k: c.median(v) for k, v in per.items()}
        ratio = med["toolbus"] / med["floor"]
        self.rows.append(
            Row(
                "P4",
                f"{p.p4_sessions:,} idle sessions: server memory each",
                f"{med['floor'] / 1024:,.1f} KB",
                f"{med['toolbus'] / 1024:,.1f} KB",
                "",
                f"{ratio:.2f}x floor",
                "<= 2x floor",
                ratio <= 2.0,
                med,
            )
        )

    # -- P5 ------------------------------------------------------------------------------

    def p5(self) -> None:
        p = self.plan
        stats: dict[str, dict[str, list[float]]] = {
            k: {"p50": [], "p99": [], "max": []} for k in ("floor", "toolbus")
        }
        late_total = 0
        with servers(["floor", "toolbus"], self.uvloop, self.tmp) as srv:

            async def go() -> None:
                nonlocal late_total
                import asyncio

                sessions = {
                    "floor": [
                        await c.FloorClient.open(srv["floor"].url) for _ in range(p.p5_sessions)
                    ],
                    "toolbus": [
                        await c.ToolbusClient.open(srv["toolbus"].url) for _ in range(p.p5_sessions)
                    ],
                }
                for r in range(p.p5_rounds):
                    for kind in ["floor", "toolbus"] if r % 2 == 0 else ["toolbus", "floor"]:
                        out = await c.job_pushes(kind, sessions[kind], p.p5_per_session, p.p5_lead)
                        lat = out["latencies"]
                        late_total += out["late"]
                        stats[kind]["p50"].append(c.percentile(lat, 50))
                        stats[kind]["p99"].append(c.percentile(lat, 99))
                        stats[kind]["max"].append(max(lat))
                        await asyncio.sleep(0.1)
                for group in sessions.values():
                    for client in group:
                        await client.close()

            self.loop(go())
        jobs = p.p5_sessions * p.p5_per_session
        self.raw["P5"] = {"round_latency_s": stats, "jobs": jobs, "late_dispatches": late_total}
        med = {k: {q: c.median(v) for q, v in s.items()} for k, s in stats.items()}
        tb, fl = med["toolbus"], med["floor"]
        note = "" if not late_total else f" ({late_total} dispatches late!)"
        self.rows.append(
            Row(
                "P5",
                f"{jobs:,} jobs ending together: push latency p50 / p99",
                f"{ms(fl['p50'])} / {ms(fl['p99'])}",
                f"{ms(tb['p50'])} / {ms(tb['p99'])}",
                "",
                f"p99 {tb['p99'] / fl['p99']:.1f}x floor{note}",
                "p99 <= 10 ms",
                tb["p99"] <= 0.010 and not late_total,
                med,
            )
        )

    # -- P6 ------------------------------------------------------------------------------

    def p6(self) -> None:
        p = self.plan
        rounds: dict[str, list[float]] = {"floor": [], "toolbus": []}
        events = 0
        with servers(["floor", "toolbus"], self.uvloop, self.tmp) as srv:

            async def go() -> None:
                nonlocal events
                for _ in range(p.p6_rounds):
                    client, last = await c.make_backlog(srv["toolbus"].url, p.p6_invokes)
                    await client.close()
                    # The client saw the catalog (seq 1) before it lost every later event.
                    out = await c.resume_replay(srv["toolbus"].url, client.welcome, 1, last)
                    events = int(out["events"])
                    if events != last - 1:
                        raise RuntimeError(f"replayed {events} events, expected {last - 1}")
                    rounds["toolbus"].append(out["seconds"])
                    rounds["floor"].append(await c.floor_replay(srv["floor"].url, events))

            self.loop(go())
        self.raw["P6"] = {"round_seconds": rounds, "events": events}
        med = {k: c.median(v) for k, v in rounds.items()}
        ratio = med["toolbus"] / med["floor"]
        self.rows.append(
            Row(
                "P6",
                f"resume: replay of {events:,} missed events",
                ms(med["floor"]),
                ms(med["toolbus"]),
                "",
                f"{ratio:.1f}x floor",
                "<= 0.5 s",
                med["toolbus"] <= 0.5,
                med,
            )
        )


def _worker(queue: Any, args: tuple[Any, ...]) -> None:
    try:
        queue.put(c.concurrent_worker(args))  # type: ignore[arg-type]
    except BaseException as exc:  # reported to the parent, which raises
        queue.put({"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"})


# -- output ------------------------------------------------------------------------------

HEADERS = ["id", "workload", "floor", "toolbus", "socket.io", "MCP", "ratio", "target", "result"]


def table(rows: list[Row]) -> str:
    def result(row: Row) -> str:
        return "" if row.passed is None else ("pass" if row.passed else "MISS")

    cells = [HEADERS] + [
        [r.id, r.metric, r.floor, r.toolbus, r.socketio, r.mcp, r.ratio, r.target, result(r)]
        for r in rows
    ]
    lines = ["| " + " | ".join(row) + " |" for row in cells]
    lines.insert(1, "| " + " | ".join("---" for _ in HEADERS) + " |")
    return "\n".join(lines)


def git_commit() -> str:
    """HEAD of the measured tree (``TOOLBUS_BENCH_COMMIT`` when run from an exported snapshot)."""
    if os.environ.get("TOOLBUS_BENCH_COMMIT"):
        return os.environ["TOOLBUS_BENCH_COMMIT"]
    with contextlib.suppress(Exception):
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    return "unknown"


WORKLOADS = ["P1", "P2", "P4", "P5", "P6", "P7", "P11", "M3", "P8", "P9", "P10", "P5P"]
FULL_ONLY = {"P8", "P9", "P10", "P5P"}
"""Workloads ``--quick`` leaves out unless ``--only`` names them: each starts servers on
fresh PostgreSQL databases (P9: three nodes and HAProxy per phase), which costs more
than the ~10 s a quick run may add."""


DEV_EXTRAS = ("python-socketio", "aiohttp")
"""Distributions of the dev extras the benchmarks import (the socket.io peer, P11/P12)
and whose versions the JSON records."""


def missing_extras() -> list[str]:
    """The :data:`DEV_EXTRAS` not installed, in order (empty when all are)."""
    from importlib.metadata import PackageNotFoundError, version

    missing = []
    for name in DEV_EXTRAS:
        try:
            version(name)
        except PackageNotFoundError:
            missing.append(name)
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="toolbus benchmarks (docs/bench.md)")
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: a smoke run of seconds (CI)"
    )
    parser.add_argument(
        "--uvloop", action="store_true", help="uvloop in every server and client process"
    )
    parser.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="client processes for P2/P3 (default 1; see docs/bench.md)",
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated workloads, e.g. P1,P6 (P2 includes P3, P11 includes P12); "
        "with --quick, the full-only ones (P8, P9, P10, P5p) run only when named here",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "latest.json")
    args = parser.parse_args(argv)
    missing = missing_extras()
    if missing:
        print(
            f"bench: {', '.join(missing)} not installed: the benchmarks need the dev extras; "
            'from the clone run pip install -e ".[dev]" (scripts/check installs them)',
            file=sys.stderr,
        )
        return 2
    only = [w.strip().upper() for w in args.only.split(",") if w.strip()] or [
        w for w in WORKLOADS if not (args.quick and w in FULL_ONLY)
    ]
    plan = QUICK if args.quick else FULL
    raise_fd_limit()
    t0 = time.perf_counter()

    def log(text: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {text}", flush=True)

    status = 0
    with tempfile.TemporaryDirectory(prefix="toolbus-bench-") as tmp:
        bench = Bench(plan, args.uvloop, args.client_procs, Path(tmp), log)
        steps = {
            "P1": bench.p1,
            "P2": bench.p2_p3,
            "P4": bench.p4,
            "P5": bench.p5,
            "P6": bench.p6,
            "P7": bench.p7,
            "P11": lambda: bench.rows.extend(Row(**r) for r in peers.p11_p12(bench, servers)),
            "M3": lambda: bench.rows.append(Row(**mcp_mount.row(bench, servers))),
            "P8": lambda: bench.rows.extend(Row(**r) for r in nodes.p8(bench)),
            "P9": lambda: bench.rows.extend(Row(**r) for r in failover.p9(bench)),
            "P10": lambda: bench.rows.extend(Row(**r) for r in nodes.p10(bench)),
            "P5P": lambda: bench.rows.extend(Row(**r) for r in nodes.p5p(bench)),
        }
        for name in WORKLOADS:
            if name not in only:
                continue
            log(f"{name} ...")
            try:
                steps[name]()
            except Exception:
                traceback.print_exc()
                status = 1
                bench.rows.append(Row(name, "crashed", "", "", "", "", "", False))
    elapsed = time.perf_counter() - t0
    text = table(bench.rows)
    loop_name = "uvloop" if args.uvloop else "asyncio"
    print(
        f"\ntoolbus bench ({'quick' if args.quick else 'full'}, {loop_name}, "
        f"{os.cpu_count()} CPUs, invoke frame {c.message_size()} B, {elapsed:.0f} s)\n"
    )
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from importlib.metadata import version

    import mcp  # noqa: F401  (version below)
    import websockets

    report = {
        "meta": {
            "mode": "quick" if args.quick else "full",
            "loop": loop_name,
            "client_procs": args.client_procs,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "websockets": websockets.__version__,
            "mcp": version("mcp"),
            "python-socketio": version("python-socketio"),
            "aiohttp": version("aiohttp"),
            "commit": git_commit(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": round(elapsed, 1),
            "invoke_frame_bytes": c.message_size(),
            "plan": vars(plan),
        },
        "rows": [{k: v for k, v in vars(r).items()} for r in bench.rows],
        "table": text,
        "raw": bench.raw,
    }
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"\nwrote {args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
