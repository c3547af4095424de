"""Jobs across a restart (SPEC J5): idempotent jobs run again, others are reported failed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway.context import ToolContext
from tests.pg_support import store_backend  # noqa: F401 (fixture: SQLite, PostgreSQL)
from tests.support import own_catalog, peer, running, settings_for

TOOLS = """
tools:
  - name: rerunnable
    description: Waits for the test, then answers; safe to run twice.
    capability: jobs
    mode: async
    idempotent: true
    handler: tests.gateway.test_jobs_restart:wait_then_answer
    parameters: {type: object, properties: {n: {type: integer}}, additionalProperties: false}
  - name: once_only
    description: Waits for the test, then answers; must not run twice.
    capability: jobs
    mode: async
    handler: tests.gateway.test_jobs_restart:wait_then_answer
    parameters: {type: object, properties: {n: {type: integer}}, additionalProperties: false}
"""
PROFILES = "profiles:\n  demo:\n    capabilities: [jobs]\n"

RELEASE: asyncio.Event | None = None
RUNS: list[tuple[str, int]] = []


async def wait_then_answer(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    RUNS.append((ctx.tool, params["n"]))
    assert RELEASE is not None
    await RELEASE.wait()
    return {"summary": f"{ctx.tool} {params['n']} done", "n": params["n"]}


@pytest.mark.usefixtures("store_backend")
async def test_restart_reruns_idempotent_and_fails_the_rest(tmp_path: Path) -> None:
    """SPEC J5: after a drain and a new start on the same store, the idempotent job runs again
    under its own id and completes; the other is reported failed ("interrupted")."""
    global RELEASE
    RUNS.clear()
    settings = settings_for(
        tmp_path,
        catalog=own_catalog(tmp_path, TOOLS, PROFILES),
    )
    RELEASE = asyncio.Event()
    async with running(settings) as gw, peer(gw) as p:
        await p.invoke("a", "rerunnable", {"n": 1})
        again = (await p.terminal("a"))["job_id"]
        await p.invoke("b", "once_only", {"n": 2})
        failed = await p.terminal("b")
        session, token = p.welcome["session_id"], p.welcome["resume_token"]
        last = failed["seq"]
        assert sorted(RUNS) == [("once_only", 2), ("rerunnable", 1)]
    RELEASE = asyncio.Event()
    RELEASE.set()
    async with (
        running(settings) as gw,
        peer(gw, session_id=session, resume_token=token, last_seq=last) as q,
    ):
        assert q.welcome["resumed"] is True
        gone = await q.expect("job.failed", job_id=failed["job_id"])
        assert gone["error"] == {
            "code": "interrupted",
            "message": "the server restarted while this job ran",
        }
        done = await q.expect("job.done", job_id=again)
        assert (done["summary"], done["result"]) == ("rerunnable 1 done", {"n": 1})
        assert RUNS.count(("rerunnable", 1)) == 2
        assert RUNS.count(("once_only", 2)) == 1
        await q.send({"type": "job.get", "id": "g", "job_id": again})
        assert (await q.expect("job", id="g"))["job"]["state"] == "done"
