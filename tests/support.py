"""Shared test support: a real server on 127.0.0.1 and a thin raw protocol client.

``MS`` is the one scaled time unit (``TOOLBUS_TEST_MS`` seconds, default 0.001):
delays in tests are multiples of it so slow CI can stretch them. Every await that
could hang sits under ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import yaml
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gateway.auth import hash_token
from gateway.config import DEMO_DIR, Settings, load_settings
from gateway.server import Gateway

MS = float(os.environ.get("TOOLBUS_TEST_MS", "0.001"))
WAIT = 10.0
"""Seconds any single expectation may take before the test fails."""

TOKENS = {
    "alice-token": {"user": "alice", "profiles": ["demo", "readonly", "voice", "legacy"]},
    "bob-token": {"user": "bob", "profiles": ["demo"]},
    # Same user name, other tenant: a different principal (SPEC S2).
    "alice-t2-token": {"user": "alice", "profiles": ["demo"], "tenant": "t2"},
}


def write_token_file(folder: Path) -> Path:
    """A token file (hashes only, SPEC S2) accepting the tokens of :data:`TOKENS`."""
    entries = [{"sha256": hash_token(t), **v} for t, v in TOKENS.items()]
    path = folder / "tokens.yaml"
    path.write_text(yaml.safe_dump({"tokens": entries}))
    return path


def settings_for(tmp: Path, **sections: Any) -> Settings:
    """Settings for a test server: port 0, data in ``tmp``, the demo catalog, test tokens."""
    overrides: dict[str, Any] = {
        "data_dir": tmp / "data",
        "server": {"port": 0, "heartbeat_interval": 0},
        "auth": {"token_file": write_token_file(tmp)},
        "catalog": {
            "tools": [DEMO_DIR / "tools.yaml"],
            "profiles": [DEMO_DIR / "profiles.yaml"],
            "hot_reload": False,
        },
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(overrides.get(key), dict):
            overrides[key] = {**overrides[key], **value}
        else:
            overrides[key] = value
    return load_settings(**overrides)


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Gateway]:
    """Start a real :class:`Gateway`, yield it, drain it."""
    gateway = Gateway(settings)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.drain()


class Peer:
    """A raw protocol client over a real websockets connection."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.welcome: dict[str, Any] = {}
        self.seen: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any] | bytes | str) -> None:
        if isinstance(message, dict):
            message = orjson.dumps(message).decode()
        await self.ws.send(message)

    async def recv(self) -> dict[str, Any]:
        async with asyncio.timeout(WAIT):
            raw = await self.ws.recv()
        message: dict[str, Any] = orjson.loads(raw)
        self.seen.append(message)
        return message

    async def expect(self, type_: str, **fields: Any) -> dict[str, Any]:
        """Receive until a message of ``type_`` whose fields match; earlier ones are kept in
        :attr:`seen`. Fails after :data:`WAIT` seconds."""
        async with asyncio.timeout(WAIT):
            while True:
                message = await self.recv()
                if message["type"] == type_ and all(message.get(k) == v for k, v in fields.items()):
                    return message

    async def hello(
        self, token: str = "alice-token", profile: str | None = "demo", **fields: Any
    ) -> dict[str, Any]:
        await self.send({"type": "hello", "token": token, "profile": profile, **fields})
        self.welcome = await self.expect("welcome")
        return self.welcome

    async def invoke(
        self, call_id: str, tool: str, params: dict[str, Any] | None = None, **fields: Any
    ) -> None:
        message: dict[str, Any] = {"type": "invoke", "call_id": call_id, "tool": tool, **fields}
        if params is not None:
            message["params"] = params
        await self.send(message)

    async def terminal(self, call_id: str) -> dict[str, Any]:
        """The one terminal reply of ``call_id`` (SPEC I12)."""
        async with asyncio.timeout(WAIT):
            while True:
                message = await self.recv()
                if message.get("call_id") == call_id and message["type"] in (
                    "result",
                    "dispatched",
                    "call.error",
                ):
                    return message


@asynccontextmanager
async def peer(
    gateway: Gateway, *, hello: bool = True, origin: str | None = None, **hello_fields: Any
) -> AsyncIterator[Peer]:
    """Connect a :class:`Peer` to ``gateway`` (and say hello unless told not to)."""
    headers = {"Origin": origin} if origin else None
    async with connect(
        gateway.url, subprotocols=["toolbus.v1"], additional_headers=headers, max_size=None
    ) as ws:  # type: ignore[list-item]
        p = Peer(ws)
        if hello:
            await p.hello(**hello_fields)
        yield p


CONVERT = {"value": 1, "from_unit": "m", "to_unit": "cm"}
"""Arguments of a quick, valid demo call (convert_units)."""


def signal(gw: Gateway, name: str) -> asyncio.Event:
    """An event set each time ``gw.sessions.<name>`` (``park`` or ``end``) runs."""
    event = asyncio.Event()
    original = getattr(gw.sessions, name)

    def wrapper(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        event.set()

    setattr(gw.sessions, name, wrapper)
    return event


def park_signal(gw: Gateway) -> asyncio.Event:
    """An event set each time the server parks a session (its socket went away)."""
    return signal(gw, "park")


async def dropped(p: Peer, parked: asyncio.Event) -> None:
    """Drop the client's socket abruptly and wait until the server parked its session."""
    parked.clear()
    p.ws.transport.abort()
    async with asyncio.timeout(WAIT):
        await parked.wait()


async def closed(p: Peer) -> ConnectionClosed:
    """Read until the server closes; the close it sent (``.rcvd.code``)."""
    async with asyncio.timeout(WAIT):
        while True:
            try:
                await p.recv()
            except ConnectionClosed as exc:
                return exc


def resume_fields(p: Peer, last_seq: int, **extra: Any) -> dict[str, Any]:
    """The hello fields that resume ``p``'s session from ``last_seq`` (SPEC D3)."""
    return {
        "session_id": p.welcome["session_id"],
        "resume_token": p.welcome["resume_token"],
        "last_seq": last_seq,
        **extra,
    }


async def barrier(p: Peer) -> list[dict[str, Any]]:
    """Everything received up to the answer of a request sent now (a reply has no seq and
    leaves after every event emitted before it, SPEC D1)."""
    start = len(p.seen)
    await p.send({"type": "grants.list", "id": "barrier"})
    await p.expect("grants", id="barrier")
    return p.seen[start:-1]


def sequenced(messages: list[dict[str, Any]]) -> list[int]:
    """The ``seq`` of each durable event among ``messages``, in order."""
    return [msg["seq"] for msg in messages if "seq" in msg]
