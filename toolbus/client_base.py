"""State and request/reply plumbing of the toolbus client (SPEC K1).

:class:`ClientBase` is the base of :class:`toolbus.client.Client`: it holds the settings
and builds the client's parts, each from the few things it uses:
:class:`~toolbus.client_calls.Calls` (what waits for an answer, paired with the reply
carrying its ``id``), :class:`~toolbus.client_jobs.Jobs`,
:class:`~toolbus.client_approvals.Approvals`, :class:`~toolbus.client_inbound.Inbound`
(each server message; ``last_seq`` and the catalog are read from it) and
:class:`~toolbus.client_link.Link` (the socket; the session ids are read from it). It
also ends the session for all of them (:meth:`ClientBase._shutdown`). The requests
that are one message and one reply live here too: ``tool.confirm`` (SPEC A3),
``catalog.get`` (SPEC C3), ``job.list`` / ``job.get`` / ``job.cancel`` (SPEC J3),
``grants.list`` / ``grants.revoke`` (SPEC A3), ``context.update`` (SPEC S5) and
``auth.refresh`` (SPEC S6).

:class:`toolbus.client.Client` adds the public front: open, close, invoke, cancel and
the streams.
"""

# ASYNC109: the public API takes ``timeout=`` arguments on purpose (SPEC K1: every wait
# that can hang is bounded by the caller); each is applied with asyncio.timeout().
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection

from protocol import messages as m
from toolbus.client_approvals import ApprovalCallback as ApprovalCallback
from toolbus.client_approvals import Approvals
from toolbus.client_calls import Calls
from toolbus.client_calls import R as R
from toolbus.client_inbound import Callbacks, Inbound, Senders
from toolbus.client_inbound import ElicitationCallback as ElicitationCallback
from toolbus.client_inbound import ElicitationReply as ElicitationReply
from toolbus.client_inbound import ExpiringCallback as ExpiringCallback
from toolbus.client_inbound import JobCallback as JobCallback
from toolbus.client_inbound import MessageCallback as MessageCallback
from toolbus.client_jobs import Jobs
from toolbus.client_link import Link, LinkSettings
from toolbus.errors import SessionClosed, UsageError
from toolbus.handles import Backoff, EventStream, JobEvent


class ClientBase:
    """Shared state, sending, and requests answered by one reply (SPEC K1).

    The arguments are those of :class:`toolbus.client.Client`, documented there.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        profile: str | None = None,
        context: Mapping[str, str] | None = None,
        confirm_tool_calls: bool = False,
        tool_start: m.ToolStarts | None = None,
        on_approval: ApprovalCallback | None = None,
        on_job_event: JobCallback | None = None,
        on_message: MessageCallback | None = None,
        on_auth_expiring: ExpiringCallback | None = None,
        on_elicitation: ElicitationCallback | None = None,
        reconnect: bool = True,
        backoff: Backoff | None = None,
        connect_timeout: float = 10.0,
        request_timeout: float | None = 30.0,
        ack_every: int = 16,
        ack_idle: float = 0.05,
        ws_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.url = url
        self.profile = profile
        self.context: dict[str, str] = dict(context or {})
        self.confirm_tool_calls = confirm_tool_calls
        if tool_start is None:
            # SPEC A6: the client acts only on gated tool_start frames; ungated ones are
            # asked for only when on_message can see them.
            tool_start = m.ToolStarts.GATED if on_message is None else m.ToolStarts.ALL
        self.tool_start = tool_start
        self.reconnect = reconnect
        self.backoff = backoff or Backoff()
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.ack_every = max(1, ack_every)
        self.ack_idle = ack_idle
        self._token = token

        self._job_streams: set[EventStream[JobEvent]] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._catalog_changed = asyncio.Event()
        self._closed: SessionClosed | None = None
        self._calls = Calls(lambda: (self._link.ws, self._link.gen), self._check_open)
        """The calls part: invokes and requests waiting for their answer."""
        self._approvals = Approvals(self._confirm_by_id, self._spawn, on_approval)
        """The approvals part: requests from ``tool_start`` until settled."""
        self._jobs = Jobs(
            ask=self.job,
            cancel=lambda job_id, timeout: self.cancel_job(job_id, timeout=timeout),
            spawn=self._spawn,
            backoff=self.backoff,
            is_open=lambda: self._closed is None,
        )
        """The jobs part: handles, outcomes, following through ``job.get``."""
        self._inbound = Inbound(
            self._calls,
            self._approvals,
            self._jobs,
            self._job_streams,
            self._spawn,
            self._notify_change,
            Callbacks(on_message, on_job_event, on_auth_expiring, on_elicitation),
            Senders(self.answer_elicitation, self.refresh_credentials),
        )
        """The inbound part: each server message, by type; ``seq``; the catalog."""
        settings = LinkSettings(
            url=url,
            reconnect=reconnect,
            backoff=self.backoff,
            connect_timeout=connect_timeout,
            ack_every=self.ack_every,
            ack_idle=ack_idle,
            ws_options=dict(ws_options or {}),
        )
        self._link = Link(
            settings,
            self._hello,
            self._inbound,
            self._calls,
            self._jobs,
            self._approvals,
            self._spawn,
            self._stop,
            self._shutdown,
            lambda ws: self._ack(ws),  # late-bound: the client's own ack, observable
        )
        """The link part: the socket, acks, reconnect and resume."""

    @property
    def welcome(self) -> m.Welcome | None:
        """The last ``welcome`` (SPEC S1); ``None`` before the first."""
        return self._link.welcome

    @property
    def session_id(self) -> str | None:
        """The current session's id; ``None`` before the first ``welcome``."""
        return self._link.session_id

    @property
    def reconnects(self) -> int:
        """How many times a new socket took over after the first (for tests, metrics)."""
        return self._link.reconnects

    @property
    def _ws(self) -> ClientConnection | None:
        return self._link.ws

    @property
    def _acked(self) -> int:
        return self._link.acked

    @property
    def _last_frame(self) -> float:
        return self._link.last_frame

    @property
    def _resume_token(self) -> str | None:
        return self._link.resume_token

    @_resume_token.setter
    def _resume_token(self, token: str | None) -> None:
        self._link.resume_token = token

    async def _ack(self, ws: ClientConnection) -> None:
        """Cumulative ack of everything processed (SPEC D2); see :meth:`Link.ack`."""
        await self._link.ack(ws)

    def _hello(
        self, session_id: str | None, resume_token: str | None, last_seq: int | None
    ) -> m.Hello:
        """``hello`` with the current credential, profile, context and options."""
        return m.Hello(
            id=self._calls.next_id(),
            token=self._token,
            profile=self.profile,
            context=self.context,
            options=m.Options(
                confirm_tool_calls=self.confirm_tool_calls, tool_start=self.tool_start
            ),
            session_id=session_id,
            resume_token=resume_token,
            last_seq=last_seq,
        )

    def _shutdown(self, reason: SessionClosed) -> None:
        """Fail everything still waiting and end every stream; the client is done."""
        if self._closed is not None:
            return
        self._closed = reason
        self._link.ws = None
        self._stop.set()
        self._calls.fail(reason)
        self._jobs.fail(reason)
        for jobs in list(self._job_streams):
            jobs.close()
        self._approvals.close()
        for task in self._tasks:
            task.cancel()
        self._notify_change()

    @property
    def last_seq(self) -> int:
        """Highest ``seq`` processed in the current session (sent as ``last_seq``)."""
        return self._inbound.last_seq

    @property
    def catalog(self) -> list[m.ToolInfo]:
        """The tools this session sees, as the server last pushed them (SPEC C3)."""
        return self._inbound.catalog

    @property
    def catalog_version(self) -> str | None:
        """The version of :attr:`catalog`; ``None`` before the first ``catalog``."""
        return self._inbound.catalog_version

    @property
    def auth_expiring(self) -> m.AuthExpiring | None:
        """The last ``auth.expiring`` warning of the current credential (SPEC S6);
        ``None`` again after a refresh."""
        return self._inbound.auth_expiring

    # ------------------------------------------------------------------ requests

    async def confirm(
        self, approval_id: str, decision: m.Decision, *, timeout: float | None = None
    ) -> m.ConfirmResult:
        """Answer an approval request by id (SPEC A3); see :class:`ApprovalRequest`."""
        self._approvals.decided(approval_id, decision)
        return await self._request(
            lambda rid: m.ToolConfirm(id=rid, approval_id=approval_id, decision=decision),
            m.ConfirmResult,
            timeout,
        )

    async def refresh_catalog(self, *, timeout: float | None = None) -> list[m.ToolInfo]:
        """Ask for the catalog with the current version (SPEC C3); returns the catalog
        once the answer (``catalog`` or ``catalog.not_modified``) was processed."""
        await self._request(
            lambda rid: m.CatalogGet(id=rid, version=self.catalog_version),
            (m.Catalog, m.CatalogNotModified),
            timeout,
        )
        return self.catalog

    async def jobs(
        self,
        status: m.JobState | str | None = None,
        *,
        limit: int = 100,
        timeout: float | None = None,
    ) -> list[m.JobInfo]:
        """The caller's own jobs, newest first (SPEC J3), optionally by state."""
        state = m.JobState(status) if status is not None else None
        reply = await self._request(
            lambda rid: m.JobList(id=rid, status=state, limit=limit), m.Jobs, timeout
        )
        return list(reply.jobs)

    async def job(self, job_id: str, *, timeout: float | None = None) -> m.JobInfo:
        """One of the caller's jobs (SPEC J3). Raises
        :class:`~toolbus.errors.RequestRefused` (``unknown_job``) for a job that is not the
        caller's."""
        reply = await self._request(lambda rid: m.JobGet(id=rid, job_id=job_id), m.Job, timeout)
        return reply.job

    async def cancel_job(self, job_id: str, *, timeout: float | None = None) -> m.JobInfo:
        """Cancel one of the caller's jobs (SPEC J3); its handle then ends ``cancelled``.
        Raises :class:`~toolbus.errors.RequestRefused` (``unknown_job``, ``job_finished``)."""
        reply = await self._request(lambda rid: m.JobCancel(id=rid, job_id=job_id), m.Job, timeout)
        return reply.job

    async def grants(self, *, timeout: float | None = None) -> list[str]:
        """This session's "always allow" tools (SPEC A3)."""
        reply = await self._request(lambda rid: m.GrantsList(id=rid), m.Grants, timeout)
        return list(reply.tools)

    async def revoke(self, tool: str, *, timeout: float | None = None) -> list[str]:
        """Revoke the "always allow" grant of ``tool``; returns the remaining grants.
        Raises :class:`~toolbus.errors.RequestRefused` (``unknown_grant``)."""
        reply = await self._request(
            lambda rid: m.GrantsRevoke(id=rid, tool=tool), m.Grants, timeout
        )
        return list(reply.tools)

    async def update_context(
        self, changes: Mapping[str, str | None], *, timeout: float | None = None
    ) -> dict[str, str]:
        """Change the session context (SPEC S5); a ``None`` value removes the key.

        Returns once the server answered and :attr:`catalog` reflects the new context
        (a ``catalog.get`` follows the update: replies come in order, so the catalog
        the server pushed for the change has been processed by then).

        Returns:
            The whole new context.
        """
        reply = await self._request(
            lambda rid: m.ContextUpdate(id=rid, context=dict(changes)), m.Context, timeout
        )
        self.context = dict(reply.context)
        await self.refresh_catalog(timeout=timeout)
        return dict(reply.context)

    async def refresh_credentials(
        self, token: str, *, timeout: float | None = None
    ) -> float | None:
        """Replace the session's credential on the open socket (SPEC S6).

        The new credential must name the same principal and still grant the session's
        profile. Once accepted it is also the one a reconnect sends in ``hello``.

        Returns:
            The new expiry in Unix seconds, or ``None`` when it does not expire.

        Raises:
            RequestRefused: ``auth_failed``, ``principal_mismatch`` or
                ``profile_denied``; the old credential and its expiry stand.
        """
        reply = await self._request(
            lambda rid: m.AuthRefresh(id=rid, token=token), m.AuthRefreshed, timeout
        )
        self._token = token
        self._inbound.auth_expiring = None
        return reply.expires_at

    async def _confirm_by_id(
        self, approval_id: str, decision: m.Decision, timeout: float | None
    ) -> m.ConfirmResult:
        """:meth:`confirm` as an :class:`ApprovalRequest` calls it."""
        return await self.confirm(approval_id, decision, timeout=timeout)

    # ------------------------------------------------------------------ sending

    def _check_open(self) -> None:
        if self._closed is not None:
            raise self._closed
        if self._runner is None:
            raise UsageError("the client is not open; use 'async with connect(...)'")

    async def answer_elicitation(
        self,
        elicitation_id: str,
        action: m.ElicitAction,
        content: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> m.ElicitResult:
        """Answer an ``elicit.request`` (SPEC M3); the first answer wins.

        Returns:
            The ``elicit.result``: ``accepted`` false with a ``reason`` when the question
            was already answered or is unknown to this session.
        """
        return await self._request(
            lambda rid: m.ElicitAnswer(
                id=rid,
                elicitation_id=elicitation_id,
                action=action,
                content=dict(content) if content is not None else None,
            ),
            m.ElicitResult,
            timeout,
        )

    async def _request(
        self,
        build: Callable[[str], BaseModel],
        expected: type[R] | tuple[type[BaseModel], ...],
        timeout: float | None,
    ) -> R:
        """Send one request and wait for its reply (``timeout`` ``None``: the client's
        ``request_timeout``); see :meth:`Calls.request`."""
        limit = self.request_timeout if timeout is None else timeout
        return await self._calls.request(build, expected, limit)

    # ------------------------------------------------------------------ tasks and changes

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _notify_change(self) -> None:
        self._catalog_changed.set()
        self._catalog_changed = asyncio.Event()

    async def _wait_change(self) -> None:
        await self._catalog_changed.wait()
