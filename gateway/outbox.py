"""Outbound path: group commit, then delivery through a bounded per-socket queue.

Every frame a session sends goes through :class:`Outbox`. Durable events were already
staged in the store by :meth:`gateway.session.Session.emit`; the outbox commits all that
is staged once per event-loop tick and only then hands the frames to the sockets, in
order (SPEC D1: appended to the log before it is sent). Replies ride the same queue so
that a reply never overtakes an event emitted before it, except while the store cannot
commit: then durable frames are held (never sent unstored, SPEC D6) and replies go on.

:class:`Link` is one socket's writer: a queue bounded in bytes (SPEC D5). A peer that
stops reading fills it and is closed with 1013. What it missed is in the log and comes
back by replay on resume, as long as the session keeps it: past
``sessions.max_unacked_events`` unacknowledged events the oldest are dropped (SPEC D2)
and that resume answers ``resumed: false``. So that a slow reader is told before that
happens, :meth:`gateway.session.Session.emit` also closes the socket 1013 once the
unacknowledged events pass 90% of the cap. Any other failure inside the writer (a store
read error during replay) closes the socket 1011 with a log line; none leaves it silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gateway import audit
from gateway.store import StoreError, StoreUnavailable
from gateway.wslib import ConnectionClosed, Socket
from protocol.errors import CloseCode, close_reason

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
        ws: the server-side connection (:class:`gateway.wslib.Socket`).
        max_bytes: bytes that may wait in the queue; past it the socket closes 1013.
    """

    def __init__(self, ws: Socket, max_bytes: int) -> None:
        self.ws = ws
        self.max_bytes = max_bytes
        self.closed = False
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
        if self._busy or self._queue:
            return False
        return self.ws.write_now(frames)

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

    @property
    def backlogged(self) -> bool:
        """Whether frames wait to be written: the peer reads slower than we send."""
        return bool(self._queue) or self.ws.buffered() > 0

    def close(self, code: CloseCode, reason: str) -> None:
        """Stop writing and close the socket with ``code`` (queued frames are dropped)."""
        if self.closed:
            return
        self.closed = True
        self._drop()
        self.closer = asyncio.get_running_loop().create_task(self._close(code, reason))

    def flush_and_close(
        self, code: CloseCode, reason: str, grace: float = 5.0
    ) -> Coroutine[Any, Any, None]:
        """Let the writer send what is queued, in order, then close with ``code``; the
        returned coroutine does it (await it, or make it a task).

        Frames pushed from the moment of this call are dropped, before the coroutine
        first runs (SPEC S4: the drain's ``reconnect`` hint is the last frame; an event
        emitted after it is in the log, and replay gives it on the next socket). The
        writer task alone sends, so a replay under way is finished before anything
        queued behind it (SPEC D1, D3). A peer that does not read within ``grace``
        seconds is closed anyway: what it missed is in the log, and replay gives it back
        on resume.
        """
        if self.closed:
            return _nothing()
        self.closed = True
        self._wakeup.set()
        return self._flushed_close(code, reason, grace)

    async def _flushed_close(self, code: CloseCode, reason: str, grace: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._idle.wait()
        self._task.cancel()
        await self._close(code, reason)

    def detach(self) -> None:
        """The socket is gone: drop what is queued and stop the writer task."""
        self.closed = True
        self._drop()

    def _drop(self) -> None:
        """Nothing queued will be sent: stop the writer; a :meth:`flush_and_close` under
        way stops waiting for it (else it would wait out its grace)."""
        self._queue.clear()
        self._queued_bytes = 0
        self._task.cancel()
        self._idle.set()

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
        """Send already-encoded text frames in one write (see :mod:`gateway.wslib`)."""
        await self.ws.send_texts(frames)

    async def _replay(self, replay: Replay) -> bool:
        """Send the logged events ``after < seq <= upto``; ``False`` at the first hole.

        Every ``seq`` is checked, not only each page's first (SPEC D3, D6, case F27): a
        page is sent only up to the event before a missing one, and the socket is then
        closed, so a log with a hole is never delivered as if it were whole.
        """
        cursor = replay.after
        while cursor < replay.upto:
            page = replay.page(cursor)
            frames: list[bytes] = []
            for seq, body in page:
                if seq != cursor + len(frames) + 1 or seq > replay.upto:
                    break
                frames.append(body)
            if frames:
                await self._send_batch(frames)
                cursor += len(frames)
            if cursor < replay.upto and (not frames or len(frames) < len(page)):
                # SPEC D2: the cap dropped events not yet replayed, or the log has a
                # hole; the client must resync.
                logger.warning(
                    "replay cut short after seq %d: event %d missing", cursor, cursor + 1
                )
                return False
        return True

    async def _close(self, code: CloseCode, reason: str) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.ws.close(int(code), reason)

    def _overflow(self) -> None:
        self.slow_consumer(f"{self._queued_bytes} bytes queued > {self.max_bytes}")

    def slow_consumer(self, why: str) -> None:
        """Close 1013 a reader that does not keep up (SPEC D5), before its session's log
        drops what it has not acknowledged (SPEC D2); it resumes and gets the rest."""
        if self.closed:
            return
        logger.warning("closing slow consumer: %s", why)
        self.close(CloseCode.TRY_AGAIN_LATER, close_reason(f"slow consumer: {why}"))

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
        except Exception as exc:
            # Whatever failed (a store read during replay, a bug), the socket must not
            # stay open with nobody writing to it: close it, typed, and say why.
            if isinstance(exc, StoreError):
                logger.error("socket writer failed, closing 1011: %s", exc)
            else:
                logger.exception("socket writer failed, closing 1011")
            self._idle.set()
            if not self.closed:
                self.close(CloseCode.INTERNAL_ERROR, "internal error")


BURST = 16
"""Queued frames at which :meth:`Outbox.flush_burst` flushes before the tick ends. It was
64: a job end cost about 130 us of loop time here, so a slice's first frame waited about
8 ms for its flush. With 16, P5's p99 went from 12.2 to 6.0 ms on SQLite (a flush is a
journal append), the burst taking no longer; on PostgreSQL (a flush is a commit) P5p's
median p50 went from 10.95 to 5.29 ms over 5 interleaved runs, p99 16.4 to 16.0 ms
(docs/bench.md, issue 13)."""


class CommitFailures:
    """A run of failed commits (SPEC D6): when the next attempt may come (5 ms after the
    first failure, doubling up to ``retry_max``), and whether the store counts as
    unavailable (failing for ``unavailable_after`` s). Logs the run's start, the moment
    it turns unavailable, and its end, once each.

    Args:
        unavailable_after: seconds of failing commits before :attr:`unavailable`.
        retry_max: longest pause between two commit attempts, in seconds.
        on_failure: called once per failed commit attempt (metrics).
    """

    RETRY_FIRST = 0.005
    """First pause, in seconds, before a failed commit is tried again."""

    def __init__(
        self, unavailable_after: float, retry_max: float, on_failure: Callable[[], None] | None
    ) -> None:
        self.unavailable_after = unavailable_after
        self.retry_max = retry_max
        self._on_failure = on_failure
        self.since: float | None = None
        """``time.monotonic()`` of the run's first failed commit; ``None``: no run."""
        self.attempts = 0
        self.next_try = 0.0
        """``time.monotonic()`` before which no commit is attempted during a run."""
        self._declared = False

    @property
    def unavailable(self) -> bool:
        """Whether the run has lasted ``unavailable_after`` seconds or more (SPEC D6)."""
        since = self.since
        return since is not None and time.monotonic() - since >= self.unavailable_after

    def waiting(self, now: float) -> bool:
        """Whether a run is on and its next attempt is not due at ``now``."""
        return self.since is not None and now < self.next_try

    def failed(self, exc: StoreUnavailable, now: float) -> float:
        """A commit attempt that began at ``now`` failed; returns the pause, in seconds,
        before the next one."""
        if self._on_failure is not None:
            self._on_failure()
        if self.since is None:
            self.since = now
            logger.warning("store commit failed, holding its events and retrying: %s", exc)
        elif not self._declared and self.unavailable:
            self._declared = True
            logger.error(
                "store unavailable for %.3f s, refusing new calls: %s", now - self.since, exc
            )
        # The exponent is capped: 2**1024 and past does not fit a float (an outage of
        # about 1,000 attempts, 9 minutes at retry_max 0.5, raised OverflowError here).
        delay: float = min(self.RETRY_FIRST * 2.0 ** min(self.attempts, 64), self.retry_max)
        self.attempts += 1
        self.next_try = time.monotonic() + delay  # from the attempt's end (lock waits)
        return delay

    def recovered(self, now: float, held: int) -> None:
        """A commit that began at ``now`` succeeded; ``held`` events it lets go."""
        if self.since is not None:
            logger.warning(
                "store commits again after %.3f s; %d held events sent", now - self.since, held
            )
            self.since, self.attempts, self._declared = None, 0, False


class Outbox:
    """Group commit and ordered delivery for every session (SPEC D1, D6).

    Durable before sent: a durable frame (an event :meth:`gateway.session.Session.emit`
    staged) is handed to a socket only after the :meth:`Store.commit` that holds it
    succeeded. When a commit fails (:class:`~gateway.store.StoreUnavailable`), the store
    keeps what was staged and this outbox keeps the frames, in order; it retries on a
    timer (5 ms, doubling up to ``retry_max``), never by waiting on the event loop, and
    sends them once a commit succeeds. Replies (not logged) are not held: during a
    failure they may overtake held events, which follow in order. Held frames are
    bounded per socket by its queue bound; past it the socket is closed 1013 (SPEC D5)
    and its events come back by replay (:func:`_hold`).

    On SQLite a flush makes its events durable by one append to the store's journal
    (:meth:`Store.journal <gateway.store.Store.journal>`); the commit it owes runs
    ``settle_after`` s later for every flush of that time (sooner when the journal fills
    or a read needs the file). If it fails, flushes commit, holding frames, until one
    succeeds.

    While commits have failed for over ``unavailable_after`` s, :attr:`unavailable` is
    true (new calls and sessions are refused ``unavailable``, ``/readyz`` answers 503)
    until the first good commit.

    Args:
        store: the store whose staged writes :meth:`flush` commits.
        unavailable_after: seconds of failing commits before :attr:`unavailable`.
        retry_max: longest pause between two commit attempts, in seconds.
        on_failure: called once per failed commit attempt (metrics).
        settle_after: seconds from a journaled flush to the commit it owes.
    """

    def __init__(
        self,
        store: Store,
        unavailable_after: float = 1.0,
        retry_max: float = 0.5,
        on_failure: Callable[[], None] | None = None,
        settle_after: float = 0.05,
    ) -> None:
        self._store = store
        self._pending: list[tuple[Recipient, bytes, bool]] = []
        self._held: list[tuple[Recipient, bytes, bool]] = []
        """Durable frames whose commit failed, oldest first (SPEC D6)."""
        self._held_bytes: dict[Link, tuple[int, int]] = {}
        """Per socket: bytes of its first held frame, and of all of them (SPEC D5)."""
        self._audits: list[dict[str, Any]] = []
        """Audit records waiting for the commit of what was staged before them (I11)."""
        self._scheduled = False
        self._closed = False
        self.failures = CommitFailures(unavailable_after, retry_max, on_failure)
        self.settle_after = settle_after
        self._timer: asyncio.TimerHandle | None = None
        self._settler: asyncio.TimerHandle | None = None
        """The owed commit of journaled flushes, when one is due."""
        self._waiters: list[asyncio.Future[bool]] = []
        """Callers of :meth:`durable`, told the outcome of the next commit attempt."""
        self._tick_committed = False
        """A :meth:`durable` caller committed at once since the last :meth:`flush`."""

    @property
    def unavailable(self) -> bool:
        """Whether commits have failed for longer than ``unavailable_after`` (SPEC D6)."""
        return self.failures.unavailable

    @property
    def failing_since(self) -> float | None:
        """``time.monotonic()`` of the first failed commit of the current run, if any."""
        return self.failures.since

    @property
    def held(self) -> int:
        """Durable frames waiting for a commit that failed."""
        return len(self._held)

    @property
    def queued(self) -> int:
        """Frames queued for the next flush."""
        return len(self._pending)

    def put(self, recipient: Recipient, data: bytes, durable: bool = False) -> None:
        """Queue a frame for ``recipient``; it leaves after the next successful commit if
        ``durable`` (its event is staged), else after the next flush. Dropped once
        :meth:`close` ran."""
        if self._closed:
            return
        self._pending.append((recipient, data, durable))
        self.soon()

    def audit(self, fields: dict[str, Any]) -> None:
        """Write the audit record ``fields`` (SPEC I11) once what is staged now, the end
        of its call, is durable: with the next successful commit, before its frames are
        delivered. Dropped once :meth:`close` ran, and lost with a process killed before
        that commit: the next start, or the node that claims this one, then ends the
        call and writes its one record (:mod:`gateway.recovery`)."""
        if not self._closed:
            self._audits.append(fields)
            self.soon()

    def flush(self) -> bool:
        """Commit what is staged, then deliver the queued frames in order.

        Returns:
            ``True`` when the commit succeeded and every queued frame was delivered;
            ``False`` when the store could not commit (durable frames are held, replies
            delivered) or the outbox is closed.

        Frames of a recipient without a link are dropped here: durable ones are in the
        log and come back by replay (SPEC D3); replies to a gone socket have no reader.
        """
        self._scheduled = self._tick_committed = False
        if self._closed:
            return False
        pending, self._pending = self._pending, []
        if not self._commit():
            self._held = _hold(self._held, self._held_bytes, (i for i in pending if i[2]))
            _deliver(item for item in pending if not item[2])
            return False
        if self._held:
            pending, self._held = self._held + pending, []
            self._held_bytes.clear()
        if self._audits:
            written, self._audits = self._audits, []
            for fields in written:
                audit.write(fields)
        _deliver(pending)
        return True

    def flush_burst(self) -> bool:
        """Flush now if :data:`BURST` frames or more are queued and commits do not fail
        (else ``False``; or as :meth:`flush`): jobs woken in one loop turn (P5, P5p)
        leave in slices, each a journal append (SQLite) or a commit (PostgreSQL); while
        commits fail the retry timer decides. Only where the caller's rows and event are
        all staged."""
        return self.queued >= BURST and self.failing_since is None and self.flush()

    def soon(self) -> None:
        """Flush at the next loop turn, frames queued or not (rows staged with no frame,
        a call's wait for a worker thread, SPEC J6, are durable then)."""
        if not self._scheduled and not self._closed:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def commit(self) -> bool:
        """Make what is staged durable now, without delivering (queued frames leave at
        the next :meth:`flush`); ``False`` when the store could not, or closed."""
        return not self._closed and self._commit()

    def durable(self, at_once: bool = True) -> asyncio.Future[bool]:
        """Make what is staged now durable, sharing one commit with the tick's writers.

        With ``at_once``, the first caller since the last :meth:`flush` commits at once
        (a lone call pays no extra loop turn, and a ``tool_start`` already queued leaves
        in one write with the result); every other caller waits for the next
        :meth:`flush`, which commits for all of them at once.

        Args:
            at_once: commit now if no one else did since the last flush.

        Returns:
            A future set to ``True`` once a commit holding everything staged before this
            call succeeded (already done for the first caller), ``False`` when that
            attempt failed or the outbox is closed (it is not retried for the waiter).
            The pipeline awaits it so that a call's ledger row is durable before a
            handler with side effects starts (SPEC I15): the calls of one tick then cost
            two commits at most, not one each.
        """
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self._closed or (at_once and not self._tick_committed):
            self._tick_committed = True
            waiter.set_result(not self._closed and self._commit())
            return waiter
        self._waiters.append(waiter)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)
        return waiter

    def _commit(self) -> bool:
        now = time.monotonic()
        if self.failures.waiting(now):
            self._settle(False)
            return False  # failing: the retry timer decides when to try again
        store = self._store
        try:
            if not store.journal():
                store.commit()
        except StoreUnavailable as exc:
            self._failed(exc, now)
            self._settle(False)
            return False
        if store.owed and self._settler is None:
            self._settler = asyncio.get_running_loop().call_later(self.settle_after, self._pay)
        self._settle(True)
        self.failures.recovered(now, len(self._held))
        return True

    def _settle(self, durable: bool) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():  # its call may have been cancelled meanwhile
                waiter.set_result(durable)

    def _failed(self, exc: StoreUnavailable, now: float) -> None:
        delay = self.failures.failed(exc, now)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(delay, self._retry)

    def _pay(self) -> None:
        """Commit what journaled flushes owe; a failure starts a run of failed commits
        (the next flushes commit and hold their frames)."""
        self._settler = None
        if self._closed or not self._store.owed:
            return
        now = time.monotonic()
        try:
            self._store.commit()
        except StoreUnavailable as exc:
            self._failed(exc, now)

    def _retry(self) -> None:
        self._timer = None
        self.failures.next_try = 0.0
        self.flush()

    def close(self) -> None:
        """Flush, then stop for good, before the store closes (SPEC S4 drain).

        Calls still running in this process end later and emit into a store that is
        gone; those events are dropped, neither committed nor sent. The next server
        reports such calls from its own recovery (SPEC D3, J5). Held frames whose
        commit still fails are dropped unsent (SPEC D6).
        """
        self.flush()
        self._closed = True
        self._settle(False)
        self._held.clear()
        self._held_bytes.clear()
        self._audits.clear()
        for timer in (self._timer, self._settler):
            if timer is not None:
                timer.cancel()
        self._timer = self._settler = None


def _hold(
    held: list[tuple[Recipient, bytes, bool]],
    held_bytes: dict[Link, tuple[int, int]],
    items: Iterable[tuple[Recipient, bytes, bool]],
) -> list[tuple[Recipient, bytes, bool]]:
    """Keep durable frames whose commit failed, bounded per socket (SPEC D5, D6): append
    ``items`` to ``held`` (an :class:`Outbox`'s held frames, ``held_bytes`` their bytes
    per socket) and return what is kept.

    A frame for a session without an open socket is not kept: its event stays
    staged in the store, is committed when the store recovers, and comes back by
    replay (SPEC D3). A socket whose held frames pass its queue bound
    (``server.max_outbound_bytes``, the first frame not counted, as in
    :meth:`Link.push_many`) is closed 1013 like a slow consumer and its held frames
    dropped: the events are staged, not lost, and the client resumes once the
    store commits again. So an outage holds at most one queue bound per socket.
    """
    over: list[Link] = []
    for item in items:
        link = item[0].link
        if link is None or link.closed:
            continue
        first, size = held_bytes.get(link, (len(item[1]), 0))
        size += len(item[1])
        held_bytes[link] = (first, size)
        held.append(item)
        if size - first > link.max_bytes and link not in over:
            over.append(link)
    for link in over:
        _, size = held_bytes.pop(link)
        link.slow_consumer(f"{size} bytes held while the store cannot commit > {link.max_bytes}")
    if over:
        return [item for item in held if item[0].link not in over]
    return held


def _deliver(items: Iterable[tuple[Recipient, bytes, bool]]) -> None:
    """Hand frames to their recipients' current links, one batch per link, in order."""
    batches: dict[Link, list[bytes]] = {}
    for recipient, data, _ in items:
        link = recipient.link
        if link is not None:
            batches.setdefault(link, []).append(data)
    for link, frames in batches.items():
        link.push_many(frames)


async def _nothing() -> None:
    """The close of a link closed already: nothing to do."""
