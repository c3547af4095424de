"""The connection of the toolbus client: handshake, read loop, reconnect and resume
(SPEC K1).

:class:`ClientLink` opens the socket with subprotocol ``toolbus.v1`` and says ``hello``
(SPEC S1), reads frames and acks cumulatively (SPEC D2), and when the socket drops or
the server drains (SPEC S4) reconnects with backoff, resumes with ``session_id``,
``resume_token`` and ``last_seq``, re-sends what still waits for an answer (SPEC I12)
and, after ``resumed: false``, resyncs unfinished jobs through ``job.get`` (SPEC D3).
When the session cannot go on, :meth:`ClientLink._shutdown` fails everything waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Final

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.typing import Subprotocol

from protocol import messages as m
from protocol.codec import decode_server, encode
from protocol.errors import CloseCode, DecodeError, ErrorCode
from toolbus.client_inbound import ClientInbound
from toolbus.errors import ConnectFailed, RequestRefused, SessionClosed, ToolbusClientError
from toolbus.handles import FINISHED, JobOutcome

logger = logging.getLogger(__name__)

SUBPROTOCOL: Final = Subprotocol("toolbus.v1")

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
        CloseCode.CREDENTIAL_EXPIRED,
        CloseCode.CREDENTIAL_REVOKED,
    }
)
"""Close codes after which reconnecting cannot help; others (1001, 1006, 1011, 1012,
1013) are retried with backoff."""

REFUSED_HELLO: Final = frozenset({ErrorCode.AUTH_FAILED, ErrorCode.PROFILE_DENIED})


class ClientLink(ClientInbound):
    """Connects, reads, reconnects and resumes (third layer of
    :class:`toolbus.client.Client`)."""

    _ack_timer: asyncio.TimerHandle | None = None
    """The pending quiet-socket ack check (:meth:`_idle_ack`), if one is armed."""
    _last_frame: float = 0.0
    """Loop time the last frame arrived, in seconds."""

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
        """Process frames until the socket closes; returns its close code and reason.

        An ack is sent every ``ack_every`` durable events, and once the socket has been
        quiet for ``ack_idle`` seconds with an ack pending (SPEC D2). The quiet check is
        one timer per quiet period (:meth:`_idle_ack`), not a timeout around every
        ``recv``: that cost about 5 % of the client's time per frame (issue 13).
        """
        loop = asyncio.get_running_loop()
        try:
            while True:
                raw = await ws.recv(decode=False)
                self._last_frame = loop.time()
                message = decode_server(raw)
                if isinstance(message, DecodeError):
                    logger.warning("undecodable server frame: %s", message)
                    continue
                self._process(message)
                if self.last_seq - self._acked >= self.ack_every:
                    await self._ack(ws)
                elif self._ack_timer is None and self.last_seq > self._acked:
                    due = self._last_frame + self.ack_idle
                    self._ack_timer = loop.call_at(due, self._idle_ack, ws)
        except ConnectionClosed as exc:
            frame = exc.rcvd
            return (None, "") if frame is None else (frame.code, frame.reason)
        finally:
            if self._ack_timer is not None:
                self._ack_timer.cancel()
                self._ack_timer = None

    def _idle_ack(self, ws: ClientConnection) -> None:
        """Timer callback: ack once no frame arrived for ``ack_idle`` seconds (SPEC D2).

        A frame that arrived since the timer was armed moves the deadline: the timer is
        armed again for the rest of the quiet period instead of acking early.
        """
        self._ack_timer = None
        if ws is not self._ws or self.last_seq <= self._acked:
            return
        loop = asyncio.get_running_loop()
        left = self._last_frame + self.ack_idle - loop.time()
        if left > 0:
            # At least 1 ms: uvloop's clock has millisecond steps and can fire a timer
            # a fraction of a step early; a shorter re-arm would spin until it moved.
            self._ack_timer = loop.call_later(max(left, 0.001), self._idle_ack, ws)
            return
        self._spawn(self._ack_quietly(ws))

    async def _ack_quietly(self, ws: ClientConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self._ack(ws)

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
        unfinished jobs ended from ``job.get`` (SPEC D3), polling those still running,
        including jobs that re-sent invokes learn of only now (SPEC I15)."""
        delay = 0.5
        while True:
            waiting = [h for h in self._jobs.values() if not h.done()]
            # A re-sent invoke may still be answered with a recorded `dispatched` (SPEC
            # I15): its job's events went to the lost session, so keep polling for it.
            resent = any(p.resent and not p.future.done() for p in self._invokes.values())
            if (not waiting and not resent) or self._closed is not None:
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
            delay = min(delay * 2, self.backoff.cap) if waiting else 0.5

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


def _close_text(exc: ConnectionClosed) -> str:
    frame = exc.rcvd
    return f"{frame.code} {frame.reason}".strip() if frame is not None else "no close frame"
