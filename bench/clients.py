"""Client side of the bench: one machinery for the floor and toolbus, the SDK's for MCP.

Both WebSocket systems are driven by the same raw ``websockets`` asyncio client
(compression off, no pings, frames parsed with orjson), so their ratios compare servers,
not clients. Every function here is a coroutine run on the caller's loop (asyncio or
uvloop); :func:`concurrent_worker` is the entry of a client process for P2/P3.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import statistics
import time
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from bench.servers import PROFILE, TOKEN

PARAMS = '{"city":"Paris, Ile-de-France","days":3,"units":"metric","include":["wind","rain","uv"]}'
INVOKE = '{"type":"invoke","id":"r-%07d","call_id":"%s-%07d","tool":"%s","params":' + PARAMS + "}"
"""Call ids carry a per-client prefix of fixed length: a call id is a key of the user
across sessions (SPEC I15), and every bench session is the same user, so counters alone
would make later sessions replay earlier calls instead of running them."""


def call_prefix() -> str:
    """A fresh 8-character call id prefix for one client (SPEC I15)."""
    return secrets.token_hex(4)


MCP_ARGS = orjson.loads(PARAMS)
ACK_EVERY = 100
"""The toolbus client acknowledges after this many durable events (SPEC D2)."""


def message_size(tool: str = "noop") -> int:
    """Bytes of one invoke frame: the floor echoes frames of exactly this size."""
    return len((INVOKE % (1, call_prefix(), 1, tool)).encode())


async def ws_connect(url: str, subprotocols: list[str] | None = None) -> ClientConnection:
    return await connect(
        url,
        subprotocols=subprotocols,
        compression=None,
        ping_interval=None,  # type: ignore[arg-type]
        max_size=None,
        open_timeout=60,
        close_timeout=2,
    )


# -- floor -------------------------------------------------------------------------------


class FloorClient:
    """A raw echo round trip with an invoke-sized frame, parsed like a reply."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.n = 0
        self.prefix = call_prefix()

    @classmethod
    async def open(cls, url: str) -> FloorClient:
        return cls(await ws_connect(url))

    async def call(self, tool: str = "noop") -> None:
        self.n += 1
        await self.ws.send(INVOKE % (self.n, self.prefix, self.n, tool))
        orjson.loads(await self.ws.recv())

    async def close(self) -> None:
        await self.ws.close()


# -- toolbus -----------------------------------------------------------------------------


class ToolbusClient:
    """One toolbus session over a raw socket: ``invoke`` until the terminal ``result``.

    Its ``hello`` asks for ``tool_start`` of gated calls only (option ``tool_start:
    gated``, SPEC A6), as a client that acts on no other does; a gated ``tool_start``
    is answered ``tool.confirm allow`` at once (P7), and other events before the
    result are read and counted. Every :data:`ACK_EVERY` durable events the client
    sends a cumulative ``ack``.
    """

    def __init__(self, ws: ClientConnection, welcome: dict[str, Any], ack: bool = True) -> None:
        self.ws = ws
        self.welcome = welcome
        self.last_seq = 0
        self.acked = 0
        self.ack_enabled = ack
        self.n = 0
        self.prefix = call_prefix()

    @classmethod
    async def open(cls, url: str, ack: bool = True, **hello: Any) -> ToolbusClient:
        hello.setdefault("options", {"tool_start": "gated"})
        ws = await ws_connect(url, ["toolbus.v1"])
        await ws.send(
            orjson.dumps({"type": "hello", "token": TOKEN, "profile": PROFILE, **hello}).decode()
        )
        welcome = orjson.loads(await ws.recv())
        if welcome.get("type") != "welcome":
            raise RuntimeError(f"hello refused: {welcome}")
        client = cls(ws, welcome, ack)
        client.last_seq = welcome["last_seq"]
        if not welcome["resumed"]:
            catalog = orjson.loads(await ws.recv())  # the initial catalog (seq 1)
            client.last_seq = catalog["seq"]
        return client

    async def call(self, tool: str = "noop") -> dict[str, Any]:
        self.n += 1
        call_id = "%s-%07d" % (self.prefix, self.n)
        ws = self.ws
        await ws.send(INVOKE % (self.n, self.prefix, self.n, tool))
        while True:
            message = orjson.loads(await ws.recv())
            seq = message.get("seq")
            if seq is not None:
                self.last_seq = seq
            kind = message["type"]
            if kind == "tool_start" and "approval_id" in message:
                await ws.send(
                    '{{"type":"tool.confirm","approval_id":"{}","decision":"allow"}}'.format(
                        message["approval_id"]
                    )
                )
            elif (
                kind in ("result", "call.error", "dispatched") and message.get("call_id") == call_id
            ):
                if kind != "result":
                    raise RuntimeError(f"call failed: {message}")
                break
        if self.ack_enabled and self.last_seq - self.acked >= ACK_EVERY:
            await self.ack()
        return message

    async def ack(self) -> None:
        self.acked = self.last_seq
        await self.ws.send('{"type":"ack","seq":%d}' % self.last_seq)

    async def close(self) -> None:
        await self.ws.close()


# -- MCP ---------------------------------------------------------------------------------


class McpClient:
    """The MCP SDK's own client: Streamable HTTP transport + ``ClientSession.call_tool``."""

    def __init__(self, stack: contextlib.AsyncExitStack, session: Any) -> None:
        self.stack = stack
        self.session = session

    @classmethod
    async def open(cls, url: str) -> McpClient:
        from mcp.client.session import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        stack = contextlib.AsyncExitStack()
        read, write = await stack.enter_async_context(streamable_http_client(url))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        return cls(stack, session)

    async def call(self, tool: str = "noop") -> None:
        result = await self.session.call_tool(tool, MCP_ARGS)
        if result.is_error:
            raise RuntimeError(f"MCP call failed: {result}")

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.stack.aclose()


CLIENTS: dict[str, Any] = {"floor": FloorClient, "toolbus": ToolbusClient, "mcp": McpClient}


def client_url(kind: str, port: int) -> str:
    return f"http://127.0.0.1:{port}/mcp" if kind == "mcp" else f"ws://127.0.0.1:{port}/"


# -- P1, P7: sequential round trips ------------------------------------------------------


async def sequential(client: Any, n: int, tool: str = "noop") -> list[float]:
    """``n`` sequential calls; each round-trip time in seconds."""
    rtts = []
    clock = time.perf_counter
    for _ in range(n):
        t0 = clock()
        await client.call(tool)
        rtts.append(clock() - t0)
    return rtts


# -- P2, P3: concurrent sessions ---------------------------------------------------------


async def concurrent(
    kind: str,
    url: str,
    sessions: int,
    duration: float,
    barrier: Any = None,
    tool: str = "noop",
    clients: dict[str, Any] | None = None,
) -> dict[str, float]:
    """``sessions`` sessions each calling sequentially for ``duration`` s; calls completed.

    With ``barrier`` (a multiprocessing barrier) every client process connects first and
    the timed part starts together. ``clients`` maps ``kind`` to its client class
    (default :data:`CLIENTS`; :mod:`bench.peers` passes the official clients).
    """
    factory = (clients or CLIENTS)[kind]
    opened = []
    for i in range(0, sessions, 25):
        opened += await asyncio.gather(*(factory.open(url) for _ in range(min(25, sessions - i))))
    if barrier is not None:
        barrier.wait()
    await asyncio.gather(*(c.call(tool) for c in opened))  # warm-up: one call each
    counts = [0] * sessions
    deadline = time.perf_counter() + duration

    async def loop(i: int, client: Any) -> None:
        while time.perf_counter() < deadline:
            await client.call(tool)
            counts[i] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(loop(i, c) for i, c in enumerate(opened)))
    elapsed = time.perf_counter() - t0
    await asyncio.gather(*(c.close() for c in opened), return_exceptions=True)
    return {"calls": float(sum(counts)), "elapsed": elapsed}


def concurrent_worker(args: tuple[str, str, int, float, Any, bool]) -> dict[str, float]:
    """Entry of one client process of P2/P3."""
    kind, url, sessions, duration, barrier, use_uvloop = args
    from bench.servers import raise_fd_limit

    raise_fd_limit()
    return run_loop(concurrent(kind, url, sessions, duration, barrier), use_uvloop)


def run_loop(coro: Any, use_uvloop: bool) -> Any:
    if use_uvloop:
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


# -- P4: idle sessions -------------------------------------------------------------------


async def open_idle(kind: str, url: str, n: int, batch: int = 200) -> list[ClientConnection]:
    """Open ``n`` idle connections (toolbus: after hello, welcome and catalog)."""
    sockets: list[ClientConnection] = []
    for i in range(0, n, batch):
        if kind == "toolbus":
            clients = await asyncio.gather(
                *(ToolbusClient.open(url) for _ in range(min(batch, n - i)))
            )
            sockets += [c.ws for c in clients]
        else:
            sockets += await asyncio.gather(*(ws_connect(url) for _ in range(min(batch, n - i))))
    return sockets


def abort_all(sockets: list[ClientConnection]) -> None:
    for ws in sockets:
        ws.transport.abort()


# -- P5: job completion pushes -----------------------------------------------------------


async def job_pushes(
    kind: str, clients: list[Any], per_session: int, lead: float
) -> dict[str, Any]:
    """``len(clients) * per_session`` jobs that all end at the same wall time.

    Returns the push latencies (receive wall time - the wall time the handler finished)
    in seconds, and how many dispatches arrived after the finish time (those would make
    the measurement meaningless, so the round is flagged).
    """
    at = time.time() + lead
    latencies: list[float] = []
    late = 0

    async def floor_session(client: FloorClient) -> None:
        ws = client.ws
        frame = '{{"at":{!r},"pad":"{}"}}'.format(at, "x" * 120)
        for _ in range(per_session):
            await ws.send(frame)
        for _ in range(per_session):
            raw = await ws.recv()
            now = time.time()
            latencies.append(now - orjson.loads(raw)["t"])

    async def toolbus_session(client: ToolbusClient) -> None:
        nonlocal late
        ws = client.ws
        for _ in range(per_session):
            client.n += 1
            await ws.send(
                '{"type":"invoke","call_id":"%s-%07d","tool":"finish_at","params":{"at":%r}}'
                % (client.prefix, client.n, at)
            )
        done = 0
        while done < per_session:
            raw = await ws.recv()
            now = time.time()
            message = orjson.loads(raw)
            client.last_seq = message.get("seq", client.last_seq)
            kind_ = message["type"]
            if kind_ == "job.done":
                latencies.append(now - message["result"]["t"])
                done += 1
            elif kind_ == "dispatched":
                if now > at:
                    late += 1
            elif kind_ in ("job.failed", "call.error", "error"):
                raise RuntimeError(f"job failed: {message}")
        await client.ack()

    run = floor_session if kind == "floor" else toolbus_session
    await asyncio.gather(*(run(c) for c in clients))
    return {"latencies": latencies, "late": late}


# -- P6: replay after a resume -----------------------------------------------------------


async def make_backlog(url: str, invokes: int, window: int = 100) -> tuple[ToolbusClient, int]:
    """A session with ``2 * invokes`` unacknowledged events after its catalog."""
    # tool_start of every call: two events per invoke, as P6 has always measured.
    client = await ToolbusClient.open(url, ack=False, options={"tool_start": "all"})
    ws = client.ws
    sent = 0
    while sent < invokes:
        batch = min(window, invokes - sent)
        for _ in range(batch):
            client.n += 1
            await ws.send(INVOKE % (client.n, client.prefix, client.n, "noop"))
        results = 0
        while results < batch:
            message = orjson.loads(await ws.recv())
            client.last_seq = message.get("seq", client.last_seq)
            if message["type"] == "result":
                results += 1
            elif message["type"] in ("call.error", "error"):
                raise RuntimeError(f"call failed: {message}")
        sent += batch
    return client, client.last_seq


async def resume_replay(
    url: str, session: dict[str, Any], last_seq: int, until: int
) -> dict[str, float]:
    """Resume ``session`` from ``last_seq``; seconds from connect until event ``until`` arrives."""
    t0 = time.perf_counter()
    ws = await ws_connect(url, ["toolbus.v1"])
    await ws.send(
        orjson.dumps(
            {
                "type": "hello",
                "token": TOKEN,
                "profile": PROFILE,
                "session_id": session["session_id"],
                "resume_token": session["resume_token"],
                "last_seq": last_seq,
            }
        ).decode()
    )
    welcome = orjson.loads(await ws.recv())
    if not welcome.get("resumed"):
        raise RuntimeError(f"resume refused: {welcome}")
    count = 0
    while True:
        message = orjson.loads(await ws.recv())
        seq = message.get("seq")
        if seq is not None:
            count += 1
            if seq >= until:
                break
    elapsed = time.perf_counter() - t0
    await ws.send('{"type":"bye"}')
    with contextlib.suppress(Exception):
        await ws.close()
    return {"seconds": elapsed, "events": float(count)}


async def floor_replay(url: str, n: int) -> float:
    """The floor of P6: connect, ask the echo server for ``n`` canned frames, read them."""
    t0 = time.perf_counter()
    ws = await ws_connect(url)
    await ws.send('{"replay":%d}' % n)
    for _ in range(n):
        orjson.loads(await ws.recv())
    elapsed = time.perf_counter() - t0
    await ws.close()
    return elapsed


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]
