"""The in-process job runner (SPEC J1-J5, I9, I14).

A job runs an async tool (or a sync call promoted past its soft deadline) in the
background: ``queued`` until a slot is free under the per-session, per-user and global
bounds, then ``running``, then ``done`` | ``failed`` | ``cancelled``. A promoted call
takes its slots at once, even past a bound (its handler runs already), and holds them
until its handler returns (:class:`~gateway.job_slots.JobSlots`). Every state change
is staged in the store before the matching event is emitted, and the outbox commits
before it sends, so a job's final state is durable before the client hears of it
(SPEC J5): :class:`~gateway.job_end.JobEnd` does both, in that order. Progress notes are
:class:`~gateway.job_progress.JobProgress`'s; a drain is
:class:`~gateway.job_drain.JobDrain`'s; the jobs a restart cut off are settled by
:class:`~gateway.job_recovery.JobRecovery`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from catalog.model import ToolDef
from gateway.authority import Lapse
from gateway.config import JobsConfig
from gateway.context import ProgressRelay, ToolContext
from gateway.execute import Start, as_object, run_handler
from gateway.failures import ToolFailure, describe
from gateway.job_drain import JobDrain
from gateway.job_end import ActiveJob, JobEnd
from gateway.job_progress import JobProgress
from gateway.job_slots import Claim, JobSlots
from gateway.metrics import Metrics
from gateway.session import Session
from gateway.store import JobRow, Store
from gateway.workers import Lane
from protocol import messages as m
from protocol.codec import decode_json, encode_json
from protocol.errors import ErrorCode

logger = logging.getLogger("gateway.jobs")

PostProcess = Callable[[dict[str, Any]], Awaitable[tuple[dict[str, Any], bool]]]
Rerun = Callable[["JobRow"], "tuple[ToolDef, ToolContext, PostProcess] | None"]
Clock = Callable[[], float]
Adopted = tuple[asyncio.Future[Any], Start]
"""A promoted sync call's handler (SPEC I14): its future and its start (``on_start``)."""
OnStart = Callable[[], Awaitable[None] | None]

NOT_DURABLE = "the store cannot commit right now; the tool did not run"
"""The ``unavailable`` failure of a job whose ``running`` row could not be made durable."""

INTERRUPTED = {"code": "interrupted", "message": "the server restarted while this job ran"}
"""SPEC J5: a job that had started when the server stopped, and does not run again."""


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
        self._pool = pool
        self._clock = clock
        self._slots = JobSlots(config)
        self.active: dict[str, ActiveJob] = {}
        self._drain = JobDrain(self.active)
        self._end = JobEnd(store, metrics, clock, max_frame)
        self._progress = JobProgress(
            config.progress_interval, clock, self.active, self._end.emit, max_frame
        )

    def submit(
        self,
        session: Session,
        tool: ToolDef,
        params: dict[str, Any],
        ctx: ToolContext,
        post: PostProcess,
        adopt: Adopted | None = None,
        rerun: JobRow | None = None,
        unstarted: bool = False,
    ) -> str:
        """Create a job and start it (SPEC I9, I14), or re-run a stored one (SPEC J5).

        Args:
            session: the creating session; job events go to its log.
            tool: the tool to run.
            params: validated arguments.
            ctx: the call's context; its ``job_id`` and ``progress`` are filled here.
            post: post-execute hooks, applied to the result object (SPEC I10).
            adopt: the handler of a promoted sync call, to finish instead of starting it
                again. One still waiting for its worker thread is ``queued`` until it
                starts (SPEC J6: its :class:`~gateway.execute.Start` turns it
                ``running``); a drain leaves it queued.
            rerun: a stored job a restart cut off, to run again under its own id.
            unstarted: the call is marked not started (:attr:`ActiveJob.unstarted`).

        Returns:
            The job id.
        """
        now = self._clock()
        future, begun = (adopt[0], adopt[1].started) if adopt else (None, False)
        job_id = rerun.job_id if rerun else "job_" + secrets.token_urlsafe(12)
        row = (
            rerun.at_state(m.JobState.QUEUED, None)
            if rerun
            else JobRow(
                job_id=job_id,
                tool=tool.name,
                state=m.JobState.RUNNING if begun else m.JobState.QUEUED,
                session_id=session.id,
                user=session.user,
                tenant=session.tenant,
                profile=session.profile.name,
                call_id=ctx.call_id,
                params=params,
                context=dict(session.context),
                created_at=now,
                started_at=now if begun else None,
                finished_at=None,
                summary=None,
                artifacts=[],
                result=None,
                error=None,
            )
        )
        job = ActiveJob(row, session, idempotent=tool.idempotent and adopt is None)
        job.in_thread = begun and not inspect.iscoroutinefunction(tool.func)
        job.started, job.unstarted = begun, unstarted  # begun: a promoted handler runs
        if adopt and isinstance(ctx.progress, ProgressRelay):  # the handler's own context
            ctx.progress.target = self._progress.sink(job)
        ctx = replace(ctx, job_id=job_id, progress=self._progress.sink(job))
        self._end.save(job, row)
        if self._drain.draining and not begun:
            # SPEC S4, J6: a drain starts nothing; stored queued, the job runs after the
            # restart (an adopted handler waiting for its thread is stopped).
            if future is not None:
                future.cancel()
            return job_id
        if adopt and not begun:
            adopt[1].then = _starter(job, tool, self._end, self._clock)
        # SPEC J5, I16: the handler gets its own copy of the arguments, so whatever it
        # does to them (e.g. puts a set in) never changes the job row staged again later.
        own = params if adopt is not None else decode_json(encode_json(params))
        self.active[job_id] = job
        job.task = asyncio.get_running_loop().create_task(
            self._run(job, tool, own, ctx, post, future, adopt[1].returned if adopt else None)
        )
        job.task.add_done_callback(lambda task: self._reap(job, ctx, future, task))
        return job_id

    def _reap(
        self,
        job: ActiveJob,
        ctx: ToolContext,
        adopt: asyncio.Future[Any] | None,
        task: asyncio.Task[None],
    ) -> None:
        """The job's task is done. A task cancelled before its first step never enters
        :meth:`_run` (no ``except``, no ``finally``): a ``job.cancel`` or a drain in
        the tick of the submit. The job still ends as what happened (SPEC J6:
        ``cancelled``, or left ``queued`` by a drain), an adopted handler is cancelled
        too, and its active entry and progress note are freed; it never took a slot
        (SPEC E3, case F33). A no-op when :meth:`_run` ran its ``finally``."""
        if self.active.get(job.row.job_id) is not job:
            return
        del self.active[job.row.job_id]
        self._progress.forget(job.row.job_id)
        ctx.cancelled.set()
        if adopt is not None:
            adopt.cancel()
        if not task.cancelled():
            return
        self._settle_cancelled(job)

    def _settle_cancelled(self, job: ActiveJob) -> None:
        """Record a cancelled job's end (SPEC J3, J5, J6)."""
        if job.interrupted and (not job.started or job.idempotent):
            # SPEC J6: it never started (queued, or its start waited for its commit);
            # J5: an idempotent one may run again. Stored queued, it runs after the
            # restart.
            if job.row.state != m.JobState.QUEUED:
                self._end.save(job, job.row.at_state(m.JobState.QUEUED, None))
        elif job.interrupted:
            self._end.failed(job, INTERRUPTED)
        else:
            self._end.cancelled(job)

    def tracked(self) -> dict[str, int]:
        """Entries held now (case F33): session job bounds, active jobs, progress notes."""
        return {
            **self._slots.tracked(),
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
        returned: asyncio.Future[None] | None = None,
    ) -> None:
        try:
            if adopt is not None:
                # SPEC J1, I14: a promoted call's handler runs already (or waits only for
                # its worker thread) and cannot be paused: it takes its slots at once,
                # even past a bound, so the jobs after it wait until it returns (its
                # thread too, when the job is cancelled or times out first).
                with self._slots.take(job.session) as claim:
                    claim.until = returned
                    value = await adopt
            else:
                # SPEC J1, E3: slots of the session, its user and the server, held until
                # the handler really returned (Claim).
                async with self._slots.hold(job.session) as claim:
                    value = await self._execute(job, tool, params, ctx, claim)
            result, _ = await post(as_object(value))
            self._end.done(job, result)
        except asyncio.CancelledError:
            ctx.cancelled.set()
            self._settle_cancelled(job)
            raise
        except TimeoutError:
            self._end.failed(job, {"code": "timeout", "message": f"{tool.name} timed out"})
        except Lapse as lapse:
            # SPEC A7: a gate failed after the queue wait; the handler never ran.
            self._end.failed(job, {"code": lapse.code.value, "message": lapse.message})
        except ToolFailure as failure:
            # SPEC M2, M3: a typed failure keeps its code and its exact text.
            self._end.failed(job, {"code": failure.code.value, "message": failure.message})
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # SPEC I16: any other raise ends the job failed
            logger.info("job %s failed: %s", job.row.job_id, type(exc).__name__, exc_info=True)
            self._end.failed(job, {"code": "handler_error", "message": describe(exc)})
        finally:
            self.active.pop(job.row.job_id, None)
            self._progress.forget(job.row.job_id)
            # Its row and event are staged: when many jobs end in one loop turn, the
            # first ones' events leave without waiting for every other job's end (P5).
            job.session.outbox.flush_burst()

    async def _execute(
        self, job: ActiveJob, tool: ToolDef, params: dict[str, Any], ctx: ToolContext, claim: Claim
    ) -> Any:
        """Run the handler; the job turns ``running`` only once the handler really starts,
        after the wait for a worker thread (SPEC J6), and its timeout counts from then.

        The ``running`` row of a tool that is not idempotent is durable before its
        handler starts (SPEC J5, J6), so a restart reports it ``interrupted`` instead of
        running it again: a journal append on SQLite (:meth:`Outbox.commit
        <gateway.outbox.Outbox.commit>`); where a flush is a commit (PostgreSQL, SQLite
        without a usable journal) the turn's group commit (:meth:`Outbox.durable
        <gateway.outbox.Outbox.durable>`; P5p). Until then :attr:`ActiveJob.started` is
        false: a drain leaves the job ``queued``. A store that cannot make the row
        durable fails the job ``unavailable`` before the handler runs.
        """
        func = tool.func
        assert func is not None
        limit = tool.timeout if tool.timeout and not tool.long_running else None
        started = _starter(job, tool, self._end, self._clock)
        claim.until = asyncio.get_running_loop().create_future()
        return await run_handler(
            func, params, ctx, self._pool, limit, on_start=started, returned=claim.until
        )

    def progress_of(self, job_id: str) -> tuple[float | None, str | None]:
        return self._progress.of(job_id)

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

    async def shutdown(self, deadline: float | None = None, patient: bool = False) -> None:
        """Stop for a drain (SPEC S4, J5, J6, N6): :meth:`gateway.job_drain.JobDrain.run`."""
        await self._drain.run(deadline, patient)


def _starter(job: ActiveJob, tool: ToolDef, end: JobEnd, clock: Clock) -> OnStart:
    """The ``on_start`` of ``job``'s handler (SPEC J1, J6): the job turns ``running``
    (``started_at`` now, ``clock``'s Unix time) right before its handler starts, and
    that row is made durable first as :func:`_durable_start` says (J5)."""

    def started() -> Awaitable[None] | None:
        job.in_thread = not inspect.iscoroutinefunction(tool.func)
        end.save(job, job.row.at_state(m.JobState.RUNNING, clock()))
        # SPEC J6: a call marked not started needs its start durable, idempotent or not.
        return _durable_start(job, tool.idempotent and not job.unstarted)

    return started


def _durable_start(job: ActiveJob, idempotent: bool) -> Awaitable[None] | None:
    """Make ``job``'s staged ``running`` row durable before its handler (SPEC J5, J6):
    nothing for an idempotent tool, a journal append at once, or (a flush is a commit)
    the awaitable share of the turn's group commit. :class:`ToolFailure`
    ``unavailable`` when it cannot be. The decision of a gated call was committed
    before its job was created (SPEC A3, :func:`gateway.execution._durable_now`)."""
    outbox = job.session.outbox
    if not idempotent and not job.session.store.journals:
        return _durable(job, outbox.durable(at_once=False))
    if not idempotent and not outbox.commit():
        raise ToolFailure(ErrorCode.UNAVAILABLE, NOT_DURABLE)
    job.started = True
    return None


async def _durable(job: ActiveJob, commit: asyncio.Future[bool]) -> None:
    """Wait for the group commit ``commit`` of ``job``'s ``running`` row (SPEC J5, J6),
    then mark the job started; :class:`ToolFailure` ``unavailable`` when the commit
    failed, so the handler does not start."""
    if not await commit:
        raise ToolFailure(ErrorCode.UNAVAILABLE, NOT_DURABLE)
    job.started = True
