"""Catalog and handlers shared by edge tests in several SPEC sections (J6, I8, I15, I12,
A7, E2): the thread-holding tools of :mod:`tests.gateway.thread_tools`, plus a coroutine
promoted to a job that waits for the test's :func:`release`, an async job padding its
result, and gated, coroutine and job variants that record their runs in
:data:`tests.gateway.thread_tools.RUNS`. No test sleeps to order events: handlers wait
on events the test sets.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gateway.context import ToolContext
from tests.gateway import thread_tools
from tests.gateway.thread_tools import RUNS
from tests.support import own_catalog, settings_for

TOOLS = (
    thread_tools.TOOLS
    + """
  - name: apromo
    description: An async def handler promoted to a job; waits for the test's release.
    capability: r.basic
    timeout: 0
    promote_after: 0.05
    handler: tests.gateway.edge_tools:await_release
  - name: pad_job
    description: An async job whose result pads to n characters.
    capability: r.basic
    mode: async
    handler: tests.gateway.edge_tools:apad
    parameters:
      type: object
      properties:
        n: {type: integer}
  - name: gated_quick
    description: Needs approval, then records its run.
    capability: r.basic
    requires_approval: true
    handler: tests.gateway.thread_tools:mark
  - name: async_quick
    description: A coroutine handler that records its run.
    capability: r.basic
    handler: tests.gateway.thread_tools:amark
  - name: job_quick
    description: An async job that records its run.
    capability: r.basic
    mode: async
    handler: tests.gateway.thread_tools:amark
"""
)

PROFILES = """
safe_default: []
profiles:
  demo:
    capabilities: [r.basic]
  readonly:
    capabilities: [r.basic]
  voice:
    capabilities: [r.basic]
  legacy:
    capabilities: [r.basic]
"""


def reset() -> None:
    RUNNING.clear()
    PEAK[0] = 0
    RELEASE.clear()
    thread_tools.reset()


RUNNING: set[str] = set()
"""Call ids whose ``await_release`` handler runs now."""
PEAK: list[int] = [0]
RELEASE: dict[str, asyncio.Event] = {}


def release() -> asyncio.Event:
    if "all" not in RELEASE:
        RELEASE["all"] = asyncio.Event()
    return RELEASE["all"]


async def await_release(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    RUNS.append(ctx.call_id)
    RUNNING.add(ctx.call_id)
    PEAK[0] = max(PEAK[0], len(RUNNING))
    try:
        await release().wait()
    finally:
        RUNNING.discard(ctx.call_id)
    return {"ran": ctx.call_id}


async def apad(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"pad": "x" * int(params["n"])}


def settings(tmp: Path, **sections: Any) -> Any:
    return settings_for(tmp, catalog=own_catalog(tmp, TOOLS, PROFILES), **sections)
