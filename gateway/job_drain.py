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
from protocol import messages as m

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

    async def run(self, deadline: float | None = None) -> None:
        """Stop for a drain (SPEC S4, J5, J6); every job ends as what really happened.

        Nothing new starts. A job still ``queued`` stays queued in the store and runs
        after the restart. A coroutine handler is cancelled at once: ``failed``
        ``interrupted`` (re-queued when its tool is idempotent). A plain handler, which a
        thread cannot interrupt, gets until ``deadline`` (event-loop time; ``None``: no
        wait) to return, and then ends as it returned (``done``, ``failed``); one still
        running past it ends ``failed`` ``interrupted`` and dies with the process.
        """
        self.draining = True
        running = [job for job in self._active.values() if job.task is not None]
        threaded = [j for j in running if j.in_thread and j.row.state == m.JobState.RUNNING]
        for job in running:
            if job not in threaded:
                job.interrupted = True
                job.task.cancel()  # type: ignore[union-attr]
        loop = asyncio.get_running_loop()
        grace = 0.0 if deadline is None else deadline - loop.time()
        if threaded and grace > 0:
            logger.info(
                "drain: waiting up to %.1f s for %d job handler(s) in worker threads",
                grace,
                len(threaded),
            )
            await asyncio.wait([j.task for j in threaded if j.task is not None], timeout=grace)
        for job in threaded:
            if job.task is not None and not job.task.done():
                logger.warning(
                    "drain: job %s (%s) still running after the grace; reported interrupted",
                    job.row.job_id,
                    job.row.tool,
                )
                job.interrupted = True
                job.task.cancel()
        await asyncio.gather(*(j.task for j in running if j.task), return_exceptions=True)
