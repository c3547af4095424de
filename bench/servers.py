"""The servers the bench measures, each run in its own process on 127.0.0.1.

``python -m bench.servers floor|toolbus|mcp|socketio [--uvloop] [--data DIR]`` binds a free port,
prints one JSON line ``{"port": N, "pid": N}`` on stdout when it is ready, and serves
until SIGTERM or SIGINT. :func:`bench.run.start_server` runs these.

- ``floor``: a raw ``websockets`` asyncio echo server (compression off, no pings).
  Two extra message shapes give the floor of P5 and P6: ``{"at": T, ...}`` is answered
  ``{"t": wall}`` once wall time ``T`` has passed (a timer per message, like a job), and
  ``{"replay": N}`` is answered with ``N`` canned 200-byte frames.
- ``toolbus``: the real :class:`gateway.server.Gateway` with the bench catalog, token
  file auth, a no-op pre and post hook, JSON audit records to ``DIR/data/audit.jsonl``
  and the SQLite event log in ``DIR/data``; invoke rate limit and heartbeat off.
- ``mcp``: the official MCP Python SDK (``MCPServer``) over Streamable HTTP at ``/mcp``
  with the same no-op tool, served by uvicorn.
- ``socketio``: python-socketio's ``AsyncServer`` on its aiohttp integration, WebSocket
  transport only, with a no-op ``noop`` event handler whose return value goes back
  through the ack (what ``AsyncClient.call`` waits for).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
TOKEN = "bench-token"
PROFILE = "bench"
MAX_BYTES = 1 << 20


def raise_fd_limit() -> int:
    """Raise the soft open-files limit to the hard one (P4 holds 10,000 sockets)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _ready(port: int) -> None:
    sys.stdout.write(json.dumps({"port": port, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


# -- floor -------------------------------------------------------------------------------

_CANNED = json.dumps(
    {
        "type": "result",
        "seq": 0,
        "call_id": "c-000000",
        "tool": "noop",
        "result": {"ok": True, "pad": "x" * 110},
    }
).encode()


async def _floor_handler(ws: Any) -> None:
    async for message in ws:
        if message[:5] == '{"at"':
            asyncio.get_running_loop().create_task(_floor_at(ws, json.loads(message)["at"]))
        elif message[:9] == '{"replay"':
            for _ in range(int(json.loads(message)["replay"])):
                await ws.send(_CANNED, text=True)
        else:
            await ws.send(message)


async def _floor_at(ws: Any, at: float) -> None:
    delay = at - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    await ws.send(f'{{"t":{time.time()!r}}}')


async def serve_floor(args: argparse.Namespace) -> None:
    from websockets.asyncio.server import serve

    async with serve(
        _floor_handler, "127.0.0.1", 0, compression=None, ping_interval=None, max_size=MAX_BYTES
    ) as server:
        _ready(server.sockets[0].getsockname()[1])
        await _until_signalled()


# -- toolbus -----------------------------------------------------------------------------


def toolbus_settings(data: Path) -> Any:
    """Settings of the bench gateway: real pipeline, limits that would throttle a bench off."""
    from gateway.config import load_settings

    return load_settings(**toolbus_config(data))


def toolbus_config(data: Path) -> dict[str, Any]:
    """The bench gateway's configuration as config-file sections (``toolbus_settings``;
    ``bench/nodes.py`` writes it to a YAML file for ``toolbus serve --workers``)."""
    import yaml

    from gateway.auth import hash_token

    data.mkdir(parents=True, exist_ok=True)
    tokens = data / "tokens.yaml"
    tokens.write_text(
        yaml.safe_dump(
            {
                "tokens": [
                    {"sha256": hash_token(TOKEN), "user": "bench", "profiles": [PROFILE]},
                ]
            }
        )
    )
    return dict(
        data_dir=data / "data",
        server={"host": "127.0.0.1", "port": 0, "heartbeat_interval": 0},
        auth={"token_file": tokens},
        catalog={
            "tools": [BENCH_DIR / "noop_tools.yaml"],
            "profiles": [BENCH_DIR / "noop_profiles.yaml"],
            "hot_reload": False,
        },
        limits={
            "invoke_rate": 1e9,
            "invoke_burst": 1_000_000_000,
            "max_inflight_calls": 100_000,
            "max_sessions_per_user": 1_000_000,
            "max_pending_approvals": 100_000,
        },
        calls={"pre_hooks": ["bench.noop:pre_hook"], "post_hooks": ["bench.noop:post_hook"]},
        jobs={"max_concurrent": 100_000, "max_per_session": 100_000, "max_per_user": 100_000},
    )


async def serve_toolbus(args: argparse.Namespace) -> None:
    from gateway import logs
    from gateway.server import Gateway

    settings = toolbus_settings(Path(args.data))
    logs.setup("WARNING", True, settings.data_dir / "audit.jsonl")
    gateway = Gateway(settings)
    await gateway.start()
    _ready(gateway.port)
    try:
        await _until_signalled()
    finally:
        await gateway.drain()


# -- MCP peer ----------------------------------------------------------------------------


def mcp_app() -> Any:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench", log_level="WARNING")

    @server.tool()
    async def noop(
        city: str | None = None,
        days: int | None = None,
        units: str | None = None,
        include: list[str] | None = None,
    ) -> dict[str, Any]:
        """Do nothing and answer ok."""
        return {"ok": True}

    return server.streamable_http_app()


async def serve_mcp(args: argparse.Namespace) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        mcp_app(),
        log_level="warning",
        access_log=False,
        lifespan="on",
        loop="uvloop" if args.uvloop else "asyncio",
    )
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    _ready(sock.getsockname()[1])
    await _until_signalled()
    server.should_exit = True
    await task


# -- python-socketio peer ----------------------------------------------------------------


async def serve_socketio(args: argparse.Namespace) -> None:
    import socketio
    from aiohttp import web

    sio = socketio.AsyncServer(
        async_mode="aiohttp", transports=["websocket"], logger=False, engineio_logger=False
    )

    @sio.on("noop")
    async def noop(sid: str, data: Any) -> dict[str, Any]:
        """Do nothing and answer ok through the ack."""
        return {"ok": True}

    app = web.Application()
    sio.attach(app)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    _ready(runner.addresses[0][1])
    try:
        await _until_signalled()
    finally:
        await runner.cleanup()


async def serve_toolbus_mcp(args: argparse.Namespace) -> None:
    """toolbus mounting the bench MCP server (row M3, bench/mcp_mount.py)."""
    from bench.mcp_mount import serve

    await serve(args)


SERVERS = {
    "floor": serve_floor,
    "toolbus_mcp": serve_toolbus_mcp,
    "toolbus": serve_toolbus,
    "mcp": serve_mcp,
    "socketio": serve_socketio,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(SERVERS))
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("--data", default=None, help="toolbus: folder for tokens and data")
    args = parser.parse_args()
    raise_fd_limit()
    if args.uvloop:
        import uvloop

        uvloop.run(SERVERS[args.kind](args))
    else:
        asyncio.run(SERVERS[args.kind](args))


if __name__ == "__main__":
    main()
