"""P11 and P12: each system through its own official client (issue 13).

P1 and P2 drive toolbus with the bench's raw ``websockets`` client, so they compare
servers. A user does not write that client: they take the library each project ships.
P11 (sequential call round trip) and P12 (50 sessions calling at once) measure what
that user gets, in one run, interleaved round by round:

- ``toolbus_client``: toolbus's Python client, ``toolbus.connect(...)`` then
  ``Client.invoke`` (acks, seq dedup, resume bookkeeping included);
- ``socketio``: python-socketio's ``AsyncClient.call`` over the WebSocket transport to
  its aiohttp server, whose ``noop`` handler returns through the ack;
- ``mcp``: the MCP SDK's ``ClientSession.call_tool`` over Streamable HTTP;
- for scale, the raw floor echo (P11) and toolbus through the raw bench client
  (``toolbus``), whose difference to ``toolbus_client`` is the client library's cost.

The step functions return row dictionaries; :mod:`bench.run` turns them into rows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from bench import clients as c
from bench.nodes import cpu_seconds
from bench.servers import PROFILE, TOKEN


class ToolbusOfficial:
    """toolbus's own client with its defaults: ``toolbus.connect`` -> ``invoke``."""

    def __init__(self, client: Any) -> None:
        self.client = client

    @classmethod
    async def open(cls, url: str) -> ToolbusOfficial:
        import toolbus

        client = toolbus.connect(url, token=TOKEN, profile=PROFILE, connect_timeout=60)
        await client.open()
        return cls(client)

    async def call(self, tool: str = "noop") -> None:
        out = await self.client.invoke(tool, c.MCP_ARGS)
        if getattr(out, "type", None) != "result":
            raise RuntimeError(f"toolbus call did not end in a result: {out!r}")

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.close()


class SocketioClient:
    """python-socketio's ``AsyncClient`` over WebSocket only: ``call`` waits for the ack."""

    def __init__(self, sio: Any) -> None:
        self.sio = sio

    @classmethod
    async def open(cls, url: str) -> SocketioClient:
        import socketio

        sio = socketio.AsyncClient(reconnection=False)
        await sio.connect(url, transports=["websocket"], wait_timeout=60)
        return cls(sio)

    async def call(self, tool: str = "noop") -> None:
        out = await self.sio.call(tool, c.MCP_ARGS, timeout=60)
        if out != {"ok": True}:
            raise RuntimeError(f"socketio call answered {out!r}")

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.sio.disconnect()


CLIENTS: dict[str, Any] = {
    "floor": c.FloorClient,
    "toolbus": c.ToolbusClient,
    "toolbus_client": ToolbusOfficial,
    "toolbus_client_idempotent": ToolbusOfficial,
    "socketio": SocketioClient,
    "mcp": c.McpClient,
}
SERVER_OF = {"toolbus_client": "toolbus", "toolbus_client_idempotent": "toolbus"}
"""The server kind each client kind talks to, when the names differ."""
TOOL_OF = {"toolbus_client_idempotent": "noop_idempotent"}
"""The tool a client kind calls, when it is not ``noop`` (row P11i)."""


def url_of(srv: dict[str, Any], kind: str) -> str:
    server = srv[SERVER_OF.get(kind, kind)]
    if kind == "socketio":
        return f"http://127.0.0.1:{server.port}"
    return str(server.url)


def _row(id_: str, metric: str, target: str, passed: bool | None, **cells: Any) -> dict[str, Any]:
    row = {"id": id_, "metric": metric, "target": target, "passed": passed}
    row.update({"floor": "", "toolbus": "", "socketio": "", "mcp": "", "ratio": "", "values": {}})
    row.update(cells)
    return row


def p11_p12(bench: Any, servers: Callable[..., Any]) -> list[dict[str, Any]]:
    """Run P11 then P12 on one set of servers; the rows of both, as dictionaries."""
    p = bench.plan
    rows: list[dict[str, Any]] = []
    with servers(["floor", "toolbus", "socketio", "mcp"], bench.uvloop, bench.tmp) as srv:
        rows += _p11(bench, p, srv)
        rows += _p12(bench, p, srv)
    return rows


def _p11(bench: Any, p: Any, srv: dict[str, Any]) -> list[dict[str, Any]]:
    kinds = ["floor", "toolbus", "toolbus_client", "toolbus_client_idempotent", "socketio", "mcp"]
    rounds: dict[str, list[float]] = {k: [] for k in kinds}

    async def go() -> None:
        opened = {k: await CLIENTS[k].open(url_of(srv, k)) for k in kinds}
        for k in kinds:  # warm-up, not recorded
            await c.sequential(opened[k], p.p11_warmup, TOOL_OF.get(k, "noop"))
        bench.log("  P11 warm")
        for r in range(p.p11_rounds):
            for k in kinds if r % 2 == 0 else kinds[::-1]:
                n = p.p11_mcp_calls if k == "mcp" else p.p11_calls
                rtts = await c.sequential(opened[k], n, TOOL_OF.get(k, "noop"))
                rounds[k].append(c.median(rtts))
        for client in opened.values():
            await client.close()

    bench.loop(go())
    bench.raw["P11"] = {"round_median_rtt_s": rounds}
    med = {k: c.median(v) for k, v in rounds.items()}
    ratio = med["toolbus_client"] / med["socketio"]
    return [
        _row(
            "P11",
            "own clients: sequential call RTT, median",
            "<= 1.0x socket.io",
            ratio <= 1.0,
            floor=_us(med["floor"]),
            toolbus=_us(med["toolbus_client"]),
            socketio=_us(med["socketio"]),
            mcp=_us(med["mcp"]),
            ratio=f"{ratio:.2f}x socket.io",
            values=med,
        ),
        _row(
            "P11i",
            "same, toolbus tool declared idempotent (no I15 check before the handler)",
            "(info)",
            None,
            toolbus=_us(med["toolbus_client_idempotent"]),
            socketio=_us(med["socketio"]),
            ratio=f"{med['toolbus_client_idempotent'] / med['socketio']:.2f}x socket.io",
        ),
        _row(
            "P11c",
            "toolbus client library cost: raw bench client -> toolbus.connect",
            "(info)",
            None,
            toolbus=f"{_us(med['toolbus'])} -> {_us(med['toolbus_client'])}",
            ratio=f"{(med['toolbus_client'] - med['toolbus']) * 1e6:+,.0f} us",
        ),
    ]


def _p12(bench: Any, p: Any, srv: dict[str, Any]) -> list[dict[str, Any]]:
    kinds = ["toolbus", "toolbus_client", "socketio", "mcp"]
    rounds: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, dict[str, list[float]]] = {k: {"server": [], "client": []} for k in kinds}
    for r in range(p.p12_rounds):
        for k in kinds if r % 2 == 0 else kinds[::-1]:
            pid = srv[SERVER_OF.get(k, k)].pid
            server_cpu, client_cpu = cpu_seconds([pid]), time.process_time()
            out = bench.loop(
                c.concurrent(k, url_of(srv, k), p.p12_sessions, p.p12_duration, clients=CLIENTS)
            )
            server_cpu = cpu_seconds([pid]) - server_cpu
            client_cpu = time.process_time() - client_cpu
            # Connecting and the warm-up call are in the CPU window: counted per call too.
            calls = out["calls"] + p.p12_sessions
            cpu[k]["server"].append(server_cpu / calls)
            cpu[k]["client"].append(client_cpu / calls)
            rounds[k].append(out["calls"] / out["elapsed"])
            bench.log(f"  P12 round {r + 1}: {k} {rounds[k][-1]:,.0f}/s")
    bench.raw["P12"] = {
        "round_calls_per_s": rounds,
        "round_cpu_s_per_call": cpu,
        "sessions": p.p12_sessions,
    }
    med = {k: c.median(v) for k, v in rounds.items()}
    per_call = {k: {side: c.median(v) for side, v in sides.items()} for k, sides in cpu.items()}
    ratio = med["toolbus_client"] / med["socketio"]
    return [
        _row(
            "P12",
            f"own clients: {p.p12_sessions} sessions, throughput",
            ">= 1.0x socket.io",
            ratio >= 1.0,
            toolbus=_per_s(med["toolbus_client"]),
            socketio=_per_s(med["socketio"]),
            mcp=_per_s(med["mcp"]),
            ratio=f"{ratio:.2f}x socket.io",
            values=med,
        ),
        _row(
            "P12c",
            "toolbus client library cost: raw bench client -> toolbus.connect",
            "(info)",
            None,
            toolbus=f"{_per_s(med['toolbus'])} -> {_per_s(med['toolbus_client'])}",
            ratio=f"{med['toolbus_client'] / med['toolbus']:.2f}x",
        ),
        _row(
            "P12u",
            "CPU per call, server + client (own clients, P12's rounds)",
            "(info)",
            None,
            toolbus=_cpu(per_call["toolbus_client"]),
            socketio=_cpu(per_call["socketio"]),
            mcp=_cpu(per_call["mcp"]),
            ratio=f"{_total(per_call['toolbus_client']) / _total(per_call['socketio']):.2f}x"
            " socket.io",
            values=per_call,
        ),
    ]


def _total(sides: dict[str, float]) -> float:
    return sides["server"] + sides["client"]


def _cpu(sides: dict[str, float]) -> str:
    return f"{sides['server'] * 1e6:,.0f} + {sides['client'] * 1e6:,.0f} us"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} us"


def _per_s(rate: float) -> str:
    return f"{rate:,.0f}/s"
