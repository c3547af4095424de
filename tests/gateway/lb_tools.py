"""HAProxy and nginx in front of real nodes, for the load-balancer tests (SPEC N6;
docs/deploy.md).

:func:`haproxy_config` is the configuration docs/deploy.md shows (a test checks the two
are the same text): round robin, no stickiness, WebSocket-friendly timeouts, a health
check on ``/readyz``. :func:`haproxy` runs it in the foreground (``-db``) on a free port
and stops it after. ``haproxy`` must be on PATH (``scripts/ensure-haproxy``): a test that
needs it fails without it.

:func:`nginx_config` is the nginx equivalent docs/deploy.md shows (checked the same way):
an ``upstream`` of the nodes, round robin, the WebSocket upgrade headers, a long
``proxy_read_timeout``, ``proxy_next_upstream error`` past a node that refuses
connections, passive health checks only (open-source nginx has no active ones).
:func:`nginx` runs it in the foreground, every path in a test folder, on a free port.
``nginx`` must be installed (``scripts/ensure-nginx``): a test that needs it fails
without it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
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
        "    # /readyz: 503 while the store fails (SPEC D6); a draining node refuses the",
        "    # connection (SPEC S4). Either fails the check.",
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


def nginx_config(bind_port: str, servers: Sequence[tuple[str, str]]) -> str:
    """The nginx (1.18 or later, open source) configuration for toolbus nodes, for the
    ``http`` block (SPEC N6, N2).

    Args:
        bind_port: the ``listen`` parameter, e.g. ``8080`` or ``127.0.0.1:8080``.
        servers: ``(name, host:port)`` of each node (the name becomes a comment).

    Returns:
        The text, for a file included in ``http`` (Debian: ``/etc/nginx/conf.d/``).
    """
    lines = [
        "# In the http block (Debian: /etc/nginx/conf.d/toolbus.conf).",
        "map $http_upgrade $connection_upgrade {",
        "    default upgrade;",
        "    ''      close;",
        "}",
        "",
        "upstream toolbus_nodes {",
        "    # Round robin (the default); no ip_hash, hash or sticky: any node resumes any",
        "    # session (SPEC N2). Open-source nginx has no active health checks: a node",
        "    # whose connection fails is left out for fail_timeout (a passive check).",
        *(
            f"    server {address} max_fails=1 fail_timeout=5s;  # {name}"
            for name, address in servers
        ),
        "}",
        "",
        "server {",
        f"    listen {bind_port};",
        "    location / {",
        "        proxy_pass http://toolbus_nodes;",
        "        # WebSocket: HTTP/1.1 to the node, the upgrade headers passed on.",
        "        proxy_http_version 1.1;",
        "        proxy_set_header Upgrade $http_upgrade;",
        "        proxy_set_header Connection $connection_upgrade;",
        "        proxy_set_header Host $host;",
        "        proxy_connect_timeout 5s;",
        "        # An upgraded socket may be idle this long (toolbus pings every",
        "        # server.heartbeat_interval, 20 s by default, well within it).",
        "        proxy_read_timeout 1h;",
        "        proxy_send_timeout 1h;",
        "        # A draining node refuses the connection: try the next node at once.",
        "        proxy_next_upstream error timeout;",
        "    }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def nginx_binary() -> str:
    """The ``nginx`` on PATH or in /usr/sbin; an AssertionError naming the fix when there
    is none."""
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    assert found, "nginx is not installed: run scripts/ensure-nginx"
    return found


_NGINX_TEMPS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
"""The temp-file paths nginx has (each set to a folder of the test's)."""


def nginx_main_config(folder: Path, http: str) -> Path:
    """Write ``<folder>/nginx.conf``: a whole nginx configuration around ``http`` (the
    :func:`nginx_config` text) whose every path (pid, logs, temp files) is in ``folder``,
    nothing root-owned; its path. Run as root, the workers run as root too (they write
    in ``folder``)."""
    temp = folder / "nginx-temp"
    temp.mkdir(exist_ok=True)
    body = "".join(f"    {line}\n" if line else "\n" for line in http.splitlines())
    lines = [
        *(["user root;"] if os.geteuid() == 0 else []),
        "worker_processes 1;",
        f"pid {folder}/nginx.pid;",
        f"error_log {folder}/nginx-error.log;",
        "events {",
        "    worker_connections 1024;",
        "}",
        "http {",
        f"    access_log {folder}/nginx-access.log;",
        *(f"    {kind}_temp_path {temp}/{kind};" for kind in _NGINX_TEMPS),
    ]
    config = folder / "nginx.conf"
    config.write_text("\n".join(lines) + "\n" + body + "}\n")
    return config


def _nginx_args(folder: Path, config: Path) -> list[str]:
    # -e: the error log from the start (the compiled-in one is root-owned); -p: the prefix.
    error_log = str(folder / "nginx-error.log")
    return [nginx_binary(), "-e", error_log, "-p", f"{folder}/", "-c", str(config)]


def nginx_check(folder: Path, http: str) -> subprocess.CompletedProcess[str]:
    """``nginx -t`` on :func:`nginx_main_config` around ``http``: returncode 0 and
    "test is successful" in stderr when nginx accepts it."""
    config = nginx_main_config(folder, http)
    return subprocess.run(
        [*_nginx_args(folder, config), "-t"], capture_output=True, text=True, timeout=30
    )


@asynccontextmanager
async def nginx(folder: Path, servers: Sequence[tuple[str, str]]) -> AsyncIterator[str]:
    """Run nginx with :func:`nginx_config` in front of ``servers`` on a free port of
    127.0.0.1, in the foreground (``daemon off``), its pid, logs and temp files in
    ``folder``; yields its ``ws://`` URL once it accepts connections, stops it after
    (SIGTERM). The error log is ``<folder>/nginx-error.log``."""
    port = free_port()
    config = nginx_main_config(folder, nginx_config(f"127.0.0.1:{port}", servers))
    proc = await asyncio.create_subprocess_exec(
        *_nginx_args(folder, config),
        "-g",
        "daemon off;",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(WAIT):
            # nginx says nothing when it listens: poll its port.
            while not await _accepts(port):
                if proc.returncode is not None:
                    log = (folder / "nginx-error.log").read_text()
                    raise AssertionError(f"nginx exited {proc.returncode}: {log}")
                await asyncio.sleep(0.01)
        yield f"ws://127.0.0.1:{port}/"
    finally:
        if proc.returncode is None:
            proc.terminate()
        async with asyncio.timeout(WAIT):
            await proc.wait()
