"""How a job's state changes are recorded and told (SPEC J1, J5, I16, E2).

:class:`JobEnd` is the one place a job's row is staged and its event emitted: the row
first, then the event, and the outbox commits before it sends, so a job's state is
durable before the client hears of it (SPEC J5). A job ends once, as ``done``,
``failed`` or ``cancelled``; a ``job.done`` that could not be sent (not encodable, over
``max_message_bytes``, nested too deep) is found before anything is staged and ends the
job ``failed`` ``handler_error`` instead (SPEC I16, E2). Events go to the session that
created the job, into its log, whether or not a socket is attached (SPEC D1).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from gateway.failures import sendable
from gateway.framesize import ENVELOPE, WIDEST_SEQ, clip_text, too_deep
from gateway.metrics import Metrics
from gateway.session import Session
from gateway.store import JobRow, Store
from protocol import messages as m
from protocol.codec import (
    SERVER_MAX_DEPTH,
    encode_dumped,
    encode_json,
    json_problem,
    non_finite,
)

logger = logging.getLogger("gateway.jobs")


@dataclass(slots=True, eq=False)
class ActiveJob:
    """A job this process runs now: its latest row, its session and its task."""

    row: JobRow
    session: Session
    task: asyncio.Task[None] | None = None
    last_progress: float = 0.0
    interrupted: bool = False
    idempotent: bool = False
    in_thread: bool = False
    """Its handler is plain and runs in a worker thread, which cannot be interrupted."""
    started: bool = False
    """Its handler may run now: its ``running`` row is durable (SPEC J6). Between the
    staging of that row and its group commit (a store that does not journal) the row
    says ``running`` but the handler has not started; a drain then leaves the job
    ``queued`` (:meth:`gateway.jobs.JobRunner._execute`). A promoted call's handler
    still waiting for its worker thread has not started either: its job is ``queued``
    until then (SPEC I14, :class:`gateway.execute.Start`)."""
    unstarted: bool = False
    """Its call's ledger row says the call has not started (a pre-hook's awaitable, a
    wait for a worker thread: :func:`gateway.call_start.mark_unstarted`, SPEC J6): its
    start is made durable before its handler runs, even for an ``idempotent`` tool, or
    a kill right after it would leave that mark as the call's record ("it did not
    run" of a handler that ran)."""


def _done_fields(
    row: JobRow,
    summary: str,
    artifacts: list[Any],
    result: dict[str, Any],
    now: float,
    max_frame: int | None = None,
) -> dict[str, Any] | str:
    """The job's ``job.done`` event, built and checked once (SPEC J4, I16, E2): its
    fields as :func:`protocol.codec.encode_event` dumps them, for
    :func:`protocol.codec.encode_dumped`; or, as a ``str``, what stops it from being
    built and encoded. A ``NaN`` or ``Infinity`` anywhere in the result or the artifacts
    is one (orjson would send ``null``), named by its path; a frame over ``max_frame``
    bytes (the announced ``max_message_bytes``, SPEC E2) too."""
    if non_finite(result) or non_finite(artifacts):
        found = json_problem(result) or json_problem(artifacts, "artifacts")
        return found or "a number JSON cannot carry"
    try:
        fields = m.JobDone(
            seq=WIDEST_SEQ,
            job_id=row.job_id,
            tool=row.tool,
            call_id=row.call_id,
            summary=summary,
            artifacts=artifacts,
            result=result,
            finished_at=now,
        ).model_dump(exclude_none=True)
        size = len(encode_json(fields))  # sized at the widest seq the frame may carry
    except (TypeError, ValueError) as exc:
        found = json_problem(result) or json_problem(artifacts, "artifacts")
        return found or " ".join(str(exc).split())[:300]
    if max_frame is not None and size > max_frame:
        return f"job.done would be {size} bytes; at most {max_frame} fit"
    if too_deep(result, SERVER_MAX_DEPTH - 1) or too_deep(artifacts, SERVER_MAX_DEPTH - 1):
        # SPEC I16: a client drops a frame nested past SERVER_MAX_DEPTH levels.
        return f"result is nested deeper than {SERVER_MAX_DEPTH - 1} levels"
    return fields


class JobEnd:
    """Stages a job's rows and emits its events, in that order (SPEC J5).

    Args:
        store: where job rows are staged.
        metrics: the jobs gauge by state and the finished counter.
        clock: Unix time in seconds.
        max_frame: largest ``job.done`` frame in bytes (``max_message_bytes``, SPEC E2);
            a bigger one fails the job ``handler_error``. ``None``: no bound.
    """

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        clock: Callable[[], float],
        max_frame: int | None = None,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._clock = clock
        self._max_frame = max_frame

    def save(self, job: ActiveJob, row: JobRow) -> None:
        old = job.row.state
        job.row = row
        self._store.stage_job(row)
        if old != row.state:
            self._metrics.job_state(old).dec()
        self._metrics.job_state(row.state).inc()

    def done(self, job: ActiveJob, result: dict[str, Any]) -> None:
        summary = result.pop("summary", None)
        artifacts = result.pop("artifacts", [])
        if not isinstance(summary, str):
            summary = f"{job.row.tool} finished"
        if not isinstance(artifacts, list) or not all(isinstance(a, dict) for a in artifacts):
            artifacts = []
        now = self._clock()
        fields = _done_fields(job.row, summary, artifacts, result, now, self._max_frame)
        if isinstance(fields, str):
            # SPEC I16: found before anything is staged, so the value never reaches the
            # store and cannot fail a commit that other sessions' events share (D6).
            logger.info("job %s returned a value that cannot be sent: %s", job.row.job_id, fields)
            message = f"the handler's value cannot be sent: {fields}"
            self.failed(job, {"code": "handler_error", "message": message})
            return
        row = job.row
        self._end(job, row.ended(m.JobState.DONE, now, summary, artifacts, result, row.error))
        # The event checked above, its bytes under the session's next seq (SPEC D1): the
        # same as emitting a JobDone built again, without building it (P5). An ended
        # session logs and sends nothing (Session.emit_encoded).
        job.session.emit_encoded(partial(encode_dumped, fields))

    def failed(self, job: ActiveJob, error: dict[str, Any]) -> None:
        # SPEC I16: a message JSON cannot carry (a lone surrogate) must not leave the job
        # running for ever; it is sent with the surrogate escaped.
        error = {**error, "message": sendable(str(error["message"]))}
        if self._max_frame is not None:
            # SPEC E2: the text appears twice (summary and error.message); each gets
            # half of what the frame leaves besides the ids.
            ids = len(encode_json([job.row.job_id, job.row.tool, job.row.call_id]))
            half = (self._max_frame - ENVELOPE - ids) // 2 - len(job.row.tool) - 16
            error = {**error, "message": clip_text(str(error["message"]), half)}
        now = self._clock()
        summary = f"{job.row.tool} failed: {error['message']}"
        row = job.row.ended(
            m.JobState.FAILED, now, summary, job.row.artifacts, job.row.result, error
        )
        self._end(job, row)
        failed = m.JobFailed(
            job_id=row.job_id,
            tool=row.tool,
            call_id=row.call_id,
            summary=summary,
            error=m.JobError(**error),
            finished_at=now,
        )
        self.emit(job, failed)

    def cancelled(self, job: ActiveJob) -> None:
        now = self._clock()
        summary = f"{job.row.tool} was cancelled"
        old = job.row
        row = old.ended(m.JobState.CANCELLED, now, summary, old.artifacts, old.result, old.error)
        self._end(job, row)
        cancelled = m.JobCancelled(
            job_id=row.job_id, tool=row.tool, call_id=row.call_id, summary=summary, finished_at=now
        )
        self.emit(job, cancelled)

    def _end(self, job: ActiveJob, row: JobRow) -> None:
        self.save(job, row)
        self._metrics.job_state(row.state).dec()
        self._metrics.job_finished(row.state)

    def emit(self, job: ActiveJob, event: m.DurableEvent) -> None:
        if not job.session.ended:
            job.session.emit(event)
