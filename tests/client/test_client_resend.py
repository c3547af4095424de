"""A re-sent async call in another session of the same user (SPEC I15, K1, J3).

The job's events go to the session that started it; the re-sender's ``JobHandle``
learns the job's end through ``job.get``, exactly once.
"""

from __future__ import annotations

import asyncio
import types
from pathlib import Path
from typing import Any

import pytest

import toolbus
from gateway.demo import handlers
from gateway.server import Gateway
from protocol import messages as m
from tests.support import WAIT, running, settings_for

REPORT = {"topic": "resend", "sections": 1}
SUMMARY = "Report on resend with 1 section(s) is ready."


def connect(gateway: Gateway) -> toolbus.Client:
    return toolbus.connect(gateway.url, token="alice-token", profile="demo", request_timeout=WAIT)


async def test_resent_finished_async_call_handle_resolves(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC I15, K1: session B's report job is done and B said bye; session C re-sends
    the call id, gets the same job id, and ``result()`` gives the recorded end."""
    monkeypatch.setattr(handlers, "REPORT_SECTION_SECONDS", 0.0)
    async with connect(gateway) as first:
        started = await first.invoke("report", REPORT, call_id="rep-done", timeout=WAIT)
        assert isinstance(started, toolbus.JobHandle)
        ended = await started.result(timeout=WAIT)
    async with connect(gateway) as second:
        again = await second.invoke("report", REPORT, call_id="rep-done", timeout=WAIT)
        assert isinstance(again, toolbus.JobHandle)
        assert again.job_id == started.job_id
        assert (await second.job(again.job_id)).state is m.JobState.DONE
        outcome = await again.result(timeout=WAIT)
    assert outcome.state is m.JobState.DONE
    assert outcome.summary == SUMMARY == ended.summary
    assert outcome.result == ended.result
    assert outcome.call_id == "rep-done"
    assert outcome.event is None  # learned through job.get: the events went to B


async def test_resent_running_async_call_handle_resolves_at_end(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC I15, K1: the job is still running when C re-sends its call id; C's handle
    resolves once the job ends, though the job's events go to the session that
    started it, and the tool ran once (one job in the user's list)."""
    release = asyncio.Event()

    async def held(_seconds: float) -> None:
        await release.wait()

    monkeypatch.setattr(handlers, "asyncio", types.SimpleNamespace(sleep=held))
    async with connect(gateway) as first:
        started = await first.invoke("report", REPORT, call_id="rep-run", timeout=WAIT)
        assert isinstance(started, toolbus.JobHandle)
    async with connect(gateway) as second:
        again = await second.invoke("report", REPORT, call_id="rep-run", timeout=WAIT)
        assert isinstance(again, toolbus.JobHandle)
        assert again.job_id == started.job_id
        assert (await second.job(again.job_id)).state is m.JobState.RUNNING
        waiting: asyncio.Task[Any] = asyncio.create_task(again.result(timeout=WAIT))
        assert not waiting.done()
        release.set()
        outcome = await waiting
        assert outcome.state is m.JobState.DONE
        assert outcome.summary == SUMMARY
        assert outcome.result["sections"] == 1
        assert outcome.event is None
        assert again.done()
        assert [j.job_id for j in await second.jobs()] == [started.job_id]


async def test_call_id_beyond_session_records_gets_ledger_outcome(tmp_path: Path) -> None:
    """SPEC I12, I15, O4 (docs/configuration.md, ``sessions.max_call_records``): a
    call id older than the session's kept records, re-sent, still gets its recorded
    outcome from the principal's ledger; the tool does not run again."""
    settings = settings_for(tmp_path, sessions={"max_call_records": 1})
    async with running(settings) as gw, connect(gw) as bus:
        note = {"title": "once", "body": "b"}
        first = await bus.invoke("notes_create", note, call_id="old", timeout=WAIT)
        await bus.invoke("notes_create", {"title": "x", "body": "b"}, call_id="new")
        again = await bus.invoke("notes_create", note, call_id="old", timeout=WAIT)
        assert isinstance(first, m.Result)
        assert isinstance(again, m.Result)
        assert again.result == first.result
        assert again.seq > first.seq  # delivered anew from the ledger, own seq
