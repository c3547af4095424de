"""MCP tasks and toolbus jobs at ``/mcp`` (SPEC M4): what the installed ``mcp`` SDK allows.

The SDK (2.x) carries the 2025-11-25 task types but serves no ``tasks/*`` method and
checks a ``tools/call`` result against ``CallToolResult``, so toolbus declares no
``tasks`` capability. A client that asks for a task anyway (``params.task``) gets the
plain call: progress while the job runs, then its result (docs/mcp.md).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import mcp_types as types
import pytest

from gateway.demo import handlers
from tests.mcp.test_serve import mcp_client
from tests.support import MS, WAIT, running, settings_for


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_m4_task_augmented_call_runs_the_job_with_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """SPEC M4, J2, J4: no ``tasks`` capability is declared (initialize or discover); a
    ``tools/call`` with ``task`` on an async tool waits for the job, reporting progress,
    and answers the job's ``CallToolResult``, not a ``CreateTaskResult``."""
    monkeypatch.setattr(handlers, "REPORT_SECTION_SECONDS", MS)
    seen: list[tuple[float, str | None]] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    request = types.CallToolRequest(
        params=types.CallToolRequestParams(
            name="report", arguments={"topic": "x"}, task=types.TaskMetadata(ttl=60_000)
        )
    )
    settings = settings_for(tmp_path, jobs={"progress_interval": 0})
    async with (
        asyncio.timeout(WAIT),
        running(settings) as gateway,
        mcp_client(gateway, "bob-token", mode=mode) as client,
    ):
        assert client.server_capabilities.tasks is None
        done = await client.session.send_request(
            request, types.CallToolResult, progress_callback=progress
        )
    assert done.is_error is False
    assert done.content == [types.TextContent(text="Report on x with 3 section(s) is ready.")]
    assert seen == [
        (0.0, "I'm writing that report now; I'll tell you when it's ready."),
        (1 / 3, "section 1"),
        (2 / 3, "section 2"),
        (1.0, "section 3"),
    ]
