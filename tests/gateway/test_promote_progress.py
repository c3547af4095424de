"""A sync call promoted to a job keeps reporting progress (SPEC I14, J2)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from gateway.context import ToolContext
from tests.support import peer, running, settings_for

TOOLS = """
tools:
  - name: slowish
    description: Blocks until the test releases it, reports progress, answers.
    capability: t
    promote_after: 0.01
    handler: tests.gateway.test_promote_progress:slowish
    parameters: {type: object, additionalProperties: false}
"""
PROFILES = "profiles:\n  demo:\n    capabilities: [t]\n"
RELEASE = threading.Event()


def slowish(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    assert RELEASE.wait(10)
    ctx.progress(0.5, "half way")
    return {"summary": "slowish finished", "n": 1}


async def test_promoted_call_reports_progress_to_its_job(tmp_path: Path) -> None:
    """SPEC I14/J2: after promotion, the handler's ctx.progress reaches the job as
    job.progress, then job.done carries the result."""
    (tmp_path / "tools.yaml").write_text(TOOLS)
    (tmp_path / "profiles.yaml").write_text(PROFILES)
    RELEASE.clear()
    settings = settings_for(
        tmp_path,
        catalog={"tools": [tmp_path / "tools.yaml"], "profiles": [tmp_path / "profiles.yaml"]},
        jobs={"progress_interval": 0},
    )
    async with running(settings) as gw, peer(gw) as p:
        await p.invoke("c1", "slowish", {})
        dispatched = await p.terminal("c1")
        assert dispatched["type"] == "dispatched"
        assert dispatched["promoted"] is True
        RELEASE.set()
        progress = await p.expect("job.progress", job_id=dispatched["job_id"])
        assert (progress["progress"], progress["message"]) == (0.5, "half way")
        done = await p.expect("job.done", job_id=dispatched["job_id"])
        assert (done["summary"], done["result"]) == ("slowish finished", {"n": 1})
