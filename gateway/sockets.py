"""Every open socket's handler, with or without a session (SPEC S4, S6).

:class:`LiveSockets` holds each :class:`~gateway.connection.ConnectionHandler` while it
serves. Two things reach every socket through it: a credential that lapsed closes its
session's socket (SPEC S6), and the drain sends each one the ``reconnect`` hint behind
what is already queued for it, then closes it 1012 (SPEC S4). A socket past its
lifetime (``server.max_socket_lifetime``, less a random share of it) is ended the same
way, alone, so that its client resumes wherever the load balancer sends it (SPEC N6).
"""

from __future__ import annotations

import asyncio
import random

from gateway.connection import ConnectionHandler
from gateway.session import Session
from protocol import messages as m
from protocol.codec import encode
from protocol.connection_state import State
from protocol.errors import CloseCode

LIFETIME_REASON = "socket lifetime"
"""The ``reconnect`` reason and close reason of a socket ended at its lifetime (N6)."""


class SocketLifetime:
    """Each socket's lifetime (SPEC N6): ``seconds`` less a random fraction of it, up to
    ``jitter``, so that sockets opened together end spread over ``jitter * seconds``.

    Args:
        seconds: ``server.max_socket_lifetime``; 0: sockets live as long as they like.
        jitter: ``server.max_socket_lifetime_jitter``, in [0, 1).
        rng: the random source (seed one for a repeatable draw).
    """

    def __init__(self, seconds: float, jitter: float, rng: random.Random | None = None) -> None:
        self.seconds = seconds
        self.jitter = jitter
        self._rng = rng or random.Random()

    def draw(self) -> float | None:
        """One socket's lifetime in seconds, in ``[(1 - jitter) * seconds, seconds]``;
        ``None`` when lifetimes are off."""
        if self.seconds <= 0:
            return None
        return self.seconds * (1.0 - self.jitter * self._rng.random())


class LiveSockets:
    """The handlers of the open sockets; an empty set once all of them ended.

    Args:
        lifetime: each socket's lifetime (SPEC N6); default: unbounded.
    """

    def __init__(self, lifetime: SocketLifetime | None = None) -> None:
        self.handlers: set[ConnectionHandler] = set()
        """Every open socket's handler, sessions or not."""
        self.lifetime = lifetime or SocketLifetime(0.0, 0.0)
        self._hint = encode(m.Reconnect(reason=LIFETIME_REASON, retry_after=0.0))
        self._timers: dict[ConnectionHandler, asyncio.TimerHandle] = {}

    async def serve(self, handler: ConnectionHandler) -> None:
        """Serve one socket until it closes, holding its handler meanwhile; end it at
        its lifetime (SPEC N6)."""
        self.handlers.add(handler)
        self._arm(handler)
        try:
            await handler.serve()
        finally:
            timer = self._timers.pop(handler, None)
            if timer is not None:
                timer.cancel()
            self.handlers.discard(handler)

    def _arm(self, handler: ConnectionHandler) -> None:
        seconds = self.lifetime.draw()
        if seconds is not None:
            loop = asyncio.get_running_loop()
            self._timers[handler] = loop.call_later(seconds, self._expire, handler)

    def _expire(self, handler: ConnectionHandler) -> None:
        """SPEC N6: the socket reached its lifetime; one still in its handshake gets
        another lifetime (a hello is never cut off half-way)."""
        self._timers.pop(handler, None)
        if handler not in self.handlers:
            return
        if handler.state.state is not State.OPEN:
            self._arm(handler)
            return
        handler.close_lapsed(CloseCode.SERVICE_RESTART, LIFETIME_REASON, self._hint)

    def close_lapsed(self, session: Session, code: CloseCode, reason: str) -> None:
        """SPEC S6: the session's credential lapsed; close its live socket, if any."""
        for handler in list(self.handlers):
            if handler.session is session:
                handler.close_lapsed(code, reason)

    async def restart_all(self, hint: bytes) -> None:
        """SPEC S4: queue ``hint`` (an encoded ``reconnect``) on every socket behind what
        it already holds, then close each 1012; returns once all of them closed. The
        hint is each socket's last frame: its link takes nothing more from the moment
        it is queued (an event emitted later is in the log, for the next socket)."""
        closing = []
        for handler in list(self.handlers):
            handler.link.push(hint)
            closing.append(
                handler.link.flush_and_close(CloseCode.SERVICE_RESTART, "server restart")
            )
        await asyncio.gather(*closing, return_exceptions=True)
