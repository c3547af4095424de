"""HAProxy in front of real nodes, for the load-balancer tests (SPEC N6; docs/deploy.md).

:func:`haproxy_config` is the configuration docs/deploy.md shows (a test checks the two
are the same text): round robin, no stickiness, WebSocket-friendly timeouts, a health
check on ``/readyz``. :func:`haproxy` runs it in the foreground (``-db``) on a free port
and stops it after. ``haproxy`` must be on PATH (``scripts/ensure-haproxy``): a test that
needs it fails without it.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from tests.support import WAIT

FAST_CHECKS = "inter 100ms fall 1 rise 1"
"""Health checks in the tests: a node that drains is out of the rotation within 0.1 s."""


def haproxy_config(
    bind: str, servers: Sequence[tuple[str, str]], checks: str = "inter 2s fall 2 rise 2"
) -> str:
    """An HAProxy (2.4 or later) configuration for toolbus nodes (SPEC N6).

    Args:
        bind: the frontend's address, e.g. ``:8080`` or ``127.0.0.1:8080``.
        servers: ``(name, host:port)`` of each node.
        checks: the ``/readyz`` health check's timing (``inter``, ``fall``, ``rise``).

    Returns:
        The configuration file's text.
    """
    lines = [
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        "    timeout client 30s",
        "    timeout server 30s",
        "    # An upgraded WebSocket is a tunnel: idle up to this long (toolbus pings every",
        "    # server.heartbeat_interval, 20 s by default, well within it).",
        "    timeout tunnel 1h",
        "    timeout client-fin 5s",
        "    # A node that refuses the connection (it is draining) is not the end: retry on",
        "    # another node at once.",
        "    retries 3",
        "    option redispatch 1",
        "",
        "frontend toolbus",
        f"    bind {bind}",
        "    default_backend toolbus_nodes",
        "",
        "backend toolbus_nodes",
        "    # No stickiness: any node resumes any session (SPEC N2).",
        "    balance roundrobin",
        "    # /readyz answers 503 from the moment a node drains (SPEC O2, S4).",
        "    option httpchk",
        "    http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host toolbus",
        "    http-check expect status 200",
        f"    default-server check {checks}",
        *(f"    server {name} {address}" for name, address in servers),
    ]
    return "\n".join(lines) + "\n"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def haproxy_binary() -> str:
    """The ``haproxy`` on PATH; an AssertionError naming the fix when there is none."""
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    assert found, "haproxy is not installed: run scripts/ensure-haproxy"
    return found


async def _accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


@asynccontextmanager
async def haproxy(
    folder: Path, servers: Sequence[tuple[str, str]], checks: str = FAST_CHECKS
) -> AsyncIterator[str]:
    """Run HAProxy with :func:`haproxy_config` in front of ``servers`` on a free port of
    127.0.0.1; yields its ``ws://`` URL once it accepts connections, stops it after."""
    port = free_port()
    config = folder / "haproxy.cfg"
    config.write_text(haproxy_config(f"127.0.0.1:{port}", servers, checks))
    proc = await asyncio.create_subprocess_exec(
        haproxy_binary(),
        "-db",
        "-f",
        str(config),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(WAIT):
            # HAProxy says nothing when it listens: poll its port.
            while not await _accepts(port):
                assert proc.returncode is None, f"haproxy exited {proc.returncode}"
                await asyncio.sleep(0.01)
        yield f"ws://127.0.0.1:{port}/"
    finally:
        if proc.returncode is None:
            proc.terminate()
        async with asyncio.timeout(WAIT):
            await proc.wait()
