"""Tools and settings for ``test_attacks_proto`` (SPEC J3, J6, D6): a job that holds its
slot until its process dies, and a job that records each run in ``runs.txt``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gateway.context import ToolContext
from tests.support import own_catalog, settings_for

TOOLS = """
tools:
  - name: hold_job
    description: An async job that holds its slot for a minute.
    capability: t.proto
    mode: async
    handler: tests.gateway.proto_tools:hold_job
    parameters: {type: object}
  - name: mark_job
    description: An async job that appends its call id to runs.txt.
    capability: t.proto
    mode: async
    handler: tests.gateway.proto_tools:mark_job
    parameters: {type: object}
"""

PROFILES = """
profiles:
  demo:
    capabilities: [t.proto]
"""


async def hold_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    await asyncio.sleep(60)
    return {"summary": "held"}


async def mark_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    with (Path(ctx.data_dir) / "runs.txt").open("a") as f:
        f.write(ctx.call_id + "\n")
    return {"summary": "marked"}


def runs(tmp: Path) -> list[str]:
    path = tmp / "data" / "runs.txt"
    return path.read_text().splitlines() if path.exists() else []


def one_job_at_a_time(tmp: Path) -> Any:
    """Settings where a session runs one job at a time (the next waits ``queued``)."""
    return settings_for(
        tmp,
        catalog=own_catalog(tmp, TOOLS, PROFILES),
        jobs={"max_per_session": 1},
    )
