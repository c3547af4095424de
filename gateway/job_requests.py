"""The job requests of an open session: ``job.get``, ``job.list``, ``job.cancel`` (SPEC
J3, N3, D6).

:class:`JobRequests` answers them for :class:`gateway.session_requests.SessionRequests`
(the connection's dispatch table calls it through that object's ``job_requests``). Only
the caller's own jobs exist for it (SPEC J3). A ``job.cancel`` is answered once the
job's final state is durable (SPEC J5, D1), or refused ``unavailable`` while the store
cannot record it (SPEC D6): a job the client was told is cancelled never runs after a
restart, and one it was not told about stays as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.job_end import ActiveJob
from gateway.job_fit import fit_job, fit_jobs
from gateway.jobs import JobRunner, job_info
from gateway.outbox import Outbox
from gateway.session import Session
from gateway.store import JobRow, Store, StoreUnavailable
from gateway.tasks import TaskSet
from protocol import messages as m
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from gateway.catalog_state import CatalogState
    from gateway.node_requests import NodeRequests

ROUTED_POLL = 0.05
"""Seconds between two reads of a job whose cancel went to another node (SPEC N3, J3)."""
ROUTED_WAIT = 30.0
"""Seconds a routed ``job.cancel`` waits for the job's final state before it answers
with the state stored then."""

CANCEL_REFUSED = "the store cannot record a cancel right now; the job goes on, try again"
"""SPEC D6: the ``unavailable`` answer of a ``job.cancel`` refused before anything
changed (the store could not commit what was staged)."""
CANCEL_NOT_STORED = (
    "the store could not record the cancel; the job is stopped here, its final state "
    "follows as an event once stored, and a restart before then runs it again"
)
"""SPEC D6, J6: the ``unavailable`` answer of a ``job.cancel`` whose ``cancelled`` row
could not be made durable (the store failed between the check and the cancel)."""

Refuse = Callable[[Session, "str | None", ErrorCode, str], None]
"""Replies ``error`` with a code and a message to a request id, counted (SPEC E1)."""


class JobRequests:
    """Answers the job requests of open sessions; one per server (SPEC J3).

    Args:
        jobs: the job runner.
        store: the stored jobs.
        outbox: committed before a job list is read, and before a cancel is answered.
        catalog: the frame bound of a reply (``max_frame``, SPEC E2).
        background: keeps the reply tasks of ``job.cancel`` referenced.
        refuse: the ``error`` reply of :class:`~gateway.session_requests.SessionRequests`.
        routes: the node requests when a store is shared by several nodes (SPEC N3),
            read at each request (``None``: one node).
    """

    def __init__(
        self,
        jobs: JobRunner,
        store: Store,
        outbox: Outbox,
        catalog: CatalogState,
        background: TaskSet,
        refuse: Refuse,
        routes: Callable[[], NodeRequests | None],
    ) -> None:
        self.jobs = jobs
        self.store = store
        self.outbox = outbox
        self.catalog = catalog
        self.background = background
        self.refuse = refuse
        self.routes = routes

    def _own_job(self, s: Session, request_id: str | None, job_id: str) -> JobRow | None:
        """SPEC J3: only the caller's own jobs exist for it."""
        active = self.jobs.active.get(job_id)
        row = active.row if active is not None else self.store.job(job_id)
        if row is None or row.user != s.user or row.tenant != s.tenant:
            self.refuse(s, request_id, ErrorCode.UNKNOWN_JOB, f"no job {job_id!r}")
            return None
        return row

    def job_get(self, s: Session, msg: m.JobGet) -> None:
        """SPEC J3: one of the caller's jobs."""
        row = self._own_job(s, msg.id, msg.job_id)
        if row is not None:
            info = job_info(row, self.jobs.progress_of(row.job_id))
            s.reply(fit_job(msg.id, info, self.catalog.max_frame))  # SPEC E2

    def job_list(self, s: Session, msg: m.JobList) -> None:
        """SPEC J3: the caller's jobs, newest first, committed state."""
        self.outbox.flush()
        status = msg.status.value if msg.status is not None else None
        rows = self.store.jobs(s.user, s.tenant, status, msg.limit)
        infos = [job_info(row, self.jobs.progress_of(row.job_id)) for row in rows]
        s.reply(fit_jobs(msg.id, infos, self.catalog.max_frame))  # SPEC E2

    def job_cancel(
        self, s: Session, msg: m.JobCancel, current: Callable[[], Session | None]
    ) -> None:
        """SPEC J3: cancel a job; answered once its final state is stored, to the
        socket's session then (``current``), if it still has one.

        SPEC D6, J6: what is staged is committed first; a store that cannot gets the
        cancel refused ``unavailable`` and nothing changes (the job runs on, here and
        after a restart). A cancelled row that cannot be made durable afterwards is
        answered ``unavailable`` too (:data:`CANCEL_NOT_STORED`), never ``job``.
        """
        row = self._own_job(s, msg.id, msg.job_id)
        if row is None:
            return
        active = self.jobs.active.get(msg.job_id)
        if active is None or active.task is None:
            if row.state in (m.JobState.QUEUED, m.JobState.RUNNING) and self.routes():
                self._route_job_cancel(s, msg, current)
                return
            text = f"job {msg.job_id!r} already ended ({row.state})"
            self.refuse(s, msg.id, ErrorCode.JOB_FINISHED, text)
            return
        if not self.outbox.commit():
            self.refuse(s, msg.id, ErrorCode.UNAVAILABLE, CANCEL_REFUSED)
            return
        task = self.jobs.cancel(msg.job_id)
        assert task is not None  # active, with a task, in this same turn
        # Kept in the gateway's task set: a bare create_task could be collected before it
        # replies, and the job.cancel answer would be lost (SPEC J3).
        reply = self._reply_cancelled(msg, active, task, current)
        self.background.spawn(reply, name="job.cancel reply")

    def _route_job_cancel(
        self, s: Session, msg: m.JobCancel, current: Callable[[], Session | None]
    ) -> None:
        """SPEC N3, J3: the job runs on another node; the cancel goes there and the
        answer follows once the store holds its final state."""
        from gateway.node_requests import Kind

        routes = self.routes()
        assert routes is not None
        try:
            routes.route(Kind.CANCEL_JOB, s.id, s.user, msg.job_id)
        except StoreUnavailable:
            self.refuse(s, msg.id, ErrorCode.UNAVAILABLE, "the store cannot be written now")
            return
        self.background.spawn(self._reply_routed(msg, current), name="job.cancel reply")

    async def _reply_routed(self, msg: m.JobCancel, current: Callable[[], Session | None]) -> None:
        """SPEC J3: answer a routed ``job.cancel`` once the stored job is final (polled
        every :data:`ROUTED_POLL` s, at most :data:`ROUTED_WAIT` s; then as it stands)."""
        row = None
        for _ in range(int(ROUTED_WAIT / ROUTED_POLL)):
            with contextlib.suppress(StoreUnavailable):
                row = self.store.job(msg.job_id)
            if row is not None and row.state not in (m.JobState.QUEUED, m.JobState.RUNNING):
                break
            await asyncio.sleep(ROUTED_POLL)
        session = current()
        if row is not None and session is not None:
            session.reply(fit_job(msg.id, job_info(row), self.catalog.max_frame))

    async def _reply_cancelled(
        self,
        msg: m.JobCancel,
        job: ActiveJob,
        task: asyncio.Task[None],
        current: Callable[[], Session | None],
    ) -> None:
        """SPEC J3, J5, D6: answer ``job.cancel`` with the job's final state (its row in
        memory: a store read may fail while commits do) once that state is durable;
        ``unavailable`` :data:`CANCEL_NOT_STORED` when it could not be made so."""
        await asyncio.wait({task})
        durable = await self.outbox.durable()
        session = current()
        if session is None:
            return
        if not durable:
            self.refuse(session, msg.id, ErrorCode.UNAVAILABLE, CANCEL_NOT_STORED)
            return
        session.reply(fit_job(msg.id, job_info(job.row), self.catalog.max_frame))  # SPEC E2
