"""The requests of an open session: catalog, calls, approvals, grants, jobs, context
(SPEC C3, I8, A3, M3, K2, J3, S5, S6).

:class:`SessionRequests` answers each client request of a session; the connection's
dispatch table (:data:`gateway.connection.ConnectionHandler.BY_CLASS`) calls it by message class.
A refusal is an ``error`` reply on the session, counted by code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.approvals import Approvals
from gateway.authority import Authority, Refusal
from gateway.config import LimitsConfig
from gateway.hello import context_too_large
from gateway.job_fit import fit_job, fit_jobs
from gateway.jobs import JobRunner, job_info
from gateway.mcp.elicit import Elicitations
from gateway.metrics import Metrics
from gateway.outbox import Outbox
from gateway.pipeline import Pipeline
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


class SessionRequests:
    """Answers the requests of open sessions; one per server.

    Args:
        pipeline: runs and cancels calls (SPEC I1-I16).
        approvals: the approval registry (SPEC A3).
        elicitations: mounted MCP servers' questions (SPEC M3).
        jobs: the job runner (SPEC J3).
        store: jobs and their rows (SPEC J3).
        outbox: committed before a job list is read (SPEC J3).
        catalog: the catalog state (SPEC C3, S5).
        authority: credential refreshes (SPEC S6).
        metrics: the server's metrics (``errors`` by code).
        limits: the context size limit (SPEC E2).
        background: keeps fire-and-forget reply tasks referenced.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        approvals: Approvals,
        elicitations: Elicitations,
        jobs: JobRunner,
        store: Store,
        outbox: Outbox,
        catalog: CatalogState,
        authority: Authority,
        metrics: Metrics,
        limits: LimitsConfig,
        background: TaskSet,
    ) -> None:
        self.pipeline = pipeline
        self.approvals = approvals
        self.elicitations = elicitations
        self.jobs = jobs
        self.store = store
        self.outbox = outbox
        self.catalog = catalog
        self.authority = authority
        self.metrics = metrics
        self.limits = limits
        self.background = background
        self.routes: NodeRequests | None = None
        """Set on a store shared by several nodes: a decision or a cancel for a call or
        job that runs on another node is routed there (SPEC N3)."""

    def error(self, s: Session, request_id: str | None, code: ErrorCode, message: str) -> None:
        """Reply ``error`` ``code`` to ``request_id``, counted (SPEC E1)."""
        self.metrics.errors.labels(code.value).inc()
        s.reply(m.Error(id=request_id, code=code, message=message))

    def catalog_get(self, s: Session, msg: m.CatalogGet) -> None:
        """SPEC C3: "not modified" when the client's version is current."""
        version, _, _ = self.catalog.view(s)
        if msg.version is not None and msg.version == version == s.catalog_version:
            s.reply(m.CatalogNotModified(id=msg.id, version=version))
            return
        self.catalog.push(s, m.CatalogReason.REQUESTED, force=True, request_id=msg.id)

    def invoke(self, s: Session, msg: m.Invoke) -> None:
        """SPEC I1-I16: admit the call, or refuse it at once."""
        self.pipeline.accept(s, msg)

    def call_cancel(self, s: Session, msg: m.CallCancel) -> None:
        """SPEC I8: cancel a running call; ``unknown_call`` when none runs."""
        if self.pipeline.cancel(s, msg.call_id) or self._routed_cancel(s, msg.call_id):
            return
        self.error(s, msg.id, ErrorCode.UNKNOWN_CALL, f"no running call {msg.call_id!r}")

    def _routed_cancel(self, s: Session, call_id: str) -> bool:
        """SPEC N3, I8: route a ``call.cancel`` to the node where the call runs; ``False``
        when no running stored call of ``s`` has that id (or there is one node)."""
        routes = self.routes
        if routes is None:
            return False
        from gateway.node_requests import Kind

        try:
            if not routes.running_elsewhere(s.id, call_id, call_id):
                return False
            routes.route(Kind.CANCEL_CALL, s.id, s.user, call_id)
        except StoreUnavailable:
            return False
        return True

    def tool_confirm(self, s: Session, msg: m.ToolConfirm) -> None:
        """SPEC A3: first decision wins; anything else is "not accepted" with a reason."""
        reason = self.approvals.confirm(s.id, s.user, msg.approval_id, msg.decision)
        if reason is m.NotAcceptedReason.UNKNOWN and self.routes is not None:
            # SPEC N3, A3, A4: the call waits on another node; the first decision routed
            # there wins (its tool.resolved tells which settlement did), a later one
            # is not accepted, and one past the approval's expires_at is expired, as
            # this node would answer them.
            reason = self.routes.route_confirm(s.id, s.user, msg.approval_id, msg.decision)
        s.reply(
            m.ConfirmResult(
                id=msg.id, approval_id=msg.approval_id, accepted=reason is None, reason=reason
            )
        )

    def elicit_answer(self, s: Session, msg: m.ElicitAnswer) -> None:
        """SPEC M3: the user's answer to a mounted MCP server's question; SPEC N3: one
        for a question waiting on another node goes there."""
        result = self.elicitations.answer(s, msg)
        if result.reason is m.NotAcceptedReason.UNKNOWN and self.routes is not None:
            reason = self.routes.route_answer(
                s.id, s.user, msg.elicitation_id, msg.action, msg.content
            )
            result = result.model_copy(update={"accepted": reason is None, "reason": reason})
        s.reply(result)

    def grants_list(self, s: Session, msg: m.GrantsList) -> None:
        """SPEC K2: the session's "always allow" grants."""
        s.reply(m.Grants(id=msg.id, tools=sorted(s.grants)))

    def grants_revoke(self, s: Session, msg: m.GrantsRevoke) -> None:
        """SPEC K2: drop one grant; ``unknown_grant`` when there is none."""
        if msg.tool not in s.grants:
            text = f"no 'always allow' grant for {msg.tool!r}"
            self.error(s, msg.id, ErrorCode.UNKNOWN_GRANT, text)
            return
        s.grants.discard(msg.tool)
        s.save()
        s.reply(m.Grants(id=msg.id, tools=sorted(s.grants)))

    def _own_job(self, s: Session, request_id: str | None, job_id: str) -> JobRow | None:
        """SPEC J3: only the caller's own jobs exist for it."""
        active = self.jobs.active.get(job_id)
        row = active.row if active is not None else self.store.job(job_id)
        if row is None or row.user != s.user or row.tenant != s.tenant:
            self.error(s, request_id, ErrorCode.UNKNOWN_JOB, f"no job {job_id!r}")
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
        socket's session then (``current``), if it still has one."""
        row = self._own_job(s, msg.id, msg.job_id)
        if row is None:
            return
        task = self.jobs.cancel(msg.job_id)
        if task is None and row.state in (m.JobState.QUEUED, m.JobState.RUNNING) and self.routes:
            self._route_job_cancel(s, msg, row, current)
            return
        if task is None:
            text = f"job {msg.job_id!r} already ended ({row.state})"
            self.error(s, msg.id, ErrorCode.JOB_FINISHED, text)
            return
        # Kept in the gateway's task set: a bare create_task could be collected before it
        # replies, and the job.cancel answer would be lost (SPEC J3).
        self.background.spawn(self._reply_cancelled(msg, task, current), name="job.cancel reply")

    def _route_job_cancel(
        self, s: Session, msg: m.JobCancel, row: JobRow, current: Callable[[], Session | None]
    ) -> None:
        """SPEC N3, J3: the job runs on another node; the cancel goes there and the
        answer follows once the store holds its final state."""
        from gateway.node_requests import Kind

        assert self.routes is not None
        try:
            self.routes.route(Kind.CANCEL_JOB, s.id, s.user, msg.job_id)
        except StoreUnavailable:
            self.error(s, msg.id, ErrorCode.UNAVAILABLE, "the store cannot be written now")
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
        self, msg: m.JobCancel, task: asyncio.Task[None], current: Callable[[], Session | None]
    ) -> None:
        """SPEC J3: answer ``job.cancel`` with the job's final state, once it is stored."""
        await asyncio.wait({task})
        row = self.store.job(msg.job_id)
        session = current()
        if row is not None and session is not None:
            session.reply(fit_job(msg.id, job_info(row), self.catalog.max_frame))  # SPEC E2

    def context_update(self, s: Session, msg: m.ContextUpdate) -> None:
        """SPEC S5: change the context, answer it, re-push the catalog if it changed."""
        context = dict(s.context)
        for key, value in msg.context.items():
            if value is None:
                context.pop(key, None)
            else:
                context[key] = value
        if context_too_large(context, self.limits):
            limit = self.limits.max_context_bytes
            self.error(s, msg.id, ErrorCode.CONTEXT_TOO_LARGE, f"context over {limit} bytes")
            return
        s.context = context
        s.save()
        s.reply(m.Context(id=msg.id, context=dict(context)))
        self.catalog.push(s, m.CatalogReason.CONTEXT)

    def auth_refresh(self, s: Session, msg: m.AuthRefresh) -> None:
        """SPEC S6: a refreshed credential on the open socket, or a typed refusal."""
        try:
            expires_at = self.authority.refresh(s, msg.token)
        except Refusal as refusal:
            self.error(s, msg.id, refusal.code, refusal.message)
            return
        s.reply(m.AuthRefreshed(id=msg.id, expires_at=expires_at))
