"""A mounted stdio MCP server's stderr, sent to toolbus's log (SPEC M1, O3).

A stdio server writes its own diagnostics ("Starting default (STDIO) server...") to
stderr. Inherited as is, they would land on the terminal of whoever runs ``toolbus
serve`` or ``toolbus check``, mixed with toolbus's own messages. :func:`logged_stdio`
hands the server a pipe instead; a daemon thread reads it and logs each line on the
``gateway.mcp.stderr`` logger at INFO, naming the server.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.client.stdio import StdioServerParameters, stdio_client

logger = logging.getLogger("gateway.mcp.stderr")

MAX_LINE = 2000
"""Characters of one stderr line kept in the log; the rest is cut."""


def _forward(read_fd: int, name: str) -> None:
    """Log each line read from ``read_fd`` until end of file (every writer closed)."""
    with os.fdopen(read_fd, "rb") as pipe:
        for raw in pipe:
            line = raw.decode("utf-8", errors="replace").rstrip()
            if line:
                logger.info("mcp %s stderr: %s", name, line[:MAX_LINE])


@asynccontextmanager
async def logged_stdio(params: StdioServerParameters, name: str) -> AsyncIterator[Any]:
    """``stdio_client(params)`` with the server's stderr logged, not inherited.

    Args:
        params: how to start the server.
        name: the mount's name, carried by each log line.

    Yields:
        The SDK's ``(read, write)`` streams.
    """
    read_fd, write_fd = os.pipe()
    threading.Thread(
        target=_forward, args=(read_fd, name), name=f"mcp-stderr-{name}", daemon=True
    ).start()
    with os.fdopen(write_fd, "w", encoding="utf-8") as errlog:
        # The child holds its own copy of the pipe's write end; ours closes on exit, so
        # the reader ends once the server process has ended too.
        async with stdio_client(params, errlog=errlog) as streams:
            yield streams
