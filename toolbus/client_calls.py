"""What the client waits for: invokes by ``call_id``, requests by ``id`` (SPEC K1, I12).

:class:`Calls` is one part of :class:`toolbus.client.Client`. It pairs each message
it sends with the answer carrying the same id, remembers on which connection each was
last sent, so a reconnect re-sends exactly what never reached a live socket or was not
answered (SPEC I12 makes a re-sent ``invoke`` safe), and fails everything waiting when
the session ends. It is built with two things: a way to read the current socket and its
generation, and the client's "is it open" check.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from protocol import messages as m
from protocol.codec import encode, encode_json
from protocol.errors import ErrorCode
from toolbus.errors import RequestRefused, RequestTimeout, ToolbusClientError, UsageError

R = TypeVar("R", bound=BaseModel)

Socket = Callable[[], "tuple[ClientConnection | None, int]"]
"""The live socket (``None`` between connections) and its generation (1, 2, ...)."""


@dataclass(slots=True, eq=False)
class Pending:
    """A message waiting for its answer; ``gen`` is the connection it was last sent on
    (0: not sent on any live one yet), so a reconnect re-sends what it must."""

    message: BaseModel
    future: asyncio.Future[Any]
    gen: int = 0
    resent: bool = False


def frame_of(message: BaseModel) -> bytes:
    """The bytes of ``message`` as :func:`protocol.codec.encode` writes them.

    An ``invoke`` (one per call) is written from its fields without pydantic's
    ``model_dump`` (1.4 against 3.8 us, issue 13): the same keys in the same order,
    ``None`` fields left out, ``params`` as the model holds it. A ``params`` value the
    JSON encoder does not take as it is (a pydantic model) goes through ``encode``.
    """
    if type(message) is not m.Invoke:
        return encode(message)
    fields: dict[str, Any] = {"type": "invoke"}
    if message.id is not None:
        fields["id"] = message.id
    fields["call_id"] = message.call_id
    fields["tool"] = message.tool
    if message.params is not None:
        fields["params"] = message.params
    if message.catalog_version is not None:
        fields["catalog_version"] = message.catalog_version
    try:
        return encode_json(fields)
    except TypeError:  # orjson.JSONEncodeError: let pydantic turn the value into JSON
        return encode(message)


class Calls:
    """Invokes and requests waiting for their answer (SPEC K1, I12).

    Args:
        socket: returns the live socket (or ``None``) and its generation.
        check_open: raises when the client is not open (closed, or never opened).
    """

    def __init__(self, socket: Socket, check_open: Callable[[], None]) -> None:
        self._socket = socket
        self._check_open = check_open
        self._ids = itertools.count(1)
        self.invokes: dict[str, Pending] = {}
        """``call_id`` -> the invoke waiting for its terminal event."""
        self.requests: dict[str, Pending] = {}
        """Request ``id`` -> the request waiting for its reply."""

    def next_id(self) -> str:
        """A fresh request id (``r1``, ``r2``, ...)."""
        return f"r{next(self._ids)}"

    def register(self, message: BaseModel, request_id: str) -> Pending:
        """Wait for the reply to ``message`` (sent with :meth:`send`).

        Raises:
            SessionClosed, UsageError: the client is not open.
        """
        self._check_open()
        pending = Pending(message, asyncio.get_running_loop().create_future())
        self.requests[request_id] = pending
        return pending

    def start_invoke(self, message: m.Invoke) -> Pending:
        """Wait for the terminal event of ``message``'s call.

        Raises:
            SessionClosed, UsageError: the client is not open.
            UsageError: the ``call_id`` is already waiting here.
        """
        self._check_open()
        if message.call_id in self.invokes:
            raise UsageError(f"call_id {message.call_id!r} is already in flight")
        pending = Pending(message, asyncio.get_running_loop().create_future())
        self.invokes[message.call_id] = pending
        return pending

    async def send(self, pending: Pending) -> None:
        """Send now when a socket is up; otherwise the next (re)connect sends it."""
        ws, gen = self._socket()
        if ws is None:
            return
        pending.gen = gen
        try:
            await ws.send(frame_of(pending.message), text=True)
        except ConnectionClosed:
            pending.gen = 0

    async def request(
        self,
        build: Callable[[str], BaseModel],
        expected: type[R] | tuple[type[BaseModel], ...],
        limit: float | None,
    ) -> R:
        """Send one request and wait for the reply carrying its ``id``.

        Args:
            build: makes the request from its id.
            expected: the reply class (or classes) that answers it.
            limit: seconds to wait; ``None`` waits as long as it takes.

        Raises:
            RequestRefused: the server answered ``error``.
            RequestTimeout: no reply within ``limit``.
        """
        request_id = self.next_id()
        pending = self.register(build(request_id), request_id)
        try:
            await self.send(pending)
            async with asyncio.timeout(limit):
                reply = await pending.future
        except TimeoutError:
            kind = type(pending.message).__name__
            raise RequestTimeout(f"no answer to {kind} within {limit} s") from None
        finally:
            self.requests.pop(request_id, None)
        if not isinstance(reply, expected):
            raise ToolbusClientError(f"unexpected reply {type(reply).__name__} to {request_id}")
        return reply  # type: ignore[return-value]

    def answer(self, request_id: str | None, reply: BaseModel) -> None:
        """``reply`` answers the request ``request_id`` (if it still waits)."""
        pending = self.requests.get(request_id) if request_id else None
        if pending is not None and not pending.future.done():
            pending.future.set_result(reply)

    def finish(self, call_id: str, outcome: Any, error: BaseException | None = None) -> None:
        """The call ``call_id`` ended with ``outcome``, or raises ``error``."""
        pending = self.invokes.get(call_id)
        if pending is None or pending.future.done():
            return
        if error is not None:
            pending.future.set_exception(error)
        else:
            pending.future.set_result(outcome)

    def refuse(self, msg: m.Error) -> bool:
        """``error``: a refused request (by ``id``) or a refused invoke (by
        ``details.call_id``). A re-sent invoke refused ``duplicate_call`` is still
        running on the server: it keeps waiting for its terminal event.

        Returns:
            Whether the error belonged to something waiting here.
        """
        pending = self.requests.get(msg.id) if msg.id else None
        if pending is None:
            call_id = (msg.details or {}).get("call_id")
            pending = self.invokes.get(call_id) if isinstance(call_id, str) else None
            if pending is not None and pending.resent and msg.code is ErrorCode.DUPLICATE_CALL:
                return True
        if pending is not None and not pending.future.done():
            pending.future.set_exception(RequestRefused(msg))
            return True
        return False

    async def resend(self, gen: int) -> None:
        """Re-send what still waits and was not sent on connection ``gen``: invokes with
        the same ``call_id`` (SPEC I12), then requests with the same ``id``."""
        for pending in [*self.invokes.values(), *self.requests.values()]:
            if pending.gen < gen and not pending.future.done():
                pending.resent = True
                await self.send(pending)

    def resent_waiting(self) -> bool:
        """Whether a re-sent invoke still waits (it may yet bring a job, SPEC I15)."""
        return any(p.resent and not p.future.done() for p in self.invokes.values())

    def fail(self, reason: BaseException) -> None:
        """The session ended: everything still waiting raises ``reason``."""
        for pending in [*self.invokes.values(), *self.requests.values()]:
            if not pending.future.done():
                pending.future.set_exception(reason)
                pending.future.exception()
