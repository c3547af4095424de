"""A drain of the job runner: every job ends as what really happened (SPEC S4, J5, J6).

:class:`JobDrain` is :class:`~gateway.jobs.JobRunner`'s stop: once :meth:`JobDrain.run`
started, :attr:`JobDrain.draining` is ``True`` and the runner starts nothing new; the
running jobs are cancelled (coroutine handlers at once, plain handlers in worker threads
after a grace), and each ends through the runner's own cancellation path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from gateway.job_end import ActiveJob

logger = logging.getLogger("gateway.jobs")


class JobDrain:
    """Stops the active jobs for a drain (SPEC S4, J5, J6).

    Args:
        active: the runner's active jobs, by id (read, never changed here).
    """

    def __init__(self, active: Mapping[str, ActiveJob]) -> None:
        self._active = active
        self.draining = False
        """``True`` once a drain started: the runner starts no new job (SPEC S4, J6)."""

    async def run(self, deadline: float | None = None, patient: bool = False) -> None:
        """Stop for a drain (SPEC S4, J5, J6); every job ends as what really happened.

        Nothing new starts. A job still ``queued`` stays queued in the store and runs
        after the restart. A coroutine handler is cancelled at once: ``failed``
        ``interrupted`` (re-queued when its tool is idempotent). A plain handler, which a
        thread cannot interrupt, gets until ``deadline`` (event-loop time; ``None``: no
        wait) to return, and then ends as it returned (``done``, ``failed``); one still
        running past it ends ``failed`` ``interrupted`` and dies with the process.

        ``patient``: coroutine handlers get until ``deadline`` too (SPEC N6: a node
        drained in a rolling restart lets every job end as it would have, since its
        clients already resumed on other nodes and get the outcome there, N3).
        """
        self.draining = True
        running = [job for job in self._active.values() if job.task is not None]
        # Only handlers that started: a job whose start still waits for its group
        # commit (or, promoted, for its worker thread) is cancelled and left queued
        # (SPEC J6, ActiveJob.started).
        waited = [j for j in running if (patient or j.in_thread) and j.started]
        for job in running:
            if job not in waited:
                job.interrupted = True
                job.task.cancel()  # type: ignore[union-attr]
        loop = asyncio.get_running_loop()
        grace = 0.0 if deadline is None else deadline - loop.time()
        if waited and grace > 0:
            logger.info(
                "drain: waiting up to %.1f s for %d running job handler(s)",
                grace,
                len(waited),
            )
            await asyncio.wait([j.task for j in waited if j.task is not None], timeout=grace)
        for job in waited:
            if job.task is not None and not job.task.done():
                logger.warning(
                    "drain: job %s (%s) still running after the grace; reported interrupted",
                    job.row.job_id,
                    job.row.tool,
                )
                job.interrupted = True
                job.task.cancel()
        await asyncio.gather(*(j.task for j in running if j.task), return_exceptions=True)
