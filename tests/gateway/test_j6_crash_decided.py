"""A call allowed while the store cannot commit, then the server process is killed: the
restart reports what really happened to its handler (SPEC J6, A3, D6, I15).

The user's decision is committed before the call's handler starts (SPEC A3), for every
tool: a job (``mode: async``) and an ``idempotent`` tool too, whose ``running`` rows
alone need not be durable first (SPEC I15). A decision whose commit fails (the SQLite
file locked by another process, :data:`~tests.gateway.store_faults.LOCKER`, D6) starts
no handler: the call ends ``unavailable`` "the tool did not run" (held, never sent
unstored), and after a SIGKILL the restart finds the call still waiting for its
approval and says it did not run, which is then the truth. Before the fix a job's
handler started on a decision that was not durable, and the restart said "it did not
run" of a handler that had run.

The server runs in a process of its own, as in ``test_j6_crash_unstarted.py``; each
handler run appends its call id to ``runs.txt`` in the data folder (the truth the
test compares the restart's report with).
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import urllib.request
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.gateway.store_faults import LOCKER
from tests.gateway.test_j6_crash_unstarted import UNSTARTED, _note, crash_settings, runs
from tests.support import (
    MS,
    WAIT,
    Peer,
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
  - name: gated_job
    description: An idempotent job behind the user's approval; notes its run.
    capability: t.crash
    mode: async
    idempotent: true
    requires_approval: true
    handler: tests.gateway.test_j6_crash_decided:note
  - name: idem_job
    description: An idempotent job; gated only by the session's confirm_tool_calls.
    capability: t.crash
    mode: async
    idempotent: true
    handler: tests.gateway.test_j6_crash_decided:note
  - name: gated_plain_job
    description: A job behind the user's approval, not idempotent; notes its run.
    capability: t.crash
    mode: async
    requires_approval: true
    handler: tests.gateway.test_j6_crash_decided:note
  - name: gated_idem_sync
    description: An idempotent sync call behind the user's approval; notes its run.
    capability: t.crash
    idempotent: true
    requires_approval: true
    handler: tests.gateway.test_j6_crash_decided:note
"""


def note(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The handler of every tool here: it notes its run (the truth) and answers."""
    _note(ctx)
    return {"noted": ctx.call_id}


def decided_settings(tmp: Path) -> Any:
    """The settings of the killed server and of the next one (SQLite in ``tmp``)."""
    return crash_settings(tmp, TOOLS)


SERVER_SCRIPT = gateway_script("tests.gateway.test_j6_crash_decided:decided_settings")

SETTLED = (
    'toolbus_invocations_total{outcome="unavailable"}',
    'toolbus_invocations_total{outcome="ok"}',
    'toolbus_jobs_finished_total{state="done"}',
    'toolbus_jobs_finished_total{state="failed"}',
)
"""Samples of which one turns above zero once the allowed call (or its job) ended."""


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT) as answer:
        return str(answer.read().decode())


def _above_zero(text: str, samples: tuple[str, ...]) -> bool:
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in samples and float(value) > 0:
            return True
    return False


async def metric_above_zero(port: int, *samples: str) -> None:
    """Once one of ``samples`` (a metric's name and labels, SPEC O2) is above zero at
    the server on ``port`` (another process's state: polled, at most ``WAIT`` s)."""
    async with asyncio.timeout(WAIT):  # another process's state: polled
        while not _above_zero(await asyncio.to_thread(_metrics, port), samples):  # noqa: ASYNC110
            await asyncio.sleep(MS)


@asynccontextmanager
async def commits_failing(db: Path, p: Peer, port: int) -> AsyncIterator[None]:
    """SPEC D6: for the block, another process holds the lock of the SQLite file ``db``
    (:data:`~tests.gateway.store_faults.LOCKER`), and a commit of the server at ``port``
    has already failed: ``p``'s probe makes a flush journal its session row, and the
    commit that flush owes fails (``toolbus_store_commit_failures_total`` above 0)."""
    locker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LOCKER, str(db), stdin=PIPE, stdout=PIPE
    )
    try:
        assert locker.stdout is not None
        assert await locker.stdout.readline() == b"locked\n"
        await p.send({"type": "context.update", "id": "probe", "context": {}})
        await p.expect("context", id="probe")
        await metric_above_zero(port, "toolbus_store_commit_failures_total")
        yield
    finally:
        if locker.returncode is None:
            locker.kill()
        await locker.communicate()


async def _allowed_while_locked(
    tmp_path: Path, tool: str, hello: dict[str, Any]
) -> tuple[Peer, dict[str, Any]]:
    """On a server process of its own: invoke ``tool`` as `g1` (its ``tool_start`` is
    durable, D1), lock the SQLite file from another process until a commit has failed,
    allow `g1`, wait until the call (or its job) ended, then SIGKILL the server. Returns
    the peer (its session is resumed after the restart) and `g1`'s ``tool_start``."""
    db = decided_settings(tmp_path).data_dir / "toolbus.db"
    async with (
        script_server(SERVER_SCRIPT, str(tmp_path)) as first,
        peer_at(f"ws://127.0.0.1:{first.port}/", **hello) as p,
    ):
        await p.invoke("g1", tool, {})
        start = await p.expect("tool_start", call_id="g1")
        async with commits_failing(db, p, first.port):
            confirm = {"type": "tool.confirm", "approval_id": start["approval_id"]}
            await p.send({**confirm, "id": "r1", "decision": "allow"})
            assert (await p.expect("confirm.result", id="r1"))["accepted"] is True
            await metric_above_zero(first.port, *SETTLED)
            await first.crash()
    assert first.proc.returncode == -9
    return p, start


def _ledger(data_dir: Path, call_id: str) -> tuple[str, dict[str, Any] | None]:
    """``(state, outcome)`` of alice's committed ledger row of ``call_id``."""
    with sqlite3.connect(data_dir / "toolbus.db") as conn:
        row = conn.execute(
            "SELECT state, outcome FROM call_ledger WHERE call_id=?", (call_id,)
        ).fetchone()
    conn.close()
    assert row is not None, call_id
    return row[0], None if row[1] is None else orjson.loads(row[1])


def _said(message: dict[str, Any]) -> tuple[str, str, str]:
    return message["type"], message.get("code", ""), message.get("message", "")


@pytest.mark.parametrize(
    ("tool", "hello"),
    [
        ("gated_job", {}),
        ("idem_job", {"options": {"confirm_tool_calls": True}}),
        ("gated_plain_job", {}),
        ("gated_idem_sync", {}),
    ],
)
async def test_j6_a3_a_call_allowed_while_commits_fail_is_reported_as_what_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool: str, hello: dict[str, Any]
) -> None:
    """SPEC J6, A3, D6, I15: `g1` is allowed while the store cannot commit, then the
    server is SIGKILLed. Its handler must not have started (the decision was not
    durable), and the restart says so: the resumed session gets `tool.resolved`
    ``denied`` ``disconnected`` and ``call.error`` ``unavailable`` "it did not run", a
    re-send from another session of the principal the same, no job exists, the ledger
    row is ``done`` with that outcome, and nothing runs after the restart.

    Fails for an idempotent job (requires_approval, or the session's
    confirm_tool_calls) when its handler starts before the decision's commit
    succeeded: the handler runs and the restart says it did not. The plain job and the
    idempotent sync call are pins of the same guarantee (they fail if the start of the
    handler stops waiting for a commit: the job's ``running`` row, the decision)."""
    monkeypatch.delenv("TOOLBUS_STORE__URL", raising=False)
    settings = decided_settings(tmp_path)
    p, start = await _allowed_while_locked(tmp_path, tool, hello)
    ran = runs(settings.data_dir) == ["g1"]
    async with running(settings) as gw:
        async with peer(gw, **resume_fields(p, start["seq"]), **hello) as again:
            assert again.welcome["resumed"] is True
            seen = [m for m in await barrier(again) if "seq" in m]
            await again.send({"type": "job.list", "id": "jobs"})
            jobs = (await again.expect("jobs", id="jobs"))["jobs"]
        async with peer(gw, **hello) as other:
            await other.invoke("g1", tool, {})
            resent = await other.terminal("g1")
    said = [_said(m) for m in seen if m["type"] == "call.error"]
    # SPEC J6: never "it did not run" of a handler that ran.
    assert not (ran and ("call.error", "unavailable", UNSTARTED) in said), (ran, said)
    assert not ran, "the handler started before its decision was durable (SPEC A3)"
    assert [(m["type"], m["call_id"]) for m in seen] == [
        ("tool.resolved", "g1"),
        ("call.error", "g1"),
    ], seen
    assert (seen[0]["resolution"], seen[0]["reason"]) == ("denied", "disconnected")
    assert said == [("call.error", "unavailable", UNSTARTED)]
    assert _said(resent) == said[0]
    assert jobs == []
    state, outcome = _ledger(settings.data_dir, "g1")
    assert state == "done"
    assert outcome is not None
    assert outcome["message"] == UNSTARTED
    assert runs(settings.data_dir) == []
