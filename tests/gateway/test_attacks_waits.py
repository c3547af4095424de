"""Attacks on SPEC A7: a wait before the handler starts that is neither an approval nor a
worker slot (an ``async`` pre-hook that awaits), during which the session's context
loses what the tool's visibility requires. The gate is evaluated again right before the
handler starts, so the call ends ``denied_scope`` and the handler never runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gateway.context import ToolContext
from gateway.hooks import CallInfo, Deny
from tests.support import own_catalog, peer, running, settings_for

TOOLS = """
tools:
  - name: proj_touch
    description: Touches a project; visible only with a project_id.
    capability: t.basic
    handler: tests.gateway.test_attacks_waits:proj_touch
    visibility:
      requires_context: [project_id]
  - name: proj_job
    description: The same, as an async job.
    capability: t.basic
    mode: async
    handler: tests.gateway.test_attacks_waits:proj_touch
    visibility:
      requires_context: [project_id]
"""
PROFILES = """
profiles:
  demo:
    capabilities: [t.basic]
"""
RAN: list[str] = []
HOOK: dict[str, asyncio.Event] = {}


def proj_touch(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    RAN.append(ctx.call_id)
    return {"touched": True}


async def slow_hook(info: CallInfo) -> Deny | None:
    """A pre-hook that waits (e.g. on a policy service) until the test lets it go."""
    HOOK["entered"].set()
    await HOOK["go"].wait()
    return None


async def _run(tmp_path: Path, tool: str) -> dict[str, Any]:
    RAN.clear()
    HOOK.update(entered=asyncio.Event(), go=asyncio.Event())
    settings = settings_for(
        tmp_path,
        catalog=own_catalog(tmp_path, TOOLS, PROFILES),
        calls={"pre_hooks": ["tests.gateway.test_attacks_waits:slow_hook"]},
    )
    async with running(settings) as gw, peer(gw, context={"project_id": "p1"}) as p:
        await p.invoke("c1", tool, {})
        async with asyncio.timeout(10):
            await HOOK["entered"].wait()
        await p.send({"type": "context.update", "id": "u", "context": {"project_id": None}})
        await p.expect("context", id="u")
        HOOK["go"].set()
        end = await p.terminal("c1")
        if end["type"] == "dispatched":
            end = await p.expect("job.failed", job_id=end["job_id"])
        return end


async def test_context_lost_during_an_awaiting_pre_hook_denies_the_call(tmp_path: Path) -> None:
    """SPEC A7, I2: the context loses ``project_id`` while a pre-hook awaits; the sync
    call ends ``call.error denied_scope`` and the handler never runs."""
    end = await _run(tmp_path, "proj_touch")
    assert (end["type"], end["code"]) == ("call.error", "denied_scope")
    assert RAN == []


async def test_context_lost_during_an_awaiting_pre_hook_fails_the_job(tmp_path: Path) -> None:
    """SPEC A7, J4: the same for an async tool: its job ends ``job.failed``
    ``denied_scope`` and the handler never runs."""
    end = await _run(tmp_path, "proj_job")
    assert end["error"]["code"] == "denied_scope"
    assert RAN == []
