"""Handlers and hooks of the bench catalog (``bench/noop_tools.yaml``).

Every handler does as little as possible so the bench measures the gateway, not tools.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any


async def noop(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The no-op sync tool, as a coroutine (runs on the loop, no thread hop)."""
    return {"ok": True}


def noop_thread(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The same no-op as a plain function: the gateway runs it in a worker thread (SPEC S3)."""
    return {"ok": True}


async def finish_at(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Async (job) tool of P5: sleep until wall time ``at``, return the wall time it ended.

    The client computes push latency = receive time - ``t`` (same machine, same clock).
    """
    delay = float(params["at"]) - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    return {"summary": "done", "t": time.time()}


def pre_hook(info: Any) -> None:
    """A pre-execute hook that allows everything (SPEC I6), so the hook stage runs."""
    return None


def post_hook(info: Any, result: dict[str, Any]) -> None:
    """A post-execute hook that keeps every result (SPEC I10)."""
    return None
