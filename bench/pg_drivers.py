"""Choose the PostgreSQL driver by measurement (SPEC N1): ``python -m bench.pg_drivers``.

Measures, against one PostgreSQL server (``TOOLBUS_BENCH_PG_URL``, default the test
database on 127.0.0.1), the two paths a shared store lives on:

- **commit**: one transaction of what one event-loop tick stages, the shape
  :meth:`gateway.store_pg.PgStore.commit` writes: N events (insert) plus N call rows
  (upsert), N = 1 (one call) and N = 50 (50 busy sessions). Reported: wall time per
  commit (p50, p99) and the CPU time the calling thread spends per commit, which is
  what an async driver costs the event loop (the rest of the wall time it is free).
- **notify**: ``NOTIFY`` on one connection to the moment a ``LISTEN``ing connection's
  code has it (p50, p99): the cross-node wake-up path.

Drivers: psycopg 3 synchronous in pipeline mode with ``executemany`` (what ``PgStore``
uses) and with one ``unnest`` statement per table instead, psycopg 3 async, and
asyncpg. Rounds alternate drivers so drift hits each alike. Prints a table; with
``--out FILE`` also writes JSON. ``--quick`` runs a few hundred commits (seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import psycopg

URL = os.environ.get("TOOLBUS_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
TABLES = """
CREATE TABLE events (session_id TEXT, seq BIGINT, body BYTEA, PRIMARY KEY (session_id, seq));
CREATE TABLE calls (id BIGSERIAL, session_id TEXT, call_id BYTEA, state TEXT, body BYTEA,
                    PRIMARY KEY (session_id, call_id));
"""
EV = "INSERT INTO events (session_id, seq, body) VALUES (%s,%s,%s)"
CALL = (
    "INSERT INTO calls (session_id, call_id, state, body) VALUES (%s,%s,%s,%s) "
    "ON CONFLICT (session_id, call_id) DO UPDATE SET state=EXCLUDED.state, body=EXCLUDED.body"
)
BODY = b'{"type":"result","seq":1,"call_id":"c1","result":{"value":100.0}}' + b" " * 200


def _dollar(sql: str) -> str:
    """psycopg's ``%s`` placeholders as asyncpg's ``$n``."""
    parts = sql.split("%s")
    return "".join(p + (f"${i + 1}" if i < len(parts) - 1 else "") for i, p in enumerate(parts))


class Batch:
    """The rows of one commit: ``n`` sessions, one event and one call row each."""

    def __init__(self) -> None:
        self.seq = 0

    def rows(self, n: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        self.seq += 1
        events = [(f"s{i}", self.seq, BODY) for i in range(n)]
        calls = [(f"s{i}", b"c%d" % self.seq, "done", BODY) for i in range(n)]
        return events, calls


Rows = list[tuple[Any, ...]]


def _psycopg_timed(
    url: str, n: int, count: int, write: Callable[[psycopg.Cursor[Any], Rows, Rows], None]
) -> tuple[list[float], list[float]]:
    """``count`` commits of ``n`` sessions' rows, each written by ``write`` inside one
    pipelined transaction; the wall and thread-CPU seconds of each commit."""
    batch = Batch()
    walls, cpus = [], []
    with psycopg.connect(url, autocommit=True) as db:
        for _ in range(count):
            events, calls = batch.rows(n)
            w, c = time.perf_counter(), time.thread_time()
            with db.pipeline(), db.transaction(), db.cursor() as cur:
                write(cur, events, calls)
            cpus.append(time.thread_time() - c)
            walls.append(time.perf_counter() - w)
    return walls, cpus


def _write_many(cur: psycopg.Cursor[Any], events: Rows, calls: Rows) -> None:
    cur.executemany(EV, events)
    cur.executemany(CALL, calls)


def psycopg_sync(url: str, n: int, count: int) -> tuple[list[float], list[float]]:
    return _psycopg_timed(url, n, count, _write_many)


EV_UNNEST = (
    "INSERT INTO events (session_id, seq, body) "
    "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bytea[])"
)
CALL_UNNEST = (
    "INSERT INTO calls (session_id, call_id, state, body) "
    "SELECT * FROM unnest(%s::text[], %s::bytea[], %s::text[], %s::bytea[]) "
    "ON CONFLICT (session_id, call_id) DO UPDATE SET state=EXCLUDED.state, body=EXCLUDED.body"
)


def _columns(rows: list[tuple[Any, ...]]) -> tuple[list[Any], ...]:
    return tuple(list(col) for col in zip(*rows, strict=True))


def _write_unnest(cur: psycopg.Cursor[Any], events: Rows, calls: Rows) -> None:
    cur.execute(EV_UNNEST, _columns(events))
    cur.execute(CALL_UNNEST, _columns(calls))


def psycopg_unnest(url: str, n: int, count: int) -> tuple[list[float], list[float]]:
    """One statement per table whatever the batch size: the rows travel as arrays."""
    return _psycopg_timed(url, n, count, _write_unnest)


async def psycopg_async(url: str, n: int, count: int) -> tuple[list[float], list[float]]:
    batch = Batch()
    walls, cpus = [], []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as db:
        for _ in range(count):
            events, calls = batch.rows(n)
            w, c = time.perf_counter(), time.thread_time()
            async with db.pipeline(), db.transaction(), db.cursor() as cur:
                await cur.executemany(EV, events)
                await cur.executemany(CALL, calls)
            cpus.append(time.thread_time() - c)
            walls.append(time.perf_counter() - w)
    return walls, cpus


async def asyncpg_commit(url: str, n: int, count: int) -> tuple[list[float], list[float]]:
    batch = Batch()
    walls, cpus = [], []
    ev, call = _dollar(EV), _dollar(CALL)
    settings = {"search_path": _schema(url)}
    if "synchronous_commit%3D" in url:
        settings["synchronous_commit"] = url.rsplit("synchronous_commit%3D", 1)[1]
    db = await asyncpg.connect(url.split("?", 1)[0], server_settings=settings)
    try:
        for _ in range(count):
            events, calls = batch.rows(n)
            w, c = time.perf_counter(), time.thread_time()
            async with db.transaction():
                await db.executemany(ev, events)
                await db.executemany(call, calls)
            cpus.append(time.thread_time() - c)
            walls.append(time.perf_counter() - w)
    finally:
        await db.close()
    return walls, cpus


async def psycopg_notify(url: str, count: int) -> list[float]:
    lat: list[float] = []
    async with (
        await psycopg.AsyncConnection.connect(url, autocommit=True) as listener,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as sender,
    ):
        await listener.execute("LISTEN bench")
        got: asyncio.Queue[str] = asyncio.Queue()

        async def consume() -> None:
            async for note in listener.notifies():
                got.put_nowait(note.payload)

        # A notification is only read while notifies() is being iterated: keep one
        # consumer running, and send until the first arrives so it surely listens.
        consumer = asyncio.create_task(consume())
        while got.empty():
            await sender.execute("SELECT pg_notify('bench', 'prime')")
            await asyncio.sleep(0.01)
        while not got.empty():
            got.get_nowait()
        for _ in range(count):
            start = time.perf_counter()
            await sender.execute("SELECT pg_notify('bench', 'x')")
            while await got.get() != "x":  # a late priming notification
                pass
            lat.append(time.perf_counter() - start)
        consumer.cancel()
    return lat


async def asyncpg_notify(url: str, count: int) -> list[float]:
    lat: list[float] = []
    got: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(url)
    sender = await asyncpg.connect(url)
    try:
        await listener.add_listener("bench", lambda *args: got.put_nowait(args[3]))
        for _ in range(count):
            start = time.perf_counter()
            await sender.execute("SELECT pg_notify('bench', 'x')")
            await got.get()
            lat.append(time.perf_counter() - start)
    finally:
        await listener.close()
        await sender.close()
    return lat


def _schema(url: str) -> str:
    return url.rsplit("search_path%3D", 1)[1].split("%20", 1)[0]


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out")
    parser.add_argument(
        "--synchronous-commit",
        choices=("on", "off"),
        help="the sessions' synchronous_commit (default: the server's, normally on)",
    )
    args = parser.parse_args()
    count = 100 if args.quick else 1000
    rounds = 1 if args.quick else args.rounds
    schema = "bench_" + uuid.uuid4().hex[:12]
    url = f"{URL}{'&' if '?' in URL else '?'}options=-csearch_path%3D{schema}"
    if args.synchronous_commit:
        url += f"%20-csynchronous_commit%3D{args.synchronous_commit}"
    with psycopg.connect(URL, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}".encode())
    try:
        results = asyncio.run(_run(url, count, rounds))
    finally:
        with psycopg.connect(URL, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE".encode())
    print(f"{'path':34} {'wall p50':>9} {'wall p99':>9} {'cpu p50':>9}  (ms)")
    for name, row in results.items():
        cpu = f"{row['cpu']['p50_ms']:9.3f}" if "cpu" in row else " " * 9
        print(f"{name:34} {row['wall']['p50_ms']:9.3f} {row['wall']['p99_ms']:9.3f} {cpu}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


async def _run(url: str, count: int, rounds: int) -> dict[str, dict[str, dict[str, float]]]:
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(TABLES.encode())
    walls: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    commits: dict[str, Callable[[int], Awaitable[tuple[list[float], list[float]]]]] = {
        "psycopg sync (pipeline)": lambda n: asyncio.to_thread(psycopg_sync, url, n, count),
        "psycopg sync (unnest)": lambda n: asyncio.to_thread(psycopg_unnest, url, n, count),
        "psycopg async (pipeline)": lambda n: psycopg_async(url, n, count),
        "asyncpg": lambda n: asyncpg_commit(url, n, count),
    }
    for _ in range(rounds):
        for n in (1, 50):
            for name, run in commits.items():
                with psycopg.connect(url, autocommit=True) as db:
                    db.execute("TRUNCATE events, calls")
                w, c = await run(n)
                walls.setdefault(f"commit n={n}: {name}", []).extend(w)
                cpus.setdefault(f"commit n={n}: {name}", []).extend(c)
        for name, notify in (("psycopg async", psycopg_notify), ("asyncpg", asyncpg_notify)):
            walls.setdefault(f"notify: {name}", []).extend(await notify(url, count))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, values in walls.items():
        out[name] = {"wall": _ms(values)}
        if name in cpus:
            out[name]["cpu"] = _ms(cpus[name])
    return out


if __name__ == "__main__":
    main()
