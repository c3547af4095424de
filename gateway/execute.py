"""Running one handler: on the loop when async, in a worker thread when plain (SPEC S3, I8)."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gateway.context import ToolContext


async def run_handler(
    func: Callable[..., Any], params: dict[str, Any], ctx: ToolContext, pool: ThreadPoolExecutor
) -> Any:
    """Call ``func(params, ctx)`` without ever blocking the event loop (SPEC S3).

    A coroutine function is awaited; a plain function runs in ``pool``. When the caller
    is cancelled, ``ctx.cancelled`` is set so a threaded handler can stop early (a
    thread cannot be interrupted); its late return value is dropped. The
    :class:`asyncio.CancelledError` propagates (SPEC I8: never swallowed).
    """
    try:
        if _is_async(func):
            return await func(params, ctx)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool, func, params, ctx)
    except asyncio.CancelledError:
        ctx.cancelled.set()
        raise


@functools.lru_cache(maxsize=4096)
def _is_async(func: Callable[..., Any]) -> bool:
    """``inspect.iscoroutinefunction``, cached: it is slow and asked on every call."""
    return inspect.iscoroutinefunction(func)


def as_object(value: Any) -> dict[str, Any]:
    """A handler's value as a JSON object: objects pass, others become ``{"value": v}`` (I8)."""
    if isinstance(value, dict):
        return value
    return {"value": value}
