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
import inspect
import logging
import secrets
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from catalog.model import ToolDef
from gateway.authority import Lapse
from gateway.config import JobsConfig
from gateway.context import ToolContext
from gateway.execute import as_object, run_handler
from gateway.failures import ToolFailure, describe
from gateway.framesize import ENVELOPE, clip_text, too_deep
from gateway.metrics import Metrics
from gateway.session import Session
from gateway.store import JobRow, Store
from gateway.workers import Lane
from protocol import messages as m
from protocol.codec import SERVER_MAX_DEPTH, encode, encode_json, json_problem

logger = logging.getLogger("gateway.jobs")

PostProcess = Callable[[dict[str, Any]], Awaitable[tuple[dict[str, Any], bool]]]
Rerun = Callable[["JobRow"], "tuple[ToolDef, ToolContext, PostProcess] | None"]
Clock = Callable[[], float]

INTERRUPTED = {"code": "interrupted", "message": "the server restarted while this job ran"}
NOT_STARTED = {
    "code": "not_started",
    "message": "the server restarted before this job started; it did not run",
}
"""SPEC J6: a queued job that cannot run after a restart (its session or tool is gone)."""


@dataclass(slots=True, eq=False)
class ActiveJob:
    row: JobRow
    session: Session
    task: asyncio.Task[None] | None = None
    last_progress: float = 0.0
    interrupted: bool = False
    idempotent: bool = False
    in_thread: bool = False
    """Its handler is plain and runs in a worker thread, which cannot be interrupted."""


@dataclass(slots=True)
class _Bound:
    """One session's or user's job bound (SPEC J1, E3), alive only while some job of theirs
    holds or awaits it."""

    semaphore: asyncio.Semaphore
    holders: int = 0


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


def _unsendable(
    row: JobRow,
    summary: str,
    artifacts: list[Any],
    result: dict[str, Any],
    now: float,
    max_frame: int | None = None,
) -> str | None:
    """What stops a job's ``job.done`` from being built and encoded, or ``None`` (I16);
    a frame over ``max_frame`` bytes (the announced ``max_message_bytes``, SPEC E2) too."""
    try:
        frame = encode(
            m.JobDone(
                seq=1,
                job_id=row.job_id,
                tool=row.tool,
                call_id=row.call_id,
                summary=summary,
                artifacts=artifacts,
                result=result,
                finished_at=now,
            )
        )
    except (TypeError, ValueError) as exc:
        found = json_problem(result) or json_problem(artifacts, "artifacts")
        return found or " ".join(str(exc).split())[:300]
    if max_frame is not None and len(frame) > max_frame:
        return f"job.done would be {len(frame)} bytes; at most {max_frame} fit"
    if too_deep(result, SERVER_MAX_DEPTH - 1) or too_deep(artifacts, SERVER_MAX_DEPTH - 1):
        # SPEC I16: a client drops a frame nested past SERVER_MAX_DEPTH levels.
        return f"result is nested deeper than {SERVER_MAX_DEPTH - 1} levels"
    return None


class JobRunner:
    """Bounded-concurrency job runner (SPEC J1).

    Args:
        store: where job rows live.
        config: bounds, progress interval, retention.
        metrics: the server's metrics.
        pool: the worker lane for plain job handlers (SPEC E3).
        clock: Unix time in seconds.
        max_frame: largest ``job.done`` frame in bytes (``max_message_bytes``, SPEC E2);
            a bigger one fails the job ``handler_error``. ``None``: no bound.
    """

    def __init__(
        self,
        store: Store,
        config: JobsConfig,
        metrics: Metrics,
        pool: Lane,
        clock: Clock,
        max_frame: int | None = None,
    ) -> None:
        self._store = store
        self._max_frame = max_frame
        self._config = config
        self._metrics = metrics
        self._pool = pool
        self._clock = clock
        self._global = asyncio.Semaphore(config.max_concurrent)
        self._per_session: dict[str, _Bound] = {}
        self._per_user: dict[tuple[str | None, str], _Bound] = {}
        self._draining = False
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
        job.in_thread = adopt is not None and not inspect.iscoroutinefunction(tool.func)
        ctx = replace(ctx, job_id=job_id, progress=self._progress_sink(job))
        self._save(job, row)
        if self._draining and adopt is None:
            # SPEC S4, J6: a drain starts nothing; stored queued, the job runs after the
            # restart.
            return job_id
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

    @asynccontextmanager
    async def _slot(self, table: dict[Any, _Bound], key: Any, limit: int) -> AsyncIterator[None]:
        """Hold one of ``key``'s job slots in ``table`` (SPEC J1, E3). The entry is deleted
        when no job of ``key`` holds or awaits it, so ended sessions leave nothing (F33)."""
        entry = table.get(key)
        if entry is None:
            entry = table[key] = _Bound(asyncio.Semaphore(limit))
        entry.holders += 1
        try:
            async with entry.semaphore:
                yield
        finally:
            entry.holders -= 1
            if not entry.holders:
                del table[key]

    def tracked(self) -> dict[str, int]:
        """Entries held now (case F33): session job bounds, active jobs, progress notes."""
        return {
            "job_session_bounds": len(self._per_session),
            "job_user_bounds": len(self._per_user),
            "jobs_active": len(self.active),
            "job_progress": len(self._progress),
        }

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
                # SPEC J1, E3: the session's bound, then its user's (so a user with many
                # sessions cannot take every slot), then the server's.
                user = (job.session.tenant, job.session.user)
                async with (
                    self._slot(self._per_session, job.session.id, self._config.max_per_session),
                    self._slot(self._per_user, user, self._config.max_per_user),
                    self._global,
                ):
                    value = await self._execute(job, tool, params, ctx)
            result, _ = await post(as_object(value))
            self._finish_done(job, result)
        except asyncio.CancelledError:
            ctx.cancelled.set()
            if job.interrupted and job.row.state == m.JobState.QUEUED:
                # SPEC J6: it never started. Stored queued, it runs after the restart.
                pass
            elif job.interrupted and job.idempotent:
                # SPEC J5: left queued in the store; the next start runs it again.
                self._save(job, replace(job.row, state=m.JobState.QUEUED, started_at=None))
            elif job.interrupted:
                self._finish_failed(job, INTERRUPTED)
            else:
                self._finish_cancelled(job)
            raise
        except TimeoutError:
            self._finish_failed(job, {"code": "timeout", "message": f"{tool.name} timed out"})
        except Lapse as lapse:
            # SPEC A7: a gate failed after the queue wait; the handler never ran.
            self._finish_failed(job, {"code": lapse.code.value, "message": lapse.message})
        except ToolFailure as failure:
            # SPEC M2, M3: a typed failure keeps its code and its exact text.
            self._finish_failed(job, {"code": failure.code.value, "message": failure.message})
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # SPEC I16: any other raise ends the job failed
            logger.info("job %s failed: %s", job.row.job_id, type(exc).__name__, exc_info=True)
            self._finish_failed(job, {"code": "handler_error", "message": describe(exc)})
        finally:
            self.active.pop(job.row.job_id, None)
            self._progress.pop(job.row.job_id, None)

    async def _execute(
        self, job: ActiveJob, tool: ToolDef, params: dict[str, Any], ctx: ToolContext
    ) -> Any:
        """Run the handler; the job turns ``running`` only once the handler really starts,
        after the wait for a worker thread (SPEC J6), and its timeout counts from then."""
        func = tool.func
        assert func is not None
        limit = tool.timeout if tool.timeout and not tool.long_running else None

        def started() -> None:
            job.in_thread = not inspect.iscoroutinefunction(func)
            self._save(job, replace(job.row, state=m.JobState.RUNNING, started_at=self._clock()))

        return await run_handler(func, params, ctx, self._pool, limit, on_start=started)

    def _finish_done(self, job: ActiveJob, result: dict[str, Any]) -> None:
        summary = result.pop("summary", None)
        artifacts = result.pop("artifacts", [])
        if not isinstance(summary, str):
            summary = f"{job.row.tool} finished"
        if not isinstance(artifacts, list) or not all(isinstance(a, dict) for a in artifacts):
            artifacts = []
        now = self._clock()
        problem = _unsendable(job.row, summary, artifacts, result, now, self._max_frame)
        if problem is not None:
            # SPEC I16: found before anything is staged, so the value never reaches the
            # store and cannot fail a commit that other sessions' events share (D6).
            logger.info("job %s returned a value that cannot be sent: %s", job.row.job_id, problem)
            message = f"the handler's value cannot be sent: {problem}"
            self._finish_failed(job, {"code": "handler_error", "message": message})
            return
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
        if self._max_frame is not None:
            # SPEC E2: the text appears twice (summary and error.message); each gets
            # half of what the frame leaves besides the ids.
            ids = len(encode_json([job.row.job_id, job.row.tool, job.row.call_id]))
            half = (self._max_frame - ENVELOPE - ids) // 2 - len(job.row.tool) - 16
            error = {**error, "message": clip_text(str(error["message"]), half)}
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
        if isinstance(message, str) and self._max_frame is not None:
            # SPEC E2: a handler's progress text must not make job.progress (or the job
            # reply of job.get, which carries it too) larger than max_message_bytes.
            ids = len(encode_json([job.row.job_id, job.row.tool, job.row.call_id]))
            message = clip_text(message, self._max_frame - ENVELOPE - ids)
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
        """Settle the jobs a restart cut off (SPEC J5, J6), oldest first.

        A job that never started (``queued``) runs now, whatever its tool. A job that had
        started runs again only when its tool is ``idempotent``; otherwise it ends
        ``failed`` ``interrupted``. A job that cannot run (its session expired, its tool
        left the catalog) ends ``failed``: ``interrupted`` if it had started, else
        ``not_started``, so no job is reported as what did not happen.

        Args:
            sessions: the sessions now in memory, by id.
            rerun: returns ``(tool, ctx, post)`` to run a stored job, or ``None``.

        Returns:
            How many jobs were found unfinished.
        """
        count = 0
        for row in sorted(self._store.unfinished_jobs(), key=lambda r: r.created_at):
            count += 1
            session = sessions.get(row.session_id)
            plan = rerun(row) if session is not None else None
            started = row.state != m.JobState.QUEUED
            if session is not None and plan is not None and (plan[0].idempotent or not started):
                tool, ctx, post = plan
                self.submit(session, tool, row.params, ctx, post, rerun=row)
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
                    m.JobFailed,
                    job_id=row.job_id,
                    tool=row.tool,
                    call_id=row.call_id,
                    summary=summary,
                    error=m.JobError(**error),
                    finished_at=now,
                )
        return count

    async def shutdown(self, deadline: float | None = None) -> None:
        """Stop for a drain (SPEC S4, J5, J6); every job ends as what really happened.

        Nothing new starts. A job still ``queued`` stays queued in the store and runs
        after the restart. A coroutine handler is cancelled at once: ``failed``
        ``interrupted`` (re-queued when its tool is idempotent). A plain handler, which a
        thread cannot interrupt, gets until ``deadline`` (event-loop time; ``None``: no
        wait) to return, and then ends as it returned (``done``, ``failed``); one still
        running past it ends ``failed`` ``interrupted`` and dies with the process.
        """
        self._draining = True
        running = [job for job in self.active.values() if job.task is not None]
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
