"""Handlers that hold a worker thread or record their runs, for the tests of calls that
wait for a thread (SPEC J6, I8, I14, E2; ``tests/gateway/test_j6_unstarted.py``,
and the other users of ``tests/gateway/edge_tools.py``). ``hog`` holds its thread until
:data:`HOG_RELEASE` is set; ``mark`` and ``amark`` record each run in :data:`RUNS`, so
no test sleeps to order events."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from gateway.context import ToolContext
from tests.support import WAIT

TOOLS = """
tools:
  - name: hog
    description: A plain handler that holds its worker thread until released.
    capability: r.basic
    timeout: 0
    handler: tests.gateway.thread_tools:hog
  - name: promo_plain
    description: A plain sync handler promoted to a job past its soft deadline.
    capability: r.basic
    timeout: 0
    promote_after: 0.05
    handler: tests.gateway.thread_tools:mark
  - name: quick
    description: A plain handler that records its run and answers.
    capability: r.basic
    handler: tests.gateway.thread_tools:mark
"""
"""Catalog entries (capability ``r.basic``): ``hog``, ``promo_plain`` (promoted after
50 ms) and ``quick``; a test's own tools follow them."""

RUNS: list[str] = []
"""The call id of every ``mark``/``amark`` run, in order."""
RAN = threading.Event()
HOG_STARTED = threading.Event()
HOG_RELEASE = threading.Event()


def reset() -> None:
    RUNS.clear()
    RAN.clear()
    HOG_STARTED.clear()
    HOG_RELEASE.clear()


def hog(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    HOG_STARTED.set()
    HOG_RELEASE.wait(WAIT)
    return {"hog": True}


def mark(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    RUNS.append(ctx.call_id)
    RAN.set()
    return {"ran": ctx.call_id}


async def amark(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    RUNS.append(ctx.call_id)
    RAN.set()
    return {"ran": ctx.call_id}


async def wait_thread(event: threading.Event) -> None:
    """Wait, off the loop, until ``event`` (set by a handler's thread) is set."""
    async with asyncio.timeout(WAIT):
        assert await asyncio.to_thread(event.wait, WAIT)
