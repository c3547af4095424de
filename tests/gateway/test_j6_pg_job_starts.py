"""Jobs that start in one loop turn share one commit on PostgreSQL (SPEC J5, J6, N1;
issue 13, P5 on PostgreSQL).

A job's ``running`` row is durable before a handler with side effects starts. On SQLite
that is a journal append (one ``write(2)``); on PostgreSQL it was a commit of its own,
one round trip each made on the event loop, so a thousand jobs dispatched together
held the loop for a thousand commits. Each start now waits for the turn's flush, which
commits for all of them. Checked on a real PostgreSQL: the write transactions the
cluster assigned (``pg_current_snapshot()``'s ``xmax``) while a burst of jobs started.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.gateway import ledger_tools as lt
from tests.pg_support import admin, fresh_schema
from tests.support import WAIT, peer, running

JOBS = 32

XMAX = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
"""The next transaction id the cluster will assign; a read takes none."""


async def _start_burst(tmp_path: Path) -> tuple[int, list[int], str]:
    """``JOBS`` ``held_job`` invokes in one TCP write; returns the transaction ids
    assigned from before the write until every handler started, what each handler saw
    queued (one entry per start), and the store's class name."""
    gate = lt.reset()
    gate.expected = JOBS
    settings = lt.jobs_at_once(tmp_path, JOBS)
    async with running(settings) as gw, peer(gw, options={"tool_start": "gated"}) as p:
        gate.outbox = gw.outbox
        with admin() as db:
            before = db.execute(XMAX).fetchone()
            lt.invoke_in_one_write(p.ws, "held_job", [f"j{n}" for n in range(JOBS)])
            dispatched = [await p.terminal(f"j{n}") for n in range(JOBS)]
            async with asyncio.timeout(WAIT):
                await gate.all_started.wait()
            after = db.execute(XMAX).fetchone()
        gate.jobs.set()
        done = [await p.expect("job.done") for _ in range(JOBS)]
        store = type(gw.store).__name__
    assert [m["type"] for m in dispatched] == ["dispatched"] * JOBS
    assert sorted(m["job_id"] for m in done) == sorted(m["job_id"] for m in dispatched)
    assert before is not None
    assert after is not None
    return after[0] - before[0], gate.queued, store


async def test_j6_on_postgresql_jobs_started_in_one_turn_share_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thirty-two jobs start with at most a few write transactions (the flushes that sent
    their `dispatched` and made their starts durable, perhaps a lease renewal), not
    one commit per start."""
    with fresh_schema() as url:
        monkeypatch.setenv("TOOLBUS_STORE__URL", url)
        assigned, queued, store = await _start_burst(tmp_path)
    assert store == "PgStore"
    assert assigned <= JOBS // 4, assigned
    assert len(queued) == JOBS
