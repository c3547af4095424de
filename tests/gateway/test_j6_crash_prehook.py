"""A call whose pre-hook made it wait, cut off by a kill before its handler started,
never ran, and the restart says so; one whose handler started after such a wait is
reported cut off while it ran (SPEC J6, I6, I15, D6).

A pre-hook that returns an awaitable (SPEC I6) may hold a call for as long as it
likes (a policy service, a rate check) after the call's ``running`` rows are durable
(journaled at admission on SQLite, SPEC I15). Before, a restart read those rows as a
call cut off "while this call ran" (``cancelled``) although its handler had never
started; and when the store stopped committing during the wait (SPEC D6), the call then
ended ``unavailable`` "the tool did not run", an end the store could not keep, so the
restart said ``cancelled`` too. Now the call's ledger row says it has not started as
soon as a pre-hook's awaitable is awaited (``gateway.call_start.mark_unstarted``), and
its start is made durable before its handler runs.

The server runs in a process of its own (as in ``test_j6_crash_unstarted.py``); the
pre-hook waits on a FIFO ``gate-<call id>`` in the data folder when the test made one,
and every handler run appends its call id to ``runs.txt`` there (the truth the test
compares the restart's report with). No test sleeps to order events.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.store_faults import until
from tests.gateway.test_j6_crash_decided import SETTLED, commits_failing, metric_above_zero
from tests.gateway.test_j6_crash_unstarted import (
    HOLD_TOOLS,
    RESTARTED,
    UNSTARTED,
    DurableLedger,
    crash_settings,
    runs,
)
from tests.pg_support import store_backend  # noqa: F401 (fixture: SQLite, PostgreSQL)
from tests.support import (
    barrier,
    gateway_script,
    peer,
    peer_at,
    resume_fields,
    running,
    script_server,
)

TOOLS = "\ntools:" + HOLD_TOOLS


_DATA: list[str] = []
"""The server process's data folder (set by :func:`prehook_settings`)."""


async def gate(info: Any) -> None:
    """The pre-hook (SPEC I6): a coroutine, so every call awaits it; it waits until the
    test writes to ``gate-<call id>`` in the data folder when that FIFO exists."""
    fifo = Path(_DATA[0]) / f"gate-{info.call_id}"
    if fifo.exists():
        await asyncio.to_thread(fifo.read_text)


def prehook_settings(tmp: Path, tools: str = TOOLS) -> Any:
    """The settings of the killed server and of the next one: ``tools`` (default: the
    thread-holding tools of ``test_j6_crash_unstarted.py``) behind the :func:`gate`
    pre-hook."""
    settings = crash_settings(tmp, tools)
    _DATA[:] = [str(settings.data_dir)]
    hooks = ["tests.gateway.test_j6_crash_prehook:gate"]
    return settings.model_copy(
        update={"calls": settings.calls.model_copy(update={"pre_hooks": hooks})}
    )


SERVER_SCRIPT = gateway_script("tests.gateway.test_j6_crash_prehook:prehook_settings")


def _said(message: dict[str, Any]) -> tuple[str, str, str]:
    return message["type"], message.get("code", ""), message.get("message", "")


async def _restarted(
    settings: Any, p: Any, call_id: str
) -> tuple[list[tuple[str, str, str]], tuple[str, str, str]]:
    """After the kill: what `p`'s resumed session hears of ``call_id``, and what a
    re-send of it from another session of the principal gets (SPEC I15)."""
    async with running(settings) as gw:
        async with peer(gw, **resume_fields(p, 0)) as again:
            assert again.welcome["resumed"] is True
            seen = [
                _said(m)
                for m in await barrier(again)
                if m.get("call_id") == call_id and m["type"] != "tool_start"
            ]
        async with peer(gw) as other:
            await other.invoke(call_id, "hold", {})
            resent = _said(await other.terminal(call_id))
    return seen, resent


async def test_j6_a_call_killed_while_its_pre_hook_waits_did_not_run(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, I6, I15: `c1`'s pre-hook holds it; once the store says it has not
    started (polled: the row a restart reads), the server is SIGKILLed. The restart
    ends `c1` ``unavailable`` "it did not run", for the resumed session and a re-send;
    its handler never ran. Fails without the mark: the rows journaled at admission said
    ``running``, and the restart answered ``cancelled`` "while this call ran"."""
    settings = prehook_settings(tmp_path)
    ledger = DurableLedger(settings.data_dir, store_backend)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    os.mkfifo(settings.data_dir / "gate-c1")
    try:
        async with (
            script_server(SERVER_SCRIPT, str(tmp_path)) as first,
            peer_at(f"ws://127.0.0.1:{first.port}/") as p,
        ):
            await p.invoke("c1", "hold", {})
            await until(lambda: ledger.unstarted("c1"), "c1's row to say it has not started")
            await first.crash()
    finally:
        ledger.close()
    seen, resent = await _restarted(settings, p, "c1")
    assert seen == [("call.error", "unavailable", UNSTARTED)]
    assert resent == seen[0]
    assert runs(settings.data_dir) == []


async def test_j6_a_call_whose_handler_started_after_its_pre_hook_was_running(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, I15: `c2` awaited its pre-hook (marked not started), then its handler
    started and holds its thread; the server is SIGKILLed. The restart ends `c2`
    ``cancelled`` "while this call ran": its start was durable before its handler ran.
    Fails if the start is not made durable (the mark would say "it did not run" of a
    handler that ran, and a re-send could run it again)."""
    settings = prehook_settings(tmp_path)
    async with (
        script_server(SERVER_SCRIPT, str(tmp_path)) as first,
        peer_at(f"ws://127.0.0.1:{first.port}/") as p,
    ):
        await p.invoke("c2", "hold", {})
        await until(lambda: runs(settings.data_dir) == ["c2"], "c2's handler to run")
        await first.crash()
    seen, resent = await _restarted(settings, p, "c2")
    assert seen == [("call.error", "cancelled", RESTARTED)]
    assert resent == seen[0]
    assert runs(settings.data_dir) == ["c2"]


async def test_j6_d6_a_call_its_pre_hook_held_while_commits_failed_did_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC J6, D6, I6: `c3`'s pre-hook holds it (its rows journaled, its ledger row
    marked not started); another process locks the SQLite file and a commit fails; the
    pre-hook lets go, and `c3` ends ``unavailable`` "the tool did not run" (its start
    cannot be made durable), an end the store cannot keep; then a SIGKILL. The restart
    says it did not run, and its handler never ran. Fails without the mark: the
    journaled ``running`` rows made the restart say ``cancelled`` "while this call
    ran" (found by an attacking helper)."""
    monkeypatch.delenv("TOOLBUS_STORE__URL", raising=False)
    settings = prehook_settings(tmp_path)
    ledger = DurableLedger(settings.data_dir, "sqlite")
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    os.mkfifo(settings.data_dir / "gate-c3")
    db = settings.data_dir / "toolbus.db"
    async with (
        script_server(SERVER_SCRIPT, str(tmp_path)) as first,
        peer_at(f"ws://127.0.0.1:{first.port}/") as p,
    ):
        await p.invoke("c3", "hold", {})
        await until(lambda: ledger.unstarted("c3"), "c3's row to say it has not started")
        async with commits_failing(db, p, first.port):
            await asyncio.to_thread((settings.data_dir / "gate-c3").write_text, "go")
            await metric_above_zero(first.port, *SETTLED)
            await first.crash()
    seen, resent = await _restarted(settings, p, "c3")
    assert seen == [("call.error", "unavailable", UNSTARTED)]
    assert resent == seen[0]
    assert runs(settings.data_dir) == []
