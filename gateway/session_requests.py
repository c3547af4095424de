"""The requests of an open session: catalog, calls, approvals, grants, jobs, context
(SPEC C3, I8, A3, M3, K2, J3, S5, S6, D6).

:class:`SessionRequests` answers each client request of a session; the connection's
dispatch table (:data:`gateway.connection.ConnectionHandler.BY_CLASS`) calls it by message class.
A refusal is an ``error`` reply on the session, counted by code. The job requests are
:class:`gateway.job_requests.JobRequests`' (``job_requests``). A request that changes the
session (``grants.revoke``, ``context.update``) is answered once the change is durable,
else ``unavailable`` with nothing changed (SPEC D1, D6).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.approvals import Approvals
from gateway.authority import Authority, Refusal
from gateway.config import LimitsConfig
from gateway.hello import context_too_large
from gateway.job_requests import JobRequests
from gateway.jobs import JobRunner
from gateway.mcp.elicit import Elicitations
from gateway.metrics import Metrics
from gateway.outbox import Outbox
from gateway.pipeline import Pipeline
from gateway.session import BYE_REFUSED, Session, SessionTable
from gateway.store import Store, StoreUnavailable
from gateway.tasks import TaskSet
from protocol import messages as m
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from gateway.catalog_state import CatalogState
    from gateway.node_requests import NodeRequests

NOT_STORED = "the store cannot record the {} change right now; nothing changed, try again"
"""The ``unavailable`` message of a session change the store could not make durable
(SPEC D6): ``grants.revoke`` ("grant"), ``context.update`` ("context")."""


class SessionRequests:
    """Answers the requests of open sessions; one per server.

    Args:
        pipeline: runs and cancels calls (SPEC I1-I16).
        approvals: the approval registry (SPEC A3).
        elicitations: mounted MCP servers' questions (SPEC M3).
        jobs: the job runner (SPEC J3).
        store: journals a session change while commits fail (SPEC D6); the jobs'.
        outbox: commits a session change before its answer (SPEC D6), and the jobs'.
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
        self.job_requests = JobRequests(
            jobs, store, outbox, catalog, background, self.error, lambda: self.routes
        )
        """``job.get``, ``job.list``, ``job.cancel`` (SPEC J3)."""

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
        """SPEC K2, A3: drop one grant; ``unknown_grant`` when there is none; SPEC D6:
        answered ``grants`` once the revoke is durable, else ``unavailable`` and the
        grant stays."""
        if msg.tool not in s.grants:
            text = f"no 'always allow' grant for {msg.tool!r}"
            self.error(s, msg.id, ErrorCode.UNKNOWN_GRANT, text)
            return
        s.grants.discard(msg.tool)
        if not self._stored(s):
            # SPEC D6: not revoked, as the client is told; the row staged again says so.
            s.grants.add(msg.tool)
            s.save()
            self.error(s, msg.id, ErrorCode.UNAVAILABLE, NOT_STORED.format("grant"))
            return
        s.reply(m.Grants(id=msg.id, tools=sorted(s.grants)))

    def _stored(self, s: Session) -> bool:
        """SPEC D1, D6: stage the session row and make it durable now, before a reply
        tells the client its change holds: the commit of what is staged (on SQLite a
        journal append), or while commits fail the journal entry of the row's context
        and grants alone (:meth:`Store.journal_session
        <gateway.store.Store.journal_session>`). ``False`` when neither could: the
        caller puts the change back, stages the row again and answers ``unavailable``,
        so that a restart finds what the client was told."""
        s.save()
        return self.outbox.commit() or self.store.journal_session(s.row())

    def context_update(self, s: Session, msg: m.ContextUpdate) -> None:
        """SPEC S5: change the context, answer it, re-push the catalog if it changed;
        SPEC D6: answered once the change is durable, else ``unavailable`` and the
        context stays as it was (one that changes nothing is answered at once)."""
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
        before, s.context = s.context, context
        if context == before:
            s.save()  # nothing changed: no commit to wait for (its flush still tries one)
        elif not self._stored(s):
            s.context = before  # SPEC D6: unchanged, as the client is told
            s.save()
            self.error(s, msg.id, ErrorCode.UNAVAILABLE, NOT_STORED.format("context"))
            return
        s.reply(m.Context(id=msg.id, context=dict(context)))
        self.catalog.push(s, m.CatalogReason.CONTEXT)

    def bye(self, s: Session, msg: m.Bye, sessions: SessionTable) -> bool:
        """SPEC A4, D2, D6: end ``s`` for good once that end is durable
        (:meth:`SessionTable.bye <gateway.session.SessionTable.bye>`); ``False`` when
        it cannot be now: answered ``unavailable``, the session stays open as it was."""
        if sessions.bye(s):
            return True
        self.error(s, msg.id, ErrorCode.UNAVAILABLE, BYE_REFUSED)
        return False

    def auth_refresh(self, s: Session, msg: m.AuthRefresh) -> None:
        """SPEC S6: a refreshed credential on the open socket, or a typed refusal;
        SPEC D6: answered once its stored reference is durable, else ``unavailable``
        and the old credential stands."""
        try:
            expires_at = self.authority.refresh(s, msg.token, lambda: self._stored(s))
        except Refusal as refusal:
            self.error(s, msg.id, refusal.code, refusal.message)
            return
        s.reply(m.AuthRefreshed(id=msg.id, expires_at=expires_at))
