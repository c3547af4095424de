"""The jobs a restart cut off, settled at start-up (SPEC J5, J6, M2).

:meth:`JobRecovery.settle` runs each unfinished job again when that is safe (it never
started, or its tool is idempotent) and otherwise ends it ``failed``, saying what really
happened: ``interrupted`` if it had started, ``not_started`` if it had not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gateway.jobs import INTERRUPTED, JobRunner, Rerun
from gateway.session import Session
from gateway.store import JobRow, Store
from protocol import messages as m

NOT_STARTED = {
    "code": "not_started",
    "message": "the server restarted before this job started; it did not run",
}
"""SPEC J6: a queued job that cannot run after a restart (its session or tool is gone)."""


class JobRecovery:
    """Settles stored unfinished jobs (SPEC J5, J6).

    Args:
        store: where the unfinished jobs are read and their ends staged.
        runner: runs the jobs that may run again, under their own ids.
        clock: Unix time in seconds.
    """

    def __init__(self, store: Store, runner: JobRunner, clock: Callable[[], float]) -> None:
        self._store = store
        self._runner = runner
        self._clock = clock

    def settle(
        self,
        sessions: dict[str, Session],
        rerun: Rerun,
        hold: Callable[[JobRow], bool] | None = None,
        rows: list[JobRow] | None = None,
    ) -> tuple[int, list[JobRow]]:
        """Settle the jobs a restart cut off (SPEC J5, J6), oldest first.

        A job that never started (``queued``) runs now, whatever its tool. A job that had
        started runs again only when its tool is ``idempotent``; otherwise it ends
        ``failed`` ``interrupted``. A job that cannot run (its session expired, its tool
        left the catalog) ends ``failed``: ``interrupted`` if it had started, else
        ``not_started``, so no job is reported as what did not happen.

        Args:
            sessions: the sessions now in memory, by id.
            rerun: returns ``(tool, ctx, post)`` to run a stored job, or ``None``.
            hold: for a job whose tool is not in the catalog yet, whether it may still
                come (a mounted MCP server not connected yet, SPEC M2): such a job is
                left as stored and returned, to be settled by a later call.
            rows: the jobs to settle; default: every unfinished job in the store.

        Returns:
            ``(found, held)``: how many jobs were found unfinished, and those held.
        """
        count = 0
        held: list[JobRow] = []
        found = self._store.unfinished_jobs() if rows is None else rows
        for row in sorted(found, key=lambda r: r.created_at):
            count += 1
            session = sessions.get(row.session_id)
            plan = rerun(row) if session is not None else None
            if session is not None and plan is None and hold is not None and hold(row):
                held.append(row)
                continue
            started = row.state != m.JobState.QUEUED
            if session is not None and plan is not None and (plan[0].idempotent or not started):
                tool, ctx, post = plan
                self._runner.submit(session, tool, row.params, ctx, post, rerun=row)
                continue
            error = INTERRUPTED if started else NOT_STARTED
            now = self._clock()
            summary = f"{row.tool} failed: {error['message']}"
            failed = replace(
                row, state=m.JobState.FAILED, finished_at=now, summary=summary, error=error
            )
            self._store.stage_job(failed)
            if session is not None:
                session.emit(
                    m.JobFailed(
                        job_id=row.job_id,
                        tool=row.tool,
                        call_id=row.call_id,
                        summary=summary,
                        error=m.JobError(**error),
                        finished_at=now,
                    )
                )
        return count, held
