"""The asyncio client of toolbus protocol v1 (SPEC K1).

One :class:`Client` holds one session over one WebSocket at a time::

    async with toolbus.connect(url, token="...", profile="demo") as bus:
        out = await bus.invoke("convert_units", {"value": 1, "from_unit": "km", "to_unit": "m"})

What it does for its caller:

- **Handshake** (SPEC S1): subprotocol ``toolbus.v1``, ``hello``, ``welcome``, then the
  initial ``catalog``; :meth:`Client.open` returns once the catalog is known.
- **Calls** (SPEC I1-I14): :meth:`Client.invoke` waits for the call's one terminal
  event: ``result`` (returned as :class:`protocol.messages.Result`, also when declined,
  SPEC A5), ``dispatched`` (returned as a :class:`~toolbus.handles.JobHandle`) or
  ``call.error`` (raised as a typed :mod:`toolbus.errors` exception).
- **Approvals** (SPEC A2-A6): each ``tool_start`` with an ``approval_id`` becomes an
  :class:`~toolbus.handles.ApprovalRequest`, handed to the ``on_approval`` callback or
  to :meth:`Client.approvals` iterators.
- **Delivery** (SPEC D1-D3): every durable event (one with ``seq``) is processed once,
  in order; the client acks cumulatively (every ``ack_every`` events, or when the socket
  goes quiet for ``ack_idle`` seconds). When the socket drops, or the server drains with
  a ``reconnect`` hint and a 1012 close (SPEC S4), the client reconnects with
  exponential backoff and full jitter and resumes with ``session_id``, ``resume_token``
  and ``last_seq`` (the highest seq processed). Calls and requests still waiting are
  re-sent with the same ``call_id`` / request ``id``: the server answers a finished call
  with its recorded outcome (SPEC I12), which resolves the waiting call even though its
  seq was already processed. On ``resumed: false`` the client starts over with the new
  session and resyncs its unfinished jobs through ``job.get`` (SPEC D3).
"""

# ASYNC109: the public API takes ``timeout=`` arguments on purpose (SPEC K1: every wait
# that can hang is bounded by the caller); each is applied with asyncio.timeout().
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.typing import Subprotocol

from protocol import messages as m
from protocol.codec import decode_server, encode
from protocol.errors import CloseCode, DecodeError, ErrorCode
from toolbus.errors import (
    ConnectFailed,
    RequestRefused,
    RequestTimeout,
    SessionClosed,
    ToolbusClientError,
    UsageError,
    call_error,
)
from toolbus.handles import (
    FINISHED,
    ApprovalRequest,
    Backoff,
    EventStream,
    JobEvent,
    JobHandle,
    JobOutcome,
)

logger = logging.getLogger("toolbus.client")

SUBPROTOCOL: Final = Subprotocol("toolbus.v1")

ApprovalCallback = Callable[[ApprovalRequest], "m.Decision | Awaitable[m.Decision | None] | None"]
"""``on_approval(req)``: return a :class:`~protocol.messages.Decision` to answer at once,
or ``None`` to leave the request to :meth:`Client.approvals` or a later ``req.allow()``.
May be a plain function or a coroutine function."""

JobCallback = Callable[[JobEvent], object]
MessageCallback = Callable[[BaseModel], object]

TERMINAL_CLOSES: Final = frozenset(
    {
        CloseCode.NORMAL_CLOSURE,
        CloseCode.PROTOCOL_ERROR,
        CloseCode.UNSUPPORTED_DATA,
        CloseCode.INVALID_FRAME_PAYLOAD_DATA,
        CloseCode.POLICY_VIOLATION,
        CloseCode.MESSAGE_TOO_BIG,
        CloseCode.SESSION_REPLACED,
        CloseCode.SESSION_ENDED,
        CloseCode.AUTH_FAILED,
    }
)
"""Close codes after which reconnecting cannot help; others (1001, 1006, 1011, 1012,
1013) are retried with backoff."""

REFUSED_HELLO: Final = frozenset({ErrorCode.AUTH_FAILED, ErrorCode.PROFILE_DENIED})
KEEP_OUTCOMES: Final = 1000
"""Finished job outcomes remembered for handles created late (recorded re-sends)."""

R = TypeVar("R", bound=BaseModel)


@dataclass(slots=True, eq=False)
class _Pending:
    """A message waiting for its answer; ``gen`` is the connection it was last sent on
    (0: not sent on any live one yet), so a reconnect re-sends what it must."""

    message: BaseModel
    future: asyncio.Future[Any]
    gen: int = 0
    resent: bool = False


class Client:
    """A toolbus session over a self-healing WebSocket (SPEC K1).

    Args:
        url: the server's WebSocket URL, e.g. ``ws://127.0.0.1:8765/``.
        token: the credential sent in ``hello`` (never in the URL, SPEC S2).
        profile: the profile to take; ``None`` lets the server pick the only one granted.
        context: the session context (e.g. ``{"project_id": "p1"}``, SPEC S5).
        confirm_tool_calls: ask for approval of every call (SPEC A1).
        on_approval: callback for each approval request; see :data:`ApprovalCallback`.
        on_job_event: called with every job event (progress and terminal), in order.
        on_message: called with every server message after the client processed it
            (useful for consoles and logs).
        reconnect: reconnect and resume when the socket drops (default ``True``).
        backoff: delays between reconnect attempts.
        connect_timeout: seconds for one connect + ``hello`` + ``welcome``.
        request_timeout: default seconds to wait for a request's reply; ``None`` waits
            forever.
        ack_every: send an ``ack`` at least every this many durable events.
        ack_idle: send a pending ``ack`` once no frame arrived for this many seconds.
        ws_options: extra keyword arguments for ``websockets.asyncio.client.connect``.
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

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Client:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> Client:
        """Connect, say hello, and wait for the initial catalog (SPEC S1, C3).

        Returns:
            ``self``.

        Raises:
            ConnectFailed: the server is unreachable, refused the upgrade, refused the
                hello (``auth_failed``, ``profile_denied``, ...), or did not answer
                within ``connect_timeout``.
        """
        if self._runner is not None:
            raise UsageError("this client is already open")
        try:
            async with asyncio.timeout(self.connect_timeout):
                ws, welcome = await self._handshake()
                self._attach(ws, welcome)
                self._runner = asyncio.create_task(self._run(ws), name="toolbus-client")
                while self.catalog_version is None and self._closed is None:
                    await self._wait_change()
        except TimeoutError:
            await self.close(end_session=False)
            raise ConnectFailed(f"no welcome and catalog within {self.connect_timeout} s") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {self.url}: {exc}") from exc
        if self._closed is not None:
            raise ConnectFailed(str(self._closed))
        return self

    async def close(self, *, end_session: bool = True, timeout: float = 5.0) -> None:
        """Stop the client; waiting calls and requests fail with :class:`SessionClosed`.

        Args:
            end_session: send ``bye`` first, so the server ends the session now (pending
                approvals denied, no resume, SPEC A4) instead of parking it for the
                resume window.
            timeout: seconds allowed for the goodbye and the closing handshake.
        """
        if self._stop.is_set():
            return
        self._stop.set()
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(ConnectionClosed, TimeoutError, OSError):
                async with asyncio.timeout(timeout):
                    if end_session:
                        await ws.send(encode(m.Bye(id=self._next_id())), text=True)
                    elif self._acked < self.last_seq:
                        await ws.send(encode(m.Ack(seq=self.last_seq)), text=True)
                    await ws.close()
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        self._shutdown(SessionClosed("the client was closed"))

    @property
    def closed(self) -> bool:
        """Whether the client stopped for good."""
        return self._closed is not None

    @property
    def connected(self) -> bool:
        """Whether a socket is attached right now."""
        return self._ws is not None

    # ------------------------------------------------------------------ calls (SPEC I)

    async def invoke(
        self,
        tool: str,
        params: Mapping[str, Any] | None = None,
        *,
        call_id: str | None = None,
        timeout: float | None = None,
        catalog_version: str | None = None,
    ) -> m.Result | JobHandle:
        """Call a tool and wait for its terminal event (SPEC I1-I14).

        Args:
            tool: the tool name.
            params: its arguments (a JSON object); ``None`` is validated as ``{}``.
            call_id: the call's id, unique in the session; a random one when ``None``.
                Re-using the id of a finished call returns its recorded outcome (I12).
            timeout: seconds to wait, including any approval wait; ``None`` waits as
                long as it takes. A timeout stops waiting; it does not cancel the call
                (use :meth:`cancel`).
            catalog_version: the catalog version the model was given (SPEC I13).

        Returns:
            The ``result`` message for a sync call (``declined`` true when the user
            denied it, SPEC A5), or a :class:`JobHandle` when the call was dispatched
            as a job (async tool, or a sync call promoted past its soft deadline, I14).

        Raises:
            CallFailed: the call ended with ``call.error``; the subclass names the code
                (:class:`UnknownTool`, :class:`InvalidParams`, ...).
            RequestRefused: the invoke was refused before it started
                (``rate_limited``, ``too_many_inflight``, ``duplicate_call``).
            RequestTimeout: no terminal event within ``timeout``.
            SessionClosed: the client stopped first.
            UsageError: ``call_id`` is already waiting in this client.
        """
        self._check_open()
        call_id = call_id or f"c-{uuid.uuid4().hex}"
        if call_id in self._invokes:
            raise UsageError(f"call_id {call_id!r} is already in flight")
        message = m.Invoke(
            call_id=call_id,
            tool=tool,
            params=dict(params) if params is not None else None,
            catalog_version=catalog_version,
        )
        pending = _Pending(message, asyncio.get_running_loop().create_future())
        self._invokes[call_id] = pending
        try:
            await self._send_pending(pending)
            async with asyncio.timeout(timeout):
                answer: m.Result | JobHandle = await pending.future
                return answer
        except TimeoutError:
            text = f"call {call_id} ({tool}) did not end within {timeout} s"
            raise RequestTimeout(text) from None
        finally:
            if self._invokes.get(call_id) is pending:
                del self._invokes[call_id]

    async def cancel(self, call_id: str, *, timeout: float | None = None) -> None:
        """Cancel a running or approval-pending call (SPEC I8, A4).

        The call itself then ends with ``call.error`` ``cancelled`` (its waiter raises
        :class:`~toolbus.errors.Cancelled`). A ``grants.list`` sent right behind the
        cancel serves as a barrier: the server answers in order, so once it is answered
        an ``unknown_call`` refusal would have arrived.

        Raises:
            RequestRefused: ``unknown_call``: no such call is running.
            RequestTimeout: no answer within ``timeout`` (default: the request timeout).
        """
        request_id = self._next_id()
        pending = self._register(m.CallCancel(id=request_id, call_id=call_id), request_id)
        try:
            await self._send_pending(pending)
            await self._request(lambda rid: m.GrantsList(id=rid), m.Grants, timeout)
        except BaseException:
            self._requests.pop(request_id, None)
            raise
        self._requests.pop(request_id, None)
        if pending.future.done():
            pending.future.result()  # raises the refusal

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

    # ------------------------------------------------------------------ requests

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
        """One of the caller's jobs (SPEC J3). Raises :class:`RequestRefused`
        (``unknown_job``) for a job that is not the caller's."""
        reply = await self._request(lambda rid: m.JobGet(id=rid, job_id=job_id), m.Job, timeout)
        return reply.job

    async def cancel_job(self, job_id: str, *, timeout: float | None = None) -> m.JobInfo:
        """Cancel one of the caller's jobs (SPEC J3); its handle then ends ``cancelled``.
        Raises :class:`RequestRefused` (``unknown_job``, ``job_finished``)."""
        reply = await self._request(lambda rid: m.JobCancel(id=rid, job_id=job_id), m.Job, timeout)
        return reply.job

    async def grants(self, *, timeout: float | None = None) -> list[str]:
        """This session's "always allow" tools (SPEC A3)."""
        reply = await self._request(lambda rid: m.GrantsList(id=rid), m.Grants, timeout)
        return list(reply.tools)

    async def revoke(self, tool: str, *, timeout: float | None = None) -> list[str]:
        """Revoke the "always allow" grant of ``tool``; returns the remaining grants.
        Raises :class:`RequestRefused` (``unknown_grant``)."""
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

    # ------------------------------------------------------------------ streams

    def job_events(self) -> EventStream[JobEvent]:
        """An async iterator of job events (``job.progress``, ``job.done``,
        ``job.failed``, ``job.cancelled``; SPEC J2, J4), each delivered once.

        The stream receives events from the moment this method is called; create it
        before starting the jobs you want to follow.
        """
        return EventStream(self._job_streams)

    def approvals(self) -> EventStream[ApprovalRequest]:
        """An async iterator of approval requests (SPEC A2), starting with those still
        pending and undecided. Answer with ``await req.allow()`` / ``deny()`` /
        ``allow_always()``. Requests an ``on_approval`` callback answered are not
        delivered here."""
        stream: EventStream[ApprovalRequest] = EventStream(self._approval_streams)
        for req in self._approvals.values():
            if not req.settled and req.decided is None and not req.handled:
                stream.put(req)
        return stream

    @property
    def pending_approvals(self) -> list[ApprovalRequest]:
        """Approval requests not settled yet, oldest first."""
        return [req for req in self._approvals.values() if not req.settled]

    def tool(self, name: str) -> m.ToolInfo | None:
        """The catalog entry of ``name``, or ``None`` when the session cannot see it."""
        return next((t for t in self.catalog if t.name == name), None)

    async def wait_catalog(
        self, predicate: Callable[[list[m.ToolInfo]], bool], *, timeout: float | None = None
    ) -> list[m.ToolInfo]:
        """Wait until ``predicate(catalog)`` holds (pushes keep the catalog current, C3).

        Raises:
            RequestTimeout: it did not hold within ``timeout`` seconds.
        """
        try:
            async with asyncio.timeout(timeout):
                while not predicate(self.catalog):
                    self._check_open()
                    await self._wait_change()
        except TimeoutError:
            raise RequestTimeout(f"catalog condition not met within {timeout} s") from None
        return self.catalog

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

    # ------------------------------------------------------------------ connection

    def _hello(self) -> m.Hello:
        resume = self.session_id is not None and self._resume_token is not None
        return m.Hello(
            id=self._next_id(),
            token=self._token,
            profile=self.profile,
            context=self.context,
            options=m.Options(confirm_tool_calls=self.confirm_tool_calls),
            session_id=self.session_id if resume else None,
            resume_token=self._resume_token if resume else None,
            last_seq=self.last_seq if resume else None,
        )

    async def _handshake(self) -> tuple[ClientConnection, m.Welcome]:
        """Open a socket, send ``hello``, read ``welcome`` (SPEC S1, D3).

        Raises:
            ConnectFailed: refused upgrade, refused hello, or a close before welcome.
            OSError: the network failed.
        """
        options: dict[str, Any] = {"max_size": None, "compression": None, **self._ws_options}
        try:
            ws = await ws_connect(self.url, subprotocols=[SUBPROTOCOL], **options)
        except InvalidHandshake as exc:
            raise ConnectFailed(f"upgrade refused: {exc}") from exc
        try:
            await ws.send(encode(self._hello()), text=True)
            raw = await ws.recv(decode=False)
        except ConnectionClosed as exc:
            raise ConnectFailed(f"closed before welcome ({_close_text(exc)})") from exc
        message = decode_server(raw)
        if isinstance(message, m.Welcome):
            return ws, message
        await ws.close()
        if isinstance(message, m.Error):
            raise ConnectFailed(f"hello refused: {message.code}: {message.message}", message.code)
        raise ConnectFailed(f"expected welcome, got {message!r}")

    def _attach(self, ws: ClientConnection, welcome: m.Welcome) -> None:
        """Make ``ws`` the live socket; on a fresh session, start the seq count over."""
        if self._gen:
            self.reconnects += 1
        if not welcome.resumed:
            if self.session_id is not None:
                logger.info(
                    "session %s not resumed; new session %s", self.session_id, welcome.session_id
                )
            self.last_seq = self._acked = 0
            self._drop_approvals()
        self._ws, self._gen, self.welcome = ws, self._gen + 1, welcome
        self.session_id, self._resume_token = welcome.session_id, welcome.resume_token

    async def _run(self, ws: ClientConnection) -> None:
        """Read the socket; reconnect and resume while the session can go on."""
        while True:
            code, reason = await self._read(ws)
            self._ws = None
            if self._stop.is_set():
                return
            if not self.reconnect or code in TERMINAL_CLOSES:
                text = f"closed by the server: {code} {reason}".strip()
                self._shutdown(SessionClosed(text, code, reason))
                return
            logger.info("socket closed (%s %s); reconnecting", code, reason)
            resumed = await self._reconnect()
            if resumed is None:
                return
            ws = resumed

    async def _read(self, ws: ClientConnection) -> tuple[int | None, str]:
        """Process frames until the socket closes; returns its close code and reason."""
        try:
            while True:
                raw = await self._recv(ws)
                if raw is None:
                    await self._ack(ws)
                    continue
                message = decode_server(raw)
                if isinstance(message, DecodeError):
                    logger.warning("undecodable server frame: %s", message)
                    continue
                self._process(message)
                if self.last_seq - self._acked >= self.ack_every:
                    await self._ack(ws)
        except ConnectionClosed as exc:
            frame = exc.rcvd
            return (None, "") if frame is None else (frame.code, frame.reason)

    async def _recv(self, ws: ClientConnection) -> bytes | None:
        """The next frame, or ``None`` when an ack is due and the socket went quiet."""
        if self._acked >= self.last_seq:
            raw = await ws.recv(decode=False)
            return raw
        try:
            async with asyncio.timeout(self.ack_idle):
                # Cancelling recv() is safe in websockets' asyncio implementation.
                raw = await ws.recv(decode=False)
                return raw
        except TimeoutError:
            return None

    async def _ack(self, ws: ClientConnection) -> None:
        """Cumulative ack of everything processed (SPEC D2)."""
        seq = self.last_seq
        if seq > self._acked:
            await ws.send(encode(m.Ack(seq=seq)), text=True)
            self._acked = seq

    async def _reconnect(self) -> ClientConnection | None:
        """Reconnect with backoff and resume (SPEC D3); ``None`` when giving up."""
        attempt = 0
        while not self._stop.is_set():
            limit = self.backoff.max_attempts
            if limit is not None and attempt >= limit:
                self._shutdown(SessionClosed(f"gave up reconnecting after {attempt} attempts"))
                return None
            delay = self._hint if self._hint is not None else self.backoff.delay(attempt)
            self._hint = None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stop.wait()
                return None
            attempt += 1
            try:
                async with asyncio.timeout(self.connect_timeout):
                    ws, welcome = await self._handshake()
            except ConnectFailed as exc:
                if exc.code in REFUSED_HELLO:
                    self._shutdown(SessionClosed(f"reconnect refused: {exc}"))
                    return None
                logger.info("reconnect attempt %d failed: %s", attempt, exc)
                continue
            except (OSError, TimeoutError) as exc:
                logger.info("reconnect attempt %d failed: %s", attempt, exc)
                continue
            self._attach(ws, welcome)
            if not welcome.resumed:
                self._spawn(self._resync())
            await self._resend()
            return ws
        return None

    async def _resend(self) -> None:
        """Re-send what still waits for an answer: invokes with the same ``call_id``
        (SPEC I12 makes that safe), then requests with the same ``id``."""
        for pending in [*self._invokes.values(), *self._requests.values()]:
            if pending.gen < self._gen and not pending.future.done():
                pending.resent = True
                await self._send_pending(pending)

    async def _resync(self) -> None:
        """After ``resumed: false``: the old session's pushes are gone, so learn how
        unfinished jobs ended from ``job.get`` (SPEC D3), polling those still running."""
        delay = 0.5
        while True:
            waiting = [h for h in self._jobs.values() if not h.done()]
            if not waiting or self._closed is not None:
                return
            for handle in waiting:
                try:
                    info = await self.job(handle.job_id)
                except RequestRefused as exc:
                    handle._fail(exc)
                    continue
                except ToolbusClientError:
                    return
                if info.state in FINISHED:
                    self._job_ended(JobOutcome.from_info(info))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stop.wait()
            delay = min(delay * 2, self.backoff.cap)

    def _shutdown(self, reason: SessionClosed) -> None:
        """Fail everything still waiting and end every stream; the client is done."""
        if self._closed is not None:
            return
        self._closed = reason
        self._ws = None
        self._stop.set()
        for pending in [*self._invokes.values(), *self._requests.values()]:
            if not pending.future.done():
                pending.future.set_exception(reason)
                pending.future.exception()
        for handle in self._jobs.values():
            handle._fail(reason)
        for jobs in list(self._job_streams):
            jobs.close()
        for approvals in list(self._approval_streams):
            approvals.close()
        self._drop_approvals()
        for task in self._tasks:
            task.cancel()
        self._notify_change()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _notify_change(self) -> None:
        self._catalog_changed.set()
        self._catalog_changed = asyncio.Event()

    async def _wait_change(self) -> None:
        await self._catalog_changed.wait()

    # ------------------------------------------------------------------ processing

    def _process(self, message: BaseModel) -> None:
        """Handle one server message; durable events exactly once by ``seq`` (D1-D3)."""
        seq = getattr(message, "seq", None)
        if seq is not None:
            if seq <= self.last_seq:
                self._late(message)
                return
            if seq != self.last_seq + 1:
                logger.warning("seq gap: %d after %d", seq, self.last_seq)
            self.last_seq = seq
        handler = self._HANDLERS.get(type(message))
        if handler is not None:
            handler(self, message)
        if self._on_message is not None:
            self._call(self._on_message, message)

    def _late(self, message: BaseModel) -> None:
        """An already-processed seq: only a recorded outcome re-sent for a waiting
        invoke (SPEC I12) still counts, and only for that invoke."""
        call_id = getattr(message, "call_id", None)
        if isinstance(message, m.Result | m.Dispatched | m.CallError) and call_id in self._invokes:
            self._HANDLERS[type(message)](self, message)

    def _call(self, callback: Callable[[Any], object], arg: Any) -> None:
        try:
            outcome = callback(arg)
        except Exception:
            logger.exception("callback %r raised", callback)
            return
        if inspect.isawaitable(outcome):
            self._spawn(outcome)

    def _answer(self, request_id: str | None, reply: BaseModel) -> None:
        pending = self._requests.get(request_id) if request_id else None
        if pending is not None and not pending.future.done():
            pending.future.set_result(reply)

    def _finish_call(self, call_id: str, outcome: Any, error: BaseException | None = None) -> None:
        pending = self._invokes.get(call_id)
        if pending is None or pending.future.done():
            return
        if error is not None:
            pending.future.set_exception(error)
        else:
            pending.future.set_result(outcome)

    def _on_catalog(self, msg: m.Catalog) -> None:
        self.catalog, self.catalog_version = list(msg.tools), msg.version
        self._notify_change()
        self._answer(msg.id, msg)

    def _on_not_modified(self, msg: m.CatalogNotModified) -> None:
        self._answer(msg.id, msg)

    def _on_tool_start(self, msg: m.ToolStart) -> None:
        if msg.approval_id is None:
            return
        req = ApprovalRequest(self, msg)
        self._approvals[req.approval_id] = req
        if self._on_approval is not None:
            self._spawn(self._ask(req, self._on_approval))
        else:
            self._offer(req)

    async def _ask(self, req: ApprovalRequest, callback: ApprovalCallback) -> None:
        """Run the approval callback; a returned decision is sent at once (SPEC A3)."""
        try:
            decision = callback(req)
            if inspect.isawaitable(decision):
                decision = await decision
        except Exception:
            logger.exception("approval callback raised; the request stays pending")
            decision = None
        if decision is None:
            self._offer(req)
            return
        req.handled = True
        if req.decided is None and not req.settled:
            try:
                await req.decide(m.Decision(decision))
            except ToolbusClientError as exc:
                logger.warning("could not send the decision for %s: %s", req.approval_id, exc)

    def _offer(self, req: ApprovalRequest) -> None:
        for stream in list(self._approval_streams):
            stream.put(req)

    def _on_resolved(self, msg: m.ToolResolved) -> None:
        req = self._approvals.pop(msg.approval_id, None)
        if req is not None:
            req._settle(msg)

    def _drop_approvals(self) -> None:
        """The session holding these approvals is gone (SPEC A4: they are denied)."""
        for req in self._approvals.values():
            req._settle(None)
        self._approvals.clear()

    def _on_result(self, msg: m.Result) -> None:
        self._finish_call(msg.call_id, msg)

    def _on_dispatched(self, msg: m.Dispatched) -> None:
        handle = self._jobs.get(msg.job_id)
        if handle is None:
            handle = JobHandle(self, msg)
            self._jobs[msg.job_id] = handle
            known = self._outcomes.get(msg.job_id)
            if known is not None:
                handle._resolve(known)
        self._finish_call(msg.call_id, handle)

    def _on_call_error(self, msg: m.CallError) -> None:
        self._finish_call(msg.call_id, None, call_error(msg))

    def _on_job_event(self, msg: JobEvent) -> None:
        handle = self._jobs.get(msg.job_id)
        if isinstance(msg, m.JobProgress):
            if handle is not None:
                handle.progress = (msg.progress, msg.message)
        else:
            self._job_ended(JobOutcome.from_event(msg))
        for stream in list(self._job_streams):
            stream.put(msg)
        if self._job_callback is not None:
            self._call(self._job_callback, msg)

    def _job_ended(self, outcome: JobOutcome) -> None:
        self._outcomes[outcome.job_id] = outcome
        while len(self._outcomes) > KEEP_OUTCOMES:
            self._outcomes.popitem(last=False)
        handle = self._jobs.pop(outcome.job_id, None)
        if handle is not None:
            handle._resolve(outcome)

    def _on_error(self, msg: m.Error) -> None:
        """``error``: a refused request (by ``id``) or a refused invoke (by
        ``details.call_id``). A re-sent invoke refused ``duplicate_call`` is still
        running on the server: keep waiting for its terminal event."""
        refused = RequestRefused(msg)
        pending = self._requests.get(msg.id) if msg.id else None
        if pending is None:
            call_id = (msg.details or {}).get("call_id")
            pending = self._invokes.get(call_id) if isinstance(call_id, str) else None
            if pending is not None and pending.resent and msg.code is ErrorCode.DUPLICATE_CALL:
                return
        if pending is not None and not pending.future.done():
            pending.future.set_exception(refused)
            return
        logger.warning("server error not tied to a request: %s: %s", msg.code, msg.message)

    def _on_reply(self, msg: m.ConfirmResult | m.Grants | m.Job | m.Jobs | m.Context) -> None:
        self._answer(msg.id, msg)

    def _on_reconnect(self, msg: m.Reconnect) -> None:
        """SPEC S4: the server drains; wait ``retry_after`` before reconnecting."""
        self._hint = max(0.0, msg.retry_after)

    _HANDLERS: Final[dict[type[BaseModel], Callable[[Client, Any], None]]] = {
        m.Catalog: _on_catalog,
        m.CatalogNotModified: _on_not_modified,
        m.ToolStart: _on_tool_start,
        m.ToolResolved: _on_resolved,
        m.Result: _on_result,
        m.Dispatched: _on_dispatched,
        m.CallError: _on_call_error,
        m.JobProgress: _on_job_event,
        m.JobDone: _on_job_event,
        m.JobFailed: _on_job_event,
        m.JobCancelled: _on_job_event,
        m.Error: _on_error,
        m.ConfirmResult: _on_reply,
        m.Grants: _on_reply,
        m.Job: _on_reply,
        m.Jobs: _on_reply,
        m.Context: _on_reply,
        m.Reconnect: _on_reconnect,
    }
    """Message class -> handler: one table instead of an if/elif chain."""


def _close_text(exc: ConnectionClosed) -> str:
    frame = exc.rcvd
    return f"{frame.code} {frame.reason}".strip() if frame is not None else "no close frame"


def connect(url: str, **options: Any) -> Client:
    """Create a :class:`Client`; use it as ``async with connect(url, ...) as bus``.

    Args:
        url: the server's WebSocket URL.
        **options: keyword arguments of :class:`Client` (``token``, ``profile``,
            ``context``, ``confirm_tool_calls``, ``on_approval``, ...).
    """
    return Client(url, **options)
