"""Fixtures of the client tests: a real server on 127.0.0.1 (tests/support.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.server import Gateway
from tests.support import running, settings_for


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    """A real server on 127.0.0.1, port 0, demo catalog, test tokens, data in tmp_path."""
    async with running(settings_for(tmp_path)) as gw:
        yield gw


@pytest.fixture
def gateway_url(tmp_path: Path) -> Iterator[str]:
    """A real server running in its own thread and event loop, for synchronous tests
    of entry points that call ``asyncio.run`` themselves (the ``toolbus run`` CLI)."""
    ready = threading.Event()
    urls: list[str] = []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def serve() -> None:
        async with running(settings_for(tmp_path)) as gw:
            urls.append(gw.url)
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10), "server did not start"
    try:
        yield urls[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
