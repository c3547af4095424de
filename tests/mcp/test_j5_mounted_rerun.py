"""SPEC J5 for mounted MCP tools: the gateway process is SIGKILLed while jobs of two
mounted tools run; after the restart the idempotent one (``idempotentHint``) runs again
once its server has reconnected, and the other ends ``interrupted``.

The MCP server is ``tests/mcp/rerun_server.py``; it counts each tool's runs in a file.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.config import Settings
from tests.mcp.support import eventually, mcp_settings
from tests.support import peer, peer_at, running, script_server

RERUN_SERVER = Path(__file__).resolve().parent / "rerun_server.py"


def rerun_settings(tmp: Path, **mount: Any) -> Settings:
    """A catalog mounting the rerun server (tools ``r_again``, ``r_once``, both jobs)."""
    entry = {
        "name": "r",
        "command": sys.executable,
        "args": [str(RERUN_SERVER)],
        "env": {"RUNS_DIR": str(tmp)},
        "capability": "reruns",
        "defaults": {"mode": "async"},
        **mount,
    }
    return mcp_settings(tmp, [entry])


# The first gateway, in a process of its own so it can be killed with no chance to clean up.
SERVER_SCRIPT = """
import asyncio, sys
from pathlib import Path
from gateway.server import Gateway
from tests.mcp.test_j5_mounted_rerun import rerun_settings

async def main() -> None:
    gateway = Gateway(rerun_settings(Path(sys.argv[1])))
    await gateway.start()
    print(gateway.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _runs(tmp: Path, tool: str) -> int:
    log = tmp / f"{tool}.runs"
    return len(log.read_text().splitlines()) if log.exists() else 0


INTERRUPTED = {"code": "interrupted", "message": "the server restarted while this job ran"}


async def _crash_then_restart(
    tmp: Path, second: Callable[[], Settings]
) -> dict[str, dict[str, Any]]:
    """Start jobs of ``r_again`` and ``r_once`` on a gateway process, SIGKILL it while both
    run, start a gateway with ``second()`` (its catalog written after the crash) on the
    same data folder, resume the session: its final job event by tool."""
    async with (
        script_server(SERVER_SCRIPT, str(tmp)) as first,
        peer_at(f"ws://127.0.0.1:{first.port}/", profile="demo") as p,
    ):
        names: set[str] = set()
        while not {"r_again", "r_once"} <= names:  # pushed once the mount answers (C3)
            names = {t["name"] for t in (await p.expect("catalog"))["tools"]}
        await p.invoke("a", "r_again", {"label": "x"})
        assert (await p.terminal("a"))["type"] == "dispatched"
        await p.invoke("o", "r_once", {"label": "y"})
        assert (await p.terminal("o"))["type"] == "dispatched"
        await eventually(
            lambda: _runs(tmp, "again") == 1 and _runs(tmp, "once") == 1,
            "both tools started once",
        )
        last_seq = max(msg["seq"] for msg in p.seen if "seq" in msg)
        await first.crash()
    assert first.proc.returncode == -9
    fields = {
        "session_id": p.welcome["session_id"],
        "resume_token": p.welcome["resume_token"],
        "last_seq": last_seq,
    }
    ends: dict[str, dict[str, Any]] = {}
    async with running(second()) as gw, peer(gw, **fields) as again:
        assert again.welcome["resumed"] is True
        while len(ends) < 2:  # in either order
            event = await again.recv()
            if event["type"] in ("job.done", "job.failed", "job.cancelled"):
                ends[event["tool"]] = event
    return ends


async def test_j5_idempotent_mounted_job_reruns_after_sigkill(tmp_path: Path) -> None:
    """SPEC J5, J6, M1, M2: ``r_again`` (idempotentHint -> idempotent) re-runs after the
    restart, once the mount has reconnected (recovery waits for it instead of failing on
    a tool not listed yet) and ends ``job.done``; ``r_once`` ends ``job.failed``
    ``interrupted`` without running again."""
    ends = await _crash_then_restart(tmp_path, lambda: rerun_settings(tmp_path))
    assert (ends["r_again"]["type"], ends["r_again"]["summary"]) == ("job.done", "run 2")
    assert (ends["r_once"]["type"], ends["r_once"]["error"]) == ("job.failed", INTERRUPTED)
    assert (_runs(tmp_path, "again"), _runs(tmp_path, "once")) == (2, 1)


async def test_j5_mounted_jobs_end_when_the_server_cannot_reconnect(tmp_path: Path) -> None:
    """SPEC J5, J6, M2: after the restart the mount's command fails; once its first
    connection attempt has failed, both jobs end ``failed`` ``interrupted`` (none stays
    ``running``) and neither ran again."""
    missing = str(tmp_path / "missing_server.py")
    ends = await _crash_then_restart(tmp_path, lambda: rerun_settings(tmp_path, args=[missing]))
    assert (ends["r_again"]["type"], ends["r_again"]["error"]) == ("job.failed", INTERRUPTED)
    assert (ends["r_once"]["type"], ends["r_once"]["error"]) == ("job.failed", INTERRUPTED)
    assert (_runs(tmp_path, "again"), _runs(tmp_path, "once")) == (1, 1)
