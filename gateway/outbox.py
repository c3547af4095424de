"""Outbound path: group commit, then delivery through a bounded per-socket queue.

Every frame a session sends goes through :class:`Outbox`. Durable events were already
staged in the store by :meth:`gateway.session.Session.emit`; the outbox commits all that
is staged once per event-loop tick and only then hands the frames to the sockets, in
order (SPEC D1: appended to the log before it is sent). Replies ride the same queue so
that a reply never overtakes an event emitted before it.

:class:`Link` is one socket's writer: a queue bounded in bytes (SPEC D5). A peer that
stops reading fills it and is closed with 1013; nothing is lost, since every durable
event is in the log and comes back by replay on resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from protocol.errors import CloseCode

if TYPE_CHECKING:
    from gateway.store import Store

logger = logging.getLogger("gateway.outbox")


BATCH_FRAMES = 64
"""Frames handed to the socket in one write at most; more wait for the next turn."""


class Recipient(Protocol):
    """Whatever holds the current link of a session (``None`` while disconnected)."""

    link: Link | None


Page = Callable[[int], list[tuple[int, bytes]]]
"""Reads the next committed events of a session after a ``seq``, in order (a bounded page)."""


@dataclass(frozen=True, slots=True)
class Replay:
    """A place in a link's queue where logged events ``after < seq <= upto`` go (SPEC D3).

    They are read from the store a page at a time as the socket takes them, so a long
    backlog never sits in memory nor counts against the queue's byte bound (SPEC D5).
    """

    page: Page
    after: int
    upto: int


class Link:
    """The writer of one WebSocket: a byte-bounded queue drained by one task (SPEC D5).

    Args:
        ws: the server-side connection.
        max_bytes: bytes that may wait in the queue; past it the socket closes 1013.
        on_overflow: called once when the bound is crossed (metrics, logs).
    """

    def __init__(
        self, ws: ServerConnection, max_bytes: int, on_overflow: Callable[[], None]
    ) -> None:
        self.ws = ws
        self.max_bytes = max_bytes
        self.closed = False
        self._on_overflow = on_overflow
        self._queue: deque[bytes | Replay] = deque()
        self._queued_bytes = 0
        self._wakeup = asyncio.Event()
        self._busy = False
        self._idle = asyncio.Event()
        """Set while nothing is queued and the writer waits: all pushed frames are out."""
        self._idle.set()
        self._task = asyncio.get_running_loop().create_task(self._drain())
        self.closer: asyncio.Task[None] | None = None
        """The task sending the close :meth:`close` started; the connection handler awaits
        it before returning, else websockets would close 1000 first."""

    def push(self, data: bytes) -> None:
        """Queue one encoded text frame; never blocks. Dropped once the link is closed."""
        if self.closed:
            return
        self.push_many([data])

    def push_many(self, frames: list[bytes]) -> None:
        """Queue encoded text frames in order; never blocks.

        When nothing is queued or being written and the socket's buffer is empty, the
        frames are written at once, in one write: the common case of a quick reply
        then costs no extra turn of the event loop. Otherwise the writer task sends
        them with flow control.
        """
        if self.closed or self._send_now(frames):
            return
        self._idle.clear()
        self._queue.extend(frames)
        self._queued_bytes += sum(len(data) for data in frames)
        if self._backlog() > self.max_bytes:
            self._overflow()
            return
        self._wakeup.set()

    def _backlog(self) -> int:
        """Bytes waiting behind the next frame to go: one frame of any size may wait
        alone, so a single large result is not mistaken for a slow reader (SPEC D5)."""
        head = self._queue[0] if self._queue else None
        return self._queued_bytes - (len(head) if isinstance(head, bytes) else 0)

    def _send_now(self, frames: list[bytes]) -> bool:
        ws = self.ws
        if self._busy or self._queue or ws.protocol.state is not State.OPEN:
            return False
        if ws.transport.is_closing():
            return False
        if ws.transport.get_write_buffer_size():
            return False
        for data in frames:
            ws.protocol.send_text(data)
        ws.send_data()
        return True

    def push_replay(self, replay: Replay) -> None:
        """Queue a replay of logged events (SPEC D3); frames pushed later follow it."""
        if self.closed:
            return
        self._idle.clear()
        self._queue.append(replay)
        self._wakeup.set()

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    def close(self, code: CloseCode, reason: str) -> None:
        """Stop writing and close the socket with ``code`` (queued frames are dropped)."""
        if self.closed:
            return
        self.closed = True
        self._queue.clear()
        self._queued_bytes = 0
        self._task.cancel()
        self.closer = asyncio.get_running_loop().create_task(self._close(code, reason))

    async def flush_and_close(self, code: CloseCode, reason: str, grace: float = 5.0) -> None:
        """Let the writer send what is queued, in order, then close with ``code``.

        Frames pushed from now on are dropped. The writer task alone sends, so a replay
        under way is finished before anything queued behind it (SPEC D1, D3). A peer
        that does not read within ``grace`` seconds is closed anyway: what it missed is
        in the log, and replay gives it back on resume.
        """
        if self.closed:
            return
        self.closed = True
        self._wakeup.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._idle.wait()
        self._task.cancel()
        await self._close(code, reason)

    def detach(self) -> None:
        """The socket is gone: drop what is queued and stop the writer task."""
        self.closed = True
        self._queue.clear()
        self._queued_bytes = 0
        self._task.cancel()

    async def _send(self, item: bytes | Replay) -> bool:
        """Send one queued frame, with the frames queued right behind it, or a whole
        replay; ``False`` if the replay found a gap."""
        if isinstance(item, Replay):
            return await self._replay(item)
        batch = [item]
        queue = self._queue
        while queue and len(batch) < BATCH_FRAMES and isinstance(queue[0], bytes):
            batch.append(queue.popleft())  # type: ignore[arg-type]
        self._queued_bytes -= sum(len(data) for data in batch)
        await self._send_batch(batch)
        return True

    async def _send_batch(self, frames: list[bytes]) -> None:
        """Send already-encoded text frames in one write (see :mod:`gateway.wsconn`)."""
        if len(frames) == 1:
            await self.ws.send(frames[0], text=True)
            return
        async with self.ws.send_context():
            for data in frames:
                self.ws.protocol.send_text(data)

    async def _replay(self, replay: Replay) -> bool:
        cursor = replay.after
        while cursor < replay.upto:
            page = replay.page(cursor)
            if not page or page[0][0] != cursor + 1:
                # SPEC D2: the cap dropped events not yet replayed; the client must resync.
                logger.warning("replay cut short at seq %d: history trimmed", cursor)
                return False
            frames = [body for seq, body in page if seq <= replay.upto]
            if not frames:
                break
            await self._send_batch(frames)
            cursor = page[len(frames) - 1][0]
        return True

    async def _close(self, code: CloseCode, reason: str) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.ws.close(int(code), reason)

    def _overflow(self) -> None:
        logger.warning(
            "closing slow consumer: %d bytes queued > %d", self._queued_bytes, self.max_bytes
        )
        self._on_overflow()
        self.close(CloseCode.TRY_AGAIN_LATER, "slow consumer: outbound buffer full")

    async def _drain(self) -> None:
        queue = self._queue
        try:
            while True:
                self._busy = False
                if not queue:
                    self._idle.set()
                await self._wakeup.wait()
                self._wakeup.clear()
                self._busy = True
                while queue:
                    if not await self._send(queue.popleft()):
                        self._idle.set()
                        self.close(CloseCode.TRY_AGAIN_LATER, "replay history no longer available")
                        return
        except ConnectionClosed:
            self.closed = True
            self._idle.set()


class Outbox:
    """Group commit and ordered delivery for every session (SPEC D1).

    Args:
        store: the store whose staged writes :meth:`flush` commits.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._pending: list[tuple[Recipient, bytes]] = []
        self._scheduled = False
        self._closed = False

    def put(self, recipient: Recipient, data: bytes) -> None:
        """Queue a frame for ``recipient``; it leaves after the next commit. Dropped once
        :meth:`close` ran."""
        if self._closed:
            return
        self._pending.append((recipient, data))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Commit what is staged, then deliver the queued frames in order.

        Frames of a recipient without a link are dropped here: durable ones are in the
        log and come back by replay (SPEC D3); replies to a gone socket have no reader.
        """
        self._scheduled = False
        if self._closed:
            return
        self._store.commit()
        pending, self._pending = self._pending, []
        batches: dict[Link, list[bytes]] = {}
        for recipient, data in pending:
            link = recipient.link
            if link is not None:
                batches.setdefault(link, []).append(data)
        for link, frames in batches.items():
            link.push_many(frames)

    def close(self) -> None:
        """Flush, then stop for good, before the store closes (SPEC S4 drain).

        Calls still running in this process end later and emit into a store that is
        gone; those events are dropped, neither committed nor sent. The next server
        reports such calls from its own recovery (SPEC D3, J5).
        """
        self.flush()
        self._closed = True
