"""Jobs that end in one loop turn leave in bursts, not after the whole turn (SPEC D1,
J4; issue 13, P5; ``Outbox.flush_burst``).

A thousand job timers firing together wake a thousand job tasks in one loop turn; the
tick's flush runs only after all of them, so the first job's event waited for every
other job's end (P5 measured a p99 of 59 to 103 ms). A job task that has staged its
row and event flushes once :attr:`Outbox.BURST` frames are queued. Checked on a real
gateway: every handler notes how many frames were queued when it woke; all wake in one
turn (the queue grows) and it never reaches the burst size.
"""

from __future__ import annotations

from pathlib import Path

from gateway.outbox import Outbox
from tests.gateway import ledger_tools as lt
from tests.support import peer, running

JOBS = 3 * Outbox.BURST


async def test_d1_jobs_ending_in_one_turn_leave_in_bursts(tmp_path: Path) -> None:
    """Three bursts' worth of jobs released at once: their handlers run in one turn,
    and each sees the frames of the jobs that ended before it since the last burst's
    flush, so the queue goes up to `BURST - 1` and never further. Every `job.done`
    arrives once, in order, with gap-free seqs."""
    gate = lt.reset()
    settings = lt.ledger_settings(
        tmp_path,
        jobs={"max_concurrent": JOBS, "max_per_session": JOBS, "max_per_user": JOBS},
        limits={"invoke_burst": JOBS},
    )
    async with running(settings) as gw, peer(gw, options={"tool_start": "gated"}) as p:
        gate.outbox = gw.outbox
        job_ids = []
        for n in range(JOBS):
            await p.invoke(f"b{n}", "burst_job")
            job_ids.append((await p.terminal(f"b{n}"))["job_id"])
        gate.jobs.set()
        done = [await p.expect("job.done") for _ in range(JOBS)]
    assert [m["job_id"] for m in done] == job_ids
    seqs = [m["seq"] for m in done]
    assert seqs == list(range(seqs[0], seqs[0] + JOBS))
    assert gate.queued == [n % Outbox.BURST for n in range(JOBS)]
