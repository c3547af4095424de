"""The in-process job runner (SPEC J1-J5, I9, I14).

A job runs an async tool (or a sync call promoted past its soft deadline) in the
background: ``queued`` until a slot is free under both the global and the per-session
bound, then ``running``, then ``done`` | ``failed`` | ``cancelled``. Every state change
is staged in the store before the matching event is emitted, and the outbox commits
before it sends, so a job's final state is durable before the client hears of it
(SPEC J5). Events go to the session that created the job, into its log, whether or not
a socket is attached (SPEC D1).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from catalog.model import ToolDef
from gateway.config import JobsConfig
from gateway.context import ToolContext
from gateway.execute import as_object, run_handler
from gateway.metrics import Metrics
from gateway.session import Session
from gateway.store import JobRow, Store
from protocol import messages as m

logger = logging.getLogger("gateway.jobs")

PostProcess = Callable[[dict[str, Any]], Awaitable[tuple[dict[str, Any], bool]]]
Rerun = Callable[["JobRow"], "tuple[ToolDef, ToolContext, PostProcess] | None"]
Clock = Callable[[], float]

INTERRUPTED = {"code": "interrupted", "message": "the server restarted while this job ran"}


@dataclass(slots=True, eq=False)
class ActiveJob:
    row: JobRow
    session: Session
    task: asyncio.Task[None] | None = None
    last_progress: float = 0.0
    interrupted: bool = False
    idempotent: bool = False


def job_info(row: JobRow, progress: tuple[float | None, str | None] = (None, None)) -> m.JobInfo:
    """The wire view of a stored job (SPEC J3)."""
    error = m.JobError(**row.error) if row.error else None
    return m.JobInfo(
        job_id=row.job_id,
        tool=row.tool,
        state=m.JobState(row.state),
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        progress=progress[0],
        progress_message=progress[1],
        summary=row.summary,
        artifacts=row.artifacts,
        result=row.result,
        error=error,
        call_id=row.call_id,
    )


class JobRunner:
    """Bounded-concurrency job runner (SPEC J1).

    Args:
        store: where job rows live.
        config: bounds, progress interval, retention.
        metrics: the server's metrics.
        pool: the worker threads for plain handlers.
        clock: Unix time in seconds.
    """

    def __init__(
        self,
        store: Store,
        config: JobsConfig,
        metrics: Metrics,
        pool: ThreadPoolExecutor,
        clock: Clock,
    ) -> None:
        self._store = store
        self._config = config
        self._metrics = metrics
        self._pool = pool
        self._clock = clock
        self._global = asyncio.Semaphore(config.max_concurrent)
        self._per_session: dict[str, asyncio.Semaphore] = {}
        self.active: dict[str, ActiveJob] = {}
        self._progress: dict[str, tuple[float | None, str | None]] = {}

    def submit(
        self,
        session: Session,
        tool: ToolDef,
        params: dict[str, Any],
        ctx: ToolContext,
        post: PostProcess,
        adopt: asyncio.Future[Any] | None = None,
        rerun: JobRow | None = None,
    ) -> str:
        """Create a job and start it (SPEC I9, I14), or re-run a stored one (SPEC J5).

        Args:
            session: the creating session; job events go to its log.
            tool: the tool to run.
            params: validated arguments.
            ctx: the call's context; its ``job_id`` and ``progress`` are filled here.
            post: post-execute hooks, applied to the result object (SPEC I10).
            adopt: an already-running handler future (a promoted sync call) to finish
                instead of starting the handler again.
            rerun: a stored job a restart cut off, to run again under its own id.

        Returns:
            The job id.
        """
        now = self._clock()
        job_id = rerun.job_id if rerun else "job_" + secrets.token_urlsafe(12)
        row = (
            replace(rerun, state=m.JobState.QUEUED, started_at=None)
            if rerun
            else JobRow(
                job_id=job_id,
                tool=tool.name,
                state=m.JobState.RUNNING if adopt else m.JobState.QUEUED,
                session_id=session.id,
                user=session.user,
                tenant=session.tenant,
                profile=session.profile.name,
                call_id=ctx.call_id,
                params=params,
                context=dict(session.context),
                created_at=now,
                started_at=now if adopt else None,
                finished_at=None,
                summary=None,
                artifacts=[],
                result=None,
                error=None,
            )
        )
        job = ActiveJob(row, session, idempotent=tool.idempotent and adopt is None)
        ctx = replace(ctx, job_id=job_id, progress=self._progress_sink(job))
        self._save(job, row)
        self.active[job_id] = job
        job.task = asyncio.get_running_loop().create_task(
            self._run(job, tool, params, ctx, post, adopt)
        )
        return job_id

    def _save(self, job: ActiveJob, row: JobRow) -> None:
        old = job.row.state
        job.row = row
        self._store.stage_job(row)
        if old != row.state:
            self._metrics.jobs.labels(old).dec()
        self._metrics.jobs.labels(row.state).inc()

    def _semaphore(self, session_id: str) -> asyncio.Semaphore:
        sem = self._per_session.get(session_id)
        if sem is None:
            sem = self._per_session[session_id] = asyncio.Semaphore(self._config.max_per_session)
        return sem

    async def _run(
        self,
        job: ActiveJob,
        tool: ToolDef,
        params: dict[str, Any],
        ctx: ToolContext,
        post: PostProcess,
        adopt: asyncio.Future[Any] | None,
    ) -> None:
        try:
            if adopt is not None:
                value = await adopt
            else:
                async with self._semaphore(job.session.id), self._global:
                    self._save(
                        job, replace(job.row, state=m.JobState.RUNNING, started_at=self._clock())
                    )
                    value = await self._execute(tool, params, ctx)
            result, _ = await post(as_object(value))
            self._finish_done(job, result)
        except asyncio.CancelledError:
            ctx.cancelled.set()
            if job.interrupted and job.idempotent:
                # SPEC J5: left queued in the store; the next start runs it again.
                self._save(job, replace(job.row, state=m.JobState.QUEUED, started_at=None))
            elif job.interrupted:
                self._finish_failed(job, INTERRUPTED)
            else:
                self._finish_cancelled(job)
            raise
        except TimeoutError:
            self._finish_failed(job, {"code": "timeout", "message": f"{tool.name} timed out"})
        except Exception as exc:
            logger.info("job %s failed: %s", job.row.job_id, type(exc).__name__, exc_info=True)
            self._finish_failed(
                job, {"code": "handler_error", "message": f"{type(exc).__name__}: {exc}"}
            )
        finally:
            self.active.pop(job.row.job_id, None)
            self._progress.pop(job.row.job_id, None)

    async def _execute(self, tool: ToolDef, params: dict[str, Any], ctx: ToolContext) -> Any:
        assert tool.func is not None
        limit = tool.timeout if tool.timeout and not tool.long_running else None
        async with asyncio.timeout(limit):
            return await run_handler(tool.func, params, ctx, self._pool)

    def _finish_done(self, job: ActiveJob, result: dict[str, Any]) -> None:
        summary = result.pop("summary", None)
        artifacts = result.pop("artifacts", [])
        if not isinstance(summary, str):
            summary = f"{job.row.tool} finished"
        if not isinstance(artifacts, list) or not all(isinstance(a, dict) for a in artifacts):
            artifacts = []
        now = self._clock()
        row = replace(
            job.row,
            state=m.JobState.DONE,
            finished_at=now,
            summary=summary,
            artifacts=artifacts,
            result=result,
        )
        self._end(job, row)
        self._emit(
            job, m.JobDone, summary=summary, artifacts=artifacts, result=result, finished_at=now
        )

    def _finish_failed(self, job: ActiveJob, error: dict[str, Any]) -> None:
        now = self._clock()
        summary = f"{job.row.tool} failed: {error['message']}"
        row = replace(
            job.row, state=m.JobState.FAILED, finished_at=now, summary=summary, error=error
        )
        self._end(job, row)
        self._emit(job, m.JobFailed, summary=summary, error=m.JobError(**error), finished_at=now)

    def _finish_cancelled(self, job: ActiveJob) -> None:
        now = self._clock()
        summary = f"{job.row.tool} was cancelled"
        self._end(
            job, replace(job.row, state=m.JobState.CANCELLED, finished_at=now, summary=summary)
        )
        self._emit(job, m.JobCancelled, summary=summary, finished_at=now)

    def _end(self, job: ActiveJob, row: JobRow) -> None:
        self._save(job, row)
        self._metrics.jobs.labels(row.state).dec()
        self._metrics.jobs_finished.labels(row.state).inc()

    def _emit(self, job: ActiveJob, cls: type[Any], **fields: Any) -> None:
        if not job.session.ended:
            job.session.emit(
                cls, job_id=job.row.job_id, tool=job.row.tool, call_id=job.row.call_id, **fields
            )

    def _progress_sink(self, job: ActiveJob) -> Callable[[float | None, str | None], None]:
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()

        def progress(fraction: float | None, message: str | None = None) -> None:
            if threading.get_ident() == loop_thread:
                self._on_progress(job, fraction, message)
            else:
                loop.call_soon_threadsafe(self._on_progress, job, fraction, message)

        return progress

    def _on_progress(self, job: ActiveJob, fraction: float | None, message: str | None) -> None:
        """Emit ``job.progress`` at most once per interval per job (SPEC J2)."""
        if job.row.job_id not in self.active:
            return
        if fraction is not None:
            fraction = min(1.0, max(0.0, float(fraction)))
        self._progress[job.row.job_id] = (fraction, message)
        now = self._clock()
        if now - job.last_progress < self._config.progress_interval:
            return
        job.last_progress = now
        self._emit(job, m.JobProgress, progress=fraction, message=message)

    def progress_sink(self, job_id: str) -> Callable[[float | None, str | None], None]:
        """The ``progress(fraction, message)`` function of an active job (SPEC J2, I14)."""
        return self._progress_sink(self.active[job_id])

    def progress_of(self, job_id: str) -> tuple[float | None, str | None]:
        return self._progress.get(job_id, (None, None))

    def cancel(self, job_id: str) -> asyncio.Task[None] | None:
        """Cancel an active job (SPEC J3).

        Returns:
            The job's task, done once the ``cancelled`` state is stored and its event
            emitted; ``None`` when the job is not running here.
        """
        job = self.active.get(job_id)
        if job is None or job.task is None:
            return None
        job.task.cancel()
        return job.task

    def recover(self, sessions: dict[str, Session], rerun: Rerun) -> int:
        """Settle the jobs a restart cut off (SPEC J5): re-run those whose tool is marked
        idempotent (when ``rerun`` gives a plan for them), report the rest failed.

        Args:
            sessions: the sessions now in memory, by id.
            rerun: returns ``(tool, ctx, post)`` to run a stored job again, or ``None``.

        Returns:
            How many jobs were found unfinished.
        """
        count = 0
        for row in self._store.unfinished_jobs():
            count += 1
            session = sessions.get(row.session_id)
            plan = rerun(row) if session is not None else None
            if session is not None and plan is not None:
                tool, ctx, post = plan
                self.submit(session, tool, row.params, ctx, post, rerun=row)
                continue
            now = self._clock()
            summary = f"{row.tool} failed: {INTERRUPTED['message']}"
            failed = replace(
                row, state=m.JobState.FAILED, finished_at=now, summary=summary, error=INTERRUPTED
            )
            self._store.stage_job(failed)
            session = sessions.get(row.session_id)
            if session is not None:
                session.emit(
                    m.JobFailed,
                    job_id=row.job_id,
                    tool=row.tool,
                    call_id=row.call_id,
                    summary=summary,
                    error=m.JobError(**INTERRUPTED),
                    finished_at=now,
                )
        return count

    async def shutdown(self) -> None:
        """Stop every active job for a drain (SPEC S4, J5): each ends ``failed``
        (interrupted), stored and logged for its session before the process exits."""
        tasks = []
        for job in self.active.values():
            if job.task is not None:
                job.interrupted = True
                job.task.cancel()
                tasks.append(job.task)
        await asyncio.gather(*tasks, return_exceptions=True)
