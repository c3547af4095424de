"""A sync call promoted to a job (SPEC I14) while its plain handler still waits for a
worker thread, then the server is SIGKILLed: the job never started, and after the
restart it runs or says it never started, never ``interrupted`` (SPEC J6, J5); the
call itself ended ``dispatched``. One whose handler got its thread and started before
the kill is ``interrupted`` (or runs again when its tool is idempotent).

The server runs in a process of its own with one worker thread, as in
``tests/gateway/test_j6_crash_unstarted.py``: `h1` holds the thread, the promoted call
waits for it; each handler run appends its call id to ``runs.txt`` in the data folder.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from gateway.context import ToolContext
from tests.gateway.store_faults import until
from tests.gateway.test_j6_crash_unstarted import HOLD_TOOLS, _note, crash_settings, runs
from tests.pg_support import store_backend  # noqa: F401 (fixture: SQLite, PostgreSQL)
from tests.support import (
    WAIT,
    Peer,
    peer,
    peer_at,
    resume_fields,
    running,
    script_server,
)

TOOLS = (
    "\ntools:"
    + HOLD_TOOLS
    + """  - name: slow_note
    description: A plain sync handler promoted past 50 ms; notes its run and answers.
    capability: t.crash
    timeout: 0
    promote_after: 0.05
    handler: tests.gateway.test_j6_crash_promoted:note
  - name: slow_die
    description: A plain sync handler promoted past 50 ms; notes its run, then kills its
      own process with SIGKILL on its first run.
    capability: t.crash
    timeout: 0
    promote_after: 0.05
    handler: tests.gateway.test_j6_crash_promoted:die_once
  - name: slow_die_idem
    description: As slow_die, for an idempotent tool.
    capability: t.crash
    timeout: 0
    promote_after: 0.05
    idempotent: true
    handler: tests.gateway.test_j6_crash_promoted:die_once
  - name: gated_note
    description: A plain sync handler behind an approval; notes its run and answers.
    capability: t.crash
    timeout: 0
    requires_approval: true
    handler: tests.gateway.test_j6_crash_promoted:note
"""
)


def note(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    _note(ctx)
    return {"ran": ctx.call_id}


def die_once(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    _note(ctx)
    if runs(Path(ctx.data_dir)).count(ctx.call_id) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"ran": ctx.call_id}


def promoted_settings(tmp: Path, **sections: Any) -> Any:
    """The settings of ``test_j6_crash_unstarted.crash_settings`` with this file's tools:
    one worker thread for calls; data in ``tmp``; SQLite, or PostgreSQL when
    ``TOOLBUS_STORE__URL`` says so."""
    return crash_settings(tmp, TOOLS, **sections)


SERVER_SCRIPT = """
import asyncio, sys
from pathlib import Path
from gateway.server import Gateway
from tests.gateway.test_j6_crash_promoted import promoted_settings

async def main():
    gateway = Gateway(promoted_settings(Path(sys.argv[1])))
    await gateway.start()
    print(gateway.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def _job_end(p: Peer, job_id: str) -> dict[str, Any]:
    """The first ``job.done`` or ``job.failed`` of ``job_id`` that ``p`` receives."""
    async with asyncio.timeout(WAIT):
        while True:
            message = await p.recv()
            if message["type"] in ("job.done", "job.failed") and message["job_id"] == job_id:
                return message


async def _job(p: Any, job_id: str) -> dict[str, Any]:
    await p.send({"type": "job.get", "id": "g-" + job_id, "job_id": job_id})
    return dict(await p.expect("job", id="g-" + job_id))


async def test_j6_a_promoted_call_waiting_for_a_thread_at_a_crash_is_not_interrupted(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, I14, J5: `c1` (promoted past 50 ms) waits for the one thread `h1` holds
    and is promoted to a job whose handler has not started; SIGKILL. After the restart
    the job runs (``job.done``) or ends ``not_started``, never ``interrupted``; a re-send
    of `c1` answers its ``dispatched`` with the same job id; `c1` ran at most once."""
    settings = promoted_settings(tmp_path)
    async with (
        script_server(SERVER_SCRIPT, str(tmp_path)) as first,
        peer_at(f"ws://127.0.0.1:{first.port}/") as p,
    ):
        await p.invoke("h1", "hold", {})
        await until(lambda: runs(settings.data_dir) == ["h1"], "h1 to hold the one thread")
        await p.invoke("c1", "slow_note", {})
        dispatched = await p.terminal("c1")
        assert dispatched["type"] == "dispatched", dispatched
        await first.crash()
    assert first.proc.returncode == -9
    assert runs(settings.data_dir) == ["h1"]
    job_id = dispatched["job_id"]
    async with running(settings) as gw, peer(gw, **resume_fields(p, dispatched["seq"])) as again:
        assert again.welcome["resumed"] is True
        end = await _job_end(again, job_id)
        if end["type"] == "job.failed":
            assert end["error"]["code"] == "not_started", end
        else:
            assert runs(settings.data_dir) == ["h1", "c1"]
        job = await _job(again, job_id)
        assert job["job"]["state"] in ("done", "failed"), job
        assert (job["job"].get("error") or {}).get("code") != "interrupted", job
        await again.invoke("c1", "slow_note", {})
        resent = await again.terminal("c1")
        assert (resent["type"], resent.get("job_id")) == ("dispatched", job_id), resent
    assert runs(settings.data_dir).count("c1") <= 1


async def _crash_after_start(tmp_path: Path, tool: str) -> tuple[Any, Any, dict[str, Any]]:
    settings = promoted_settings(tmp_path)
    async with (
        script_server(SERVER_SCRIPT, str(tmp_path)) as first,
        peer_at(f"ws://127.0.0.1:{first.port}/") as p,
    ):
        await p.invoke("h1", "hold", {})
        await until(lambda: runs(settings.data_dir) == ["h1"], "h1 to hold the one thread")
        await p.invoke("c1", tool, {})
        dispatched = await p.terminal("c1")
        assert dispatched["type"] == "dispatched", dispatched
        await p.invoke("r1", "let_go", {"call_id": "h1"})
        async with asyncio.timeout(WAIT):
            await first.proc.wait()  # c1's handler killed it at its start
    assert first.proc.returncode == -9
    assert runs(settings.data_dir) == ["h1", "c1"]
    return settings, p, dispatched


async def test_j6_a_promoted_call_that_got_its_thread_then_crashed_is_interrupted(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, J5: `c1` is promoted while it waits for the thread `h1` holds; `h1` is
    let go, `c1`'s handler starts and kills the server. After the restart the job ends
    ``failed`` ``interrupted`` (its tool is not idempotent) and does not run again."""
    settings, p, dispatched = await _crash_after_start(tmp_path, "slow_die")
    job_id = dispatched["job_id"]
    async with running(settings) as gw, peer(gw, **resume_fields(p, dispatched["seq"])) as again:
        end = await _job_end(again, job_id)
        assert (end["type"], end["error"]["code"]) == ("job.failed", "interrupted"), end
    assert runs(settings.data_dir) == ["h1", "c1"]


async def test_j5_a_promoted_idempotent_call_that_started_before_a_crash_runs_again(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J5, J6: as above for an idempotent tool: after the restart the job runs
    again and ends ``job.done``."""
    settings, p, dispatched = await _crash_after_start(tmp_path, "slow_die_idem")
    job_id = dispatched["job_id"]
    async with running(settings) as gw, peer(gw, **resume_fields(p, dispatched["seq"])) as again:
        end = await _job_end(again, job_id)
        assert end["type"] == "job.done", end
    assert runs(settings.data_dir) == ["h1", "c1", "c1"]
