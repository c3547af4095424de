"""State and request/reply plumbing of the toolbus client (SPEC K1).

:class:`ClientBase` is the first layer of :class:`toolbus.client.Client`: it holds the
state every other layer shares (session ids, ``last_seq``, the catalog, what waits for
an answer), sends messages, and pairs each request with the reply carrying its ``id``.
The requests that are one message and one reply live here too: ``tool.confirm``
(SPEC A3), ``catalog.get`` (SPEC C3), ``job.list`` / ``job.get`` / ``job.cancel``
(SPEC J3), ``grants.list`` / ``grants.revoke`` (SPEC A3), ``context.update``
(SPEC S5) and ``auth.refresh`` (SPEC S6).

The layers above it: :mod:`toolbus.client_inbound` (processing what the server sends),
:mod:`toolbus.client_link` (connect, reconnect, resume) and :mod:`toolbus.client`
(the public front).
"""

# ASYNC109: the public API takes ``timeout=`` arguments on purpose (SPEC K1: every wait
# that can hang is bounded by the caller); each is applied with asyncio.timeout().
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from protocol import messages as m
from protocol.codec import encode
from toolbus.errors import RequestTimeout, SessionClosed, ToolbusClientError, UsageError
from toolbus.handles import ApprovalRequest, Backoff, EventStream, JobEvent, JobHandle, JobOutcome

ApprovalCallback = Callable[[ApprovalRequest], "m.Decision | Awaitable[m.Decision | None] | None"]
"""``on_approval(req)``: return a :class:`~protocol.messages.Decision` to answer at once,
or ``None`` to leave the request to :meth:`~toolbus.client.Client.approvals` or a later
``req.allow()``. May be a plain function or a coroutine function."""

ElicitationReply = tuple[m.ElicitAction, "dict[str, Any] | None"]
ElicitationCallback = Callable[[m.ElicitRequest], "ElicitationReply | Awaitable[ElicitationReply]"]
"""``on_elicitation(req)``: a running tool asks the user (SPEC M3). Return the
``(action, content)`` to send as ``elicit.answer``: ``(ElicitAction.ACCEPT, {...})``
with content matching ``req.requested_schema``, or ``(ElicitAction.DECLINE, None)``.
May be a plain function or a coroutine function; one that raises answers ``cancel``."""

JobCallback = Callable[[JobEvent], object]
MessageCallback = Callable[[BaseModel], object]
ExpiringCallback = Callable[[m.AuthExpiring], "str | Awaitable[str | None] | None"]
"""``on_auth_expiring(msg)``: the session's credential expires at ``msg.expires_at``
(SPEC S6). Return a fresh credential (or a coroutine giving one) and the client sends
it with ``auth.refresh``; return ``None`` to do nothing (the server closes 4004 at
expiry). May be a plain function or a coroutine function."""

R = TypeVar("R", bound=BaseModel)


@dataclass(slots=True, eq=False)
class _Pending:
    """A message waiting for its answer; ``gen`` is the connection it was last sent on
    (0: not sent on any live one yet), so a reconnect re-sends what it must."""

    message: BaseModel
    future: asyncio.Future[Any]
    gen: int = 0
    resent: bool = False


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
        self.reconnect = reconnect
        self.backoff = backoff or Backoff()
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.ack_every = max(1, ack_every)
        self.ack_idle = ack_idle
        self._token = token
        self._on_approval = on_approval
        self._job_callback = on_job_event
        self._on_message = on_message
        self._on_expiring = on_auth_expiring
        self._on_elicitation = on_elicitation
        self.auth_expiring: m.AuthExpiring | None = None
        """The last ``auth.expiring`` warning of the current credential (SPEC S6);
        ``None`` again after a refresh."""
        self._ws_options = dict(ws_options or {})

        self.welcome: m.Welcome | None = None
        self.session_id: str | None = None
        self._resume_token: str | None = None
        self.last_seq = 0
        """Highest ``seq`` processed in the current session (sent as ``last_seq``)."""
        self._acked = 0
        self.catalog: list[m.ToolInfo] = []
        self.catalog_version: str | None = None
        self.reconnects = 0
        """How many times a new socket took over after the first (for tests, metrics)."""

        self._ws: ClientConnection | None = None
        self._gen = 0
        self._ids = itertools.count(1)
        self._invokes: dict[str, _Pending] = {}
        self._requests: dict[str, _Pending] = {}
        self._jobs: dict[str, JobHandle] = {}
        self._outcomes: OrderedDict[str, JobOutcome] = OrderedDict()
        self._approvals: dict[str, ApprovalRequest] = {}
        self._job_streams: set[EventStream[JobEvent]] = set()
        self._approval_streams: set[EventStream[ApprovalRequest]] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._catalog_changed = asyncio.Event()
        self._hint: float | None = None
        self._closed: SessionClosed | None = None

    # ------------------------------------------------------------------ requests

    async def confirm(
        self, approval_id: str, decision: m.Decision, *, timeout: float | None = None
    ) -> m.ConfirmResult:
        """Answer an approval request by id (SPEC A3); see :class:`ApprovalRequest`."""
        req = self._approvals.get(approval_id)
        if req is not None:
            req.decided = decision
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
        self.auth_expiring = None
        return reply.expires_at

    # ------------------------------------------------------------------ sending

    def _next_id(self) -> str:
        return f"r{next(self._ids)}"

    def _check_open(self) -> None:
        if self._closed is not None:
            raise self._closed
        if self._runner is None:
            raise UsageError("the client is not open; use 'async with connect(...)'")

    def _register(self, message: BaseModel, request_id: str) -> _Pending:
        self._check_open()
        pending = _Pending(message, asyncio.get_running_loop().create_future())
        self._requests[request_id] = pending
        return pending

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
        """Send one request and wait for the reply carrying its ``id``.

        Raises:
            RequestRefused: the server answered ``error``.
            RequestTimeout: no reply within ``timeout`` (``None``: the client default).
        """
        request_id = self._next_id()
        pending = self._register(build(request_id), request_id)
        limit = self.request_timeout if timeout is None else timeout
        try:
            await self._send_pending(pending)
            async with asyncio.timeout(limit):
                reply = await pending.future
        except TimeoutError:
            kind = type(pending.message).__name__
            raise RequestTimeout(f"no answer to {kind} within {limit} s") from None
        finally:
            self._requests.pop(request_id, None)
        if not isinstance(reply, expected):
            raise ToolbusClientError(f"unexpected reply {type(reply).__name__} to {request_id}")
        return reply  # type: ignore[return-value]

    async def _send_pending(self, pending: _Pending) -> None:
        """Send now when a socket is up; otherwise the next (re)connect sends it."""
        ws = self._ws
        if ws is None:
            return
        pending.gen = self._gen
        try:
            await ws.send(encode(pending.message), text=True)
        except ConnectionClosed:
            pending.gen = 0

    async def _send(self, message: BaseModel) -> None:
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(ConnectionClosed):
                await ws.send(encode(message), text=True)

    # ------------------------------------------------------------------ tasks and changes

    def _follow(self, handle: JobHandle) -> None:
        """Learn ``handle``'s end through ``job.get`` while it is awaited (SPEC I15);
        implemented by :class:`~toolbus.client_inbound.ClientInbound`."""
        raise NotImplementedError

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _notify_change(self) -> None:
        self._catalog_changed.set()
        self._catalog_changed = asyncio.Event()

    async def _wait_change(self) -> None:
        await self._catalog_changed.wait()
