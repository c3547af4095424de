"""Shared test support: a real server on 127.0.0.1 and a thin raw protocol client.

``MS`` is the one scaled time unit (``TOOLBUS_TEST_MS`` seconds, default 0.001):
delays in tests are multiples of it so slow CI can stretch them. Every await that
could hang sits under ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import jwt
import orjson
import yaml
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gateway.auth import hash_token
from gateway.config import DEMO_DIR, Settings, load_settings
from gateway.server import Gateway

ROOT = Path(__file__).resolve().parents[1]
"""The repository folder (where ``python -m gateway.cli`` runs from)."""

MS = float(os.environ.get("TOOLBUS_TEST_MS", "0.001"))
WAIT = 10.0
"""Seconds any single expectation may take before the test fails."""

TOKENS = {
    "alice-token": {"user": "alice", "profiles": ["demo", "readonly", "voice", "legacy"]},
    "bob-token": {"user": "bob", "profiles": ["demo"]},
    # Same user name, other tenant: a different principal (SPEC S2).
    "alice-t2-token": {"user": "alice", "profiles": ["demo"], "tenant": "t2"},
}


JWT_SECRET = "a-test-only-hs256-secret-of-32-bytes-or-more!"
"""The HS256 secret test servers that accept JWTs are given (``auth.jwt_secret``)."""


def make_jwt(sub: str, profiles: list[str] | tuple[str, ...], exp: float) -> str:
    """An HS256 JWT signed with :data:`JWT_SECRET` for ``sub`` granting ``profiles``,
    expiring at ``exp`` (Unix seconds) (SPEC S2, S6)."""
    claims = {"sub": sub, "profiles": list(profiles), "exp": exp}
    return jwt.encode(claims, JWT_SECRET, "HS256")


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


def own_catalog(tmp: Path, tools: str, profiles: str) -> dict[str, Any]:
    """Write ``tools`` and ``profiles`` (YAML text) to ``tmp``/tools.yaml and
    ``tmp``/profiles.yaml; the ``catalog`` section for :func:`settings_for` that loads
    them, hot reload off."""
    (tmp / "tools.yaml").write_text(tools)
    (tmp / "profiles.yaml").write_text(profiles)
    return {
        "tools": [tmp / "tools.yaml"],
        "profiles": [tmp / "profiles.yaml"],
        "hot_reload": False,
    }


class Clock:
    """Wall time (Unix s) a test moves ahead by :attr:`ahead`, for ``Gateway(clock=)``;
    the loop's timers keep real time."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead


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


@asynccontextmanager
async def peer_at(url: str, **hello: Any) -> AsyncIterator[Peer]:
    """A :class:`Peer` connected to ``url`` (a server in another process) that said
    hello (``hello`` fields)."""
    async with connect(url, subprotocols=["toolbus.v1"], max_size=None) as ws:  # type: ignore[list-item]
        p = Peer(ws)
        await p.hello(**hello)
        yield p


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


def toolbus_argv(*args: str) -> list[str]:
    """``toolbus ARGS`` (``python -m gateway.cli ARGS``) as an argument list."""
    return [sys.executable, "-m", "gateway.cli", *args]


def run_toolbus(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run ``toolbus ARGS`` in ``cwd`` to its end (``env`` defaults to this process's)
    and capture its output as text."""
    return subprocess.run(
        toolbus_argv(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


def clean_env() -> dict[str, str]:
    """This process's environment without any ``TOOLBUS_*`` override."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TOOLBUS_")}


async def spawn_serve(
    *args: str,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    stderr: int = asyncio.subprocess.DEVNULL,
) -> asyncio.subprocess.Process:
    """Start ``toolbus serve ARGS`` as a subprocess with stdout piped (``env`` defaults
    to :func:`clean_env`). The caller reads its banner and ends it."""
    return await asyncio.create_subprocess_exec(
        *toolbus_argv("serve", *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
        cwd=cwd,
        env=clean_env() if env is None else env,
    )


class ScriptServer:
    """A server process run from a ``python -c`` script that prints its port first."""

    def __init__(self, proc: asyncio.subprocess.Process, port: int) -> None:
        self.proc = proc
        self.port = port

    async def crash(self) -> None:
        """SIGKILL the process and wait for its end."""
        self.proc.kill()
        async with asyncio.timeout(WAIT):
            await self.proc.wait()


def gateway_script(settings: str) -> str:
    """A ``python -c`` script for :func:`script_server`: a :class:`Gateway` in a process
    of its own (so a test can SIGKILL it), on the settings ``settings(Path(argv[1]))``
    gives, ``settings`` named ``module:function``; it prints its port, then serves."""
    module, function = settings.split(":")
    return f"""
import asyncio, sys
from pathlib import Path
from gateway.server import Gateway
from {module} import {function}

async def main():
    gateway = Gateway({function}(Path(sys.argv[1])))
    await gateway.start()
    print(gateway.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


class PortTaken(AssertionError):
    """``toolbus serve`` could not listen on its configured port: another process took
    it after the test picked it (a free port is free only when it is picked)."""


async def serve_until_banner(
    config: Path, address: str, errors: Path, wait: float
) -> asyncio.subprocess.Process:
    """``toolbus serve --config CONFIG`` with its stderr in ``errors``, once it printed
    its banner naming ``address`` (at most ``wait`` seconds).

    Raises:
        PortTaken: it exited because the port was in use (the caller may pick another).
        AssertionError: it exited or printed something else; the message holds its
            stderr, so a failed start names its cause.
    """
    with errors.open("wb") as err:
        proc = await spawn_serve("--config", str(config), stderr=err.fileno())
    assert proc.stdout is not None
    async with asyncio.timeout(wait):
        banner = (await proc.stdout.readline()).decode()
    if banner.startswith(f"toolbus serving on ws://{address}/"):
        return proc
    async with asyncio.timeout(wait):
        await proc.wait()
    text = await asyncio.to_thread(errors.read_text, errors="replace")
    if "address already in use" in text:
        raise PortTaken(text)
    raise AssertionError(f"toolbus serve --config {config} did not start: {banner!r} {text}")


@asynccontextmanager
async def script_server(script: str, *args: str) -> AsyncIterator[ScriptServer]:
    """Run ``python -c SCRIPT ARGS`` in the repository folder; yield it once it printed
    its port; kill it when the block ends if it still runs."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, *args, stdout=asyncio.subprocess.PIPE, cwd=ROOT
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(WAIT):
            port = int(await proc.stdout.readline())
        yield ScriptServer(proc, port)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
