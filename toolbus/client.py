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

:class:`Client` holds five parts, each built once from the few things it uses:
:class:`~toolbus.client_calls.Calls` (what waits for an answer, re-sent after a
reconnect), :class:`~toolbus.client_jobs.Jobs` (job handles, following through
``job.get``, resync), :class:`~toolbus.client_approvals.Approvals`,
:class:`~toolbus.client_inbound.Inbound` (each server message by type, ``seq``, the
catalog) and :class:`~toolbus.client_link.Link` (handshake, read loop, acks,
reconnect, resume). Two modules make the client itself:

- :mod:`toolbus.client_base`: settings, requests answered by one reply; builds the
  parts and ends the session for all of them.
- this module: the public front (open, close, invoke, cancel, streams) and
  :func:`connect`. Every public toolbus name importable here before the split still
  is: the ones that moved are re-exported (``import X as X``, explicit for mypy).
"""

# ASYNC109: the public API takes ``timeout=`` arguments on purpose (SPEC K1: every wait
# that can hang is bounded by the caller); each is applied with asyncio.timeout().
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from websockets.exceptions import ConnectionClosed

from protocol import messages as m
from protocol.codec import encode
from toolbus.client_base import ApprovalCallback as ApprovalCallback
from toolbus.client_base import ClientBase
from toolbus.client_base import ExpiringCallback as ExpiringCallback
from toolbus.client_base import JobCallback as JobCallback
from toolbus.client_base import MessageCallback as MessageCallback
from toolbus.client_base import R as R
from toolbus.client_jobs import KEEP_OUTCOMES as KEEP_OUTCOMES
from toolbus.client_link import REFUSED_HELLO as REFUSED_HELLO
from toolbus.client_link import SUBPROTOCOL as SUBPROTOCOL
from toolbus.client_link import TERMINAL_CLOSES as TERMINAL_CLOSES
from toolbus.errors import ConnectFailed, RequestTimeout, SessionClosed, UsageError
from toolbus.errors import RequestRefused as RequestRefused
from toolbus.errors import ToolbusClientError as ToolbusClientError
from toolbus.errors import call_error as call_error
from toolbus.handles import FINISHED as FINISHED
from toolbus.handles import ApprovalRequest, EventStream, JobEvent, JobHandle
from toolbus.handles import Backoff as Backoff
from toolbus.handles import JobOutcome as JobOutcome

logger = logging.getLogger(__name__)


def new_call_id() -> str:
    """A fresh ``call_id``: ``c-``, the wall clock in nanoseconds as 16 hex digits, ``-``
    and 64 random bits as 16 hex digits (35 characters; SPEC I12, I15 ask only that a
    user's ids be unique within the server's ``calls.call_id_window``).

    The time first keeps one user's ids in the order they were made, so the server's
    stores append a call's rows beside the last call's in their ``call_id`` indexes
    (SPEC I15's ledger is keyed by user and ``call_id``) instead of at a random place:
    128 random bits cost the SQLite store a dirtied index page per call (issue 13,
    docs/bench.md). The random part keeps ids of the same nanosecond, or of clocks
    that step back, apart.
    """
    return f"c-{time.time_ns():016x}-{os.urandom(8).hex()}"


class Client(ClientBase):
    """A toolbus session over a self-healing WebSocket (SPEC K1).

    The requests answered by one reply (:meth:`confirm`, :meth:`refresh_catalog`,
    :meth:`jobs`, :meth:`job`, :meth:`cancel_job`, :meth:`grants`, :meth:`revoke`,
    :meth:`update_context`, :meth:`refresh_credentials`) are inherited from
    :class:`~toolbus.client_base.ClientBase`.

    Args:
        url: the server's WebSocket URL, e.g. ``ws://127.0.0.1:8765/``.
        token: the credential sent in ``hello`` (never in the URL, SPEC S2).
        profile: the profile to take; ``None`` lets the server pick the only one granted.
        context: the session context (e.g. ``{"project_id": "p1"}``, SPEC S5).
        confirm_tool_calls: ask for approval of every call (SPEC A1).
        tool_start: hello option ``tool_start`` (SPEC A6): ``ALL`` to receive
            ``tool_start`` for every call, ``GATED`` for calls that wait for approval
            only. ``None`` (default): ``GATED`` without ``on_message`` (the client acts
            on gated ones only, so nothing changes but one frame less per call),
            ``ALL`` with it.
        on_approval: callback for each approval request; see :data:`ApprovalCallback`.
        on_job_event: called with every job event (progress and terminal), in order.
        on_message: called with every server message after the client processed it
            (useful for consoles and logs).
        on_auth_expiring: called with ``auth.expiring`` (SPEC S6); may return a fresh
            credential to send with ``auth.refresh``; see :data:`ExpiringCallback`.
        on_elicitation: called with each ``elicit.request`` of a running tool (SPEC M3);
            returns ``(action, content)``; see :data:`ElicitationCallback`.
        reconnect: reconnect and resume when the socket drops (default ``True``).
        backoff: delays between reconnect attempts.
        connect_timeout: seconds for one connect + ``hello`` + ``welcome``.
        request_timeout: default seconds to wait for a request's reply; ``None`` waits
            forever.
        ack_every: send an ``ack`` at least every this many durable events.
        ack_idle: send a pending ``ack`` once no frame arrived for this many seconds.
        ws_options: extra keyword arguments for ``websockets.asyncio.client.connect``.
    """

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
                ws, welcome = await self._link.handshake()
                self._link.attach(ws, welcome)
                self._runner = asyncio.create_task(self._link.run(ws), name="toolbus-client")
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
                        await ws.send(encode(m.Bye(id=self._calls.next_id())), text=True)
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
        call_id = call_id or new_call_id()
        message = m.Invoke(
            call_id=call_id,
            tool=tool,
            params=dict(params) if params is not None else None,
            catalog_version=catalog_version,
        )
        pending = self._calls.start_invoke(message)
        try:
            await self._calls.send(pending)
            if timeout is None:  # no timer to arm and cancel on every call
                answer: m.Result | JobHandle = await pending.future
                return answer
            async with asyncio.timeout(timeout):
                answer = await pending.future
                return answer
        except TimeoutError:
            text = f"call {call_id} ({tool}) did not end within {timeout} s"
            raise RequestTimeout(text) from None
        finally:
            if self._calls.invokes.get(call_id) is pending:
                del self._calls.invokes[call_id]

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
        request_id = self._calls.next_id()
        pending = self._calls.register(m.CallCancel(id=request_id, call_id=call_id), request_id)
        try:
            await self._calls.send(pending)
            await self._request(lambda rid: m.GrantsList(id=rid), m.Grants, timeout)
        finally:
            self._calls.requests.pop(request_id, None)
        if pending.future.done():
            pending.future.result()  # raises the refusal

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
        return self._approvals.stream()

    @property
    def pending_approvals(self) -> list[ApprovalRequest]:
        """Approval requests not settled yet, oldest first."""
        return self._approvals.waiting()

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


def connect(url: str, **options: Any) -> Client:
    """Create a :class:`Client`; use it as ``async with connect(url, ...) as bus``.

    Args:
        url: the server's WebSocket URL.
        **options: keyword arguments of :class:`Client` (``token``, ``profile``,
            ``context``, ``confirm_tool_calls``, ``on_approval``, ...).
    """
    return Client(url, **options)
