"""A drain that comes while a job's start waits for the turn's group commit leaves the
job queued, and it runs once after the restart (SPEC J6, S4; found in review).

Where a flush is a commit (here SQLite whose journal is a device, so the store opens
none; PostgreSQL alike), a job's ``running`` row is staged and its handler waits for
the turn's group commit (`JobRunner._execute`). In that window the row says
``running`` but the handler has not run: a drain used to report such a job
``interrupted`` ("the server restarted while this job ran") though it never ran, or,
for a plain handler and a drain grace, wait for it and let it start after the drain
began. The test drains in exactly that window: it looks at the job every loop turn,
and the window lasts at least until the next turn's flush.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gateway.store_journal import SUFFIX
from protocol import messages as m
from tests.gateway import ledger_tools as lt
from tests.gateway.store_faults import until
from tests.support import WAIT, peer, running


def _settings(tmp_path: Path, grace: float) -> Any:
    settings = lt.ledger_settings(
        tmp_path,
        server={"port": 0, "heartbeat_interval": 0, "drain_grace": grace},
        jobs={"max_concurrent": 1, "max_per_session": 2, "max_per_user": 2},
    )
    db = settings.data_dir / "toolbus.db"
    if not os.path.lexists(str(db) + SUFFIX):
        os.makedirs(db.parent, exist_ok=True)
        os.symlink("/dev/full", str(db) + SUFFIX)  # no usable journal: a flush commits
    return settings


def _state(db: Path, job_id: str) -> tuple[str, bytes | None]:
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT state, error FROM jobs WHERE job_id=?", (job_id,)).fetchone()
    conn.close()
    return row[0], row[1]


async def _drained_in_the_window(tmp_path: Path, tool: str, grace: float) -> str:
    """A first job holds the one slot; ``tool`` (job `j1`) waits for it, queued. The
    first is released; the drain comes in the turn that finds `j1` staged `running`
    with its handler not yet run. Returns `j1`'s job id."""
    gate = lt.reset()
    settings = _settings(tmp_path, grace)
    async with running(settings) as gw, peer(gw) as p:
        assert not gw.store.journals
        await p.invoke("w1", "good_job")
        await p.terminal("w1")
        await p.invoke("j1", tool)
        job_id = (await p.terminal("j1"))["job_id"]
        assert gw.jobs.active[job_id].row.state == m.JobState.QUEUED
        gate.jobs.set()
        async with asyncio.timeout(WAIT):
            # Looked at once per loop turn (ASYNC110): the window may last one turn only.
            while gw.jobs.active[job_id].row.state != m.JobState.RUNNING:  # noqa: ASYNC110
                await asyncio.sleep(0)
        assert not gw.jobs.active[job_id].started
        assert lt.runs(settings.data_dir) == []
        await gw.drain()
    return job_id


@pytest.mark.parametrize(("tool", "grace"), [("mark_job", 0.0), ("mark_job_plain", 5.0)])
async def test_j6_a_drain_while_a_start_waits_for_its_commit_leaves_the_job_queued(
    tmp_path: Path, tool: str, grace: float
) -> None:
    """The job is left `queued` (not `failed` `interrupted`), its handler never ran (a
    plain one is not waited for and gets no thread), and after the restart it runs,
    once."""
    job_id = await _drained_in_the_window(tmp_path, tool, grace)
    settings = _settings(tmp_path, grace)
    db = settings.data_dir / "toolbus.db"
    assert lt.runs(settings.data_dir) == []
    assert _state(db, job_id) == ("queued", None)
    async with running(settings):
        await until(lambda: _state(db, job_id)[0] == "done", "the job to run after the restart")
    assert lt.runs(settings.data_dir) == ["j1"]
