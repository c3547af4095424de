"""A job whose call awaited a pre-hook, cut off by a kill once its handler started, is
never reported as a call that did not run (SPEC J6, I6, I9, I15, J5).

A pre-hook's awaitable marks the call's ledger row as not started
(``gateway.call_start.mark_unstarted``): a restart then ends it ``unavailable`` "it
did not run". A sync call's start makes its start durable before its handler runs; a
job's start must too, whatever its tool: an ``idempotent`` job's start commits nothing
of its own (SPEC J5: it may run again), and its first handler step runs in the loop
turn after the call's ``dispatched``, before the flush that would commit it. A kill
there left the mark as the durable record, and the restart said "it did not run" of a
handler that had run.

The server runs in a process of its own (as in ``test_j6_crash_prehook.py``); the
pre-hook waits on a FIFO ``gate-<call id>`` in the data folder, and every handler run
appends its call id to ``runs.txt`` there. No test sleeps to order events.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from gateway.context import ToolContext
from tests.gateway.store_faults import until
from tests.gateway.test_j6_crash_prehook import prehook_settings
from tests.gateway.test_j6_crash_unstarted import (
    UNSTARTED,
    DurableLedger,
    _note,
    runs,
)
from tests.pg_support import store_backend  # noqa: F401 (fixture: SQLite, PostgreSQL)
from tests.support import (
    WAIT,
    barrier,
    gateway_script,
    peer,
    peer_at,
    resume_fields,
    running,
    script_server,
)

TOOLS = """
tools:
  - name: idem_job_die
    description: An idempotent job whose coroutine handler notes its run and kills its
      process at its first start (a re-run after the restart just answers).
    capability: t.crash
    mode: async
    idempotent: true
    handler: tests.gateway.test_j6_crash_prehook_jobs:die_once
  - name: plain_job_die
    description: The same, not idempotent.
    capability: t.crash
    mode: async
    handler: tests.gateway.test_j6_crash_prehook_jobs:die_once
"""

GATED: dict[str, Any] = {"options": {"tool_start": "gated"}}
"""The hello of every session here (SPEC A6): no ``tool_start`` for an ungated call, so
nothing but the call's ``dispatched`` brings a flush in the turn the pre-hook let go."""


async def die_once(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Notes its run; the first run kills its process before it yields to the loop."""
    _note(ctx)
    marker = Path(ctx.data_dir) / f"died-{ctx.call_id}"
    if not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return {"survived": ctx.call_id}


def jobs_settings(tmp: Path) -> Any:
    """The settings of the killed server and of the next one: the jobs above behind
    the pre-hook of ``test_j6_crash_prehook.py`` (it waits on ``gate-<call id>``)."""
    return prehook_settings(tmp, TOOLS)


SERVER_SCRIPT = gateway_script("tests.gateway.test_j6_crash_prehook_jobs:jobs_settings")


def _said(message: dict[str, Any]) -> tuple[str, str, str]:
    return message["type"], message.get("code", ""), message.get("message", "")


async def _killed_by_job(tmp_path: Path, backend: str, tool: str) -> tuple[Any, Any]:
    """`j1` (``tool``) waits in its pre-hook until the store marks it not started;
    then the pre-hook lets go, the call is dispatched and its job's handler kills the
    server process. Returns the settings and the peer."""
    settings = jobs_settings(tmp_path)
    ledger = DurableLedger(settings.data_dir, backend)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    os.mkfifo(settings.data_dir / "gate-j1")
    try:
        async with (
            script_server(SERVER_SCRIPT, str(tmp_path)) as first,
            peer_at(f"ws://127.0.0.1:{first.port}/", **GATED) as p,
        ):
            await p.invoke("j1", tool, {})
            await until_unstarted(ledger, "j1")
            await asyncio.to_thread((settings.data_dir / "gate-j1").write_text, "go")
            async with asyncio.timeout(WAIT):
                assert await first.proc.wait() == -signal.SIGKILL
    finally:
        ledger.close()
    return settings, p


async def until_unstarted(ledger: DurableLedger, call_id: str) -> None:
    """Poll another process's store until ``call_id``'s row says it has not started."""
    await until(lambda: ledger.unstarted(call_id), f"{call_id}'s row to say not started")


async def _check_truth(settings: Any, p: Any, tool: str) -> None:
    """After the restart: the handler ran, so neither the resumed session nor a re-send
    of `j1` from another session hears ``unavailable`` "it did not run" (SPEC J6)."""
    assert runs(settings.data_dir)[:1] == ["j1"]
    async with running(settings) as gw:
        async with peer(gw, **resume_fields(p, 0), **GATED) as again:
            assert again.welcome["resumed"] is True
            seen = [_said(m) for m in await barrier(again) if m.get("call_id") == "j1"]
        async with peer(gw, **GATED) as other:
            await other.invoke("j1", tool, {})
            resent = _said(await other.terminal("j1"))
    assert ("call.error", "unavailable", UNSTARTED) not in seen, seen
    assert resent != ("call.error", "unavailable", UNSTARTED), resent


async def test_j6_an_idempotent_job_after_a_pre_hook_wait_is_not_reported_unstarted(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, I6, J5: `j1` (an idempotent job) awaited its pre-hook (marked not
    started), was dispatched, and its handler killed the server at its start. The
    restart must not say "it did not run". Fails when the job's start commits nothing
    (idempotent): the mark was the durable record."""
    settings, p = await _killed_by_job(tmp_path, store_backend, "idem_job_die")
    await _check_truth(settings, p, "idem_job_die")


async def test_j6_a_job_after_a_pre_hook_wait_is_not_reported_unstarted(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, I6, J5: the same for a job that is not idempotent (a pin: its start's
    commit holds the call's ``dispatched`` end)."""
    settings, p = await _killed_by_job(tmp_path, store_backend, "plain_job_die")
    await _check_truth(settings, p, "plain_job_die")
