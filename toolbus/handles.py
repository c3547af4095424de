"""Objects the client hands to its caller: job handles, approval requests, event streams,
the reconnect backoff policy (SPEC K1).

None of these does I/O by itself: actions (``allow()``, ``cancel()``, following a job)
go through the part of the :class:`~toolbus.client.Client` that created them, passed to
their constructor: a :class:`JobOwner` (:class:`toolbus.client_jobs.Jobs`) for a job
handle, the client's ``confirm`` for an approval request.
"""

# ASYNC109: ``timeout=`` arguments are the API (SPEC K1), applied with asyncio.timeout().
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from protocol import messages as m
from toolbus.errors import RequestTimeout

T = TypeVar("T")

JobEvent = m.JobProgress | m.JobDone | m.JobFailed | m.JobCancelled
"""A job event pushed by the server (SPEC J2, J4)."""

JobTerminal = m.JobDone | m.JobFailed | m.JobCancelled
"""The event that ends a job (SPEC J4)."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Reconnect delays: exponential growth with full jitter (AWS architecture blog,
    "Exponential Backoff And Jitter"): attempt ``n`` waits a uniform random time in
    ``[0, min(cap, initial * factor ** n)]`` seconds.

    Attributes:
        initial: upper bound of the first delay, in seconds.
        cap: largest upper bound, in seconds.
        factor: growth per attempt.
        max_attempts: attempts before the client gives up; ``None`` retries forever.
    """

    initial: float = 0.1
    cap: float = 10.0
    factor: float = 2.0
    max_attempts: int | None = None

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The delay before attempt ``attempt`` (0-based), in seconds."""
        bound = min(self.cap, self.initial * self.factor ** min(attempt, 64))
        return (rng or random).uniform(0.0, bound)


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """How a job ended (SPEC J1, J4), from its terminal event or, after a resync, from
    ``job.get``.

    Attributes:
        job_id: the job.
        tool: its tool.
        state: ``done``, ``failed`` or ``cancelled``.
        summary: the one-line summary (a default when the tool gave none).
        artifacts: artifact objects (may be empty).
        result: the job's result object (empty unless ``done``).
        error: why it failed, or ``None``.
        finished_at: Unix time in seconds, or ``None`` when unknown.
        call_id: the call that created the job, or ``None``.
        event: the terminal wire event, or ``None`` when learned through ``job.get``.
    """

    job_id: str
    tool: str
    state: m.JobState
    summary: str
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    error: m.JobError | None = None
    finished_at: float | None = None
    call_id: str | None = None
    event: JobTerminal | None = None

    @property
    def ok(self) -> bool:
        """``True`` only when the job is ``done``."""
        return self.state is m.JobState.DONE

    @classmethod
    def from_event(cls, event: JobTerminal) -> JobOutcome:
        """Build from ``job.done`` / ``job.failed`` / ``job.cancelled``."""
        states = {"job.done": m.JobState.DONE, "job.failed": m.JobState.FAILED}
        return cls(
            job_id=event.job_id,
            tool=event.tool,
            state=states.get(event.type, m.JobState.CANCELLED),
            summary=event.summary,
            artifacts=list(event.artifacts) if isinstance(event, m.JobDone) else [],
            result=dict(event.result) if isinstance(event, m.JobDone) else {},
            error=event.error if isinstance(event, m.JobFailed) else None,
            finished_at=event.finished_at,
            call_id=event.call_id,
            event=event,
        )

    @classmethod
    def from_info(cls, info: m.JobInfo) -> JobOutcome:
        """Build from a finished job's ``JobInfo`` (resync after ``resumed: false``)."""
        return cls(
            job_id=info.job_id,
            tool=info.tool,
            state=info.state,
            summary=info.summary or f"{info.tool} {info.state.value}",
            artifacts=list(info.artifacts),
            result=dict(info.result or {}),
            error=info.error,
            finished_at=info.finished_at,
            call_id=info.call_id,
        )


FINISHED = frozenset({m.JobState.DONE, m.JobState.FAILED, m.JobState.CANCELLED})


class JobOwner(Protocol):
    """What a :class:`JobHandle` asks of the client part that made it."""

    def follow(self, handle: JobHandle) -> None:
        """Learn ``handle``'s end through ``job.get`` while it is awaited (SPEC I15)."""

    async def cancel(self, job_id: str, timeout: float | None) -> m.JobInfo:
        """Send ``job.cancel`` (SPEC J3); ``timeout`` in seconds, ``None``: the default."""


Confirm = Callable[[str, m.Decision, float | None], Awaitable[m.ConfirmResult]]
"""``tool.confirm`` of an approval id with a decision and a timeout (SPEC A3)."""


class JobHandle:
    """A job started by an async tool or a promoted sync call (SPEC I9, I14, J4).

    Attributes:
        job_id: the job's id.
        call_id: the call that created it.
        tool: the tool name.
        message: the short speakable dispatch message.
        promoted: ``True`` when a sync call outgrew its soft deadline (SPEC I14).
        progress: the latest ``(fraction, message)`` reported, or ``None``.
    """

    def __init__(self, owner: JobOwner, dispatched: m.Dispatched) -> None:
        self._owner = owner
        self.dispatched = dispatched
        self.job_id = dispatched.job_id
        self.call_id = dispatched.call_id
        self.tool = dispatched.tool
        self.message = dispatched.message
        self.promoted = dispatched.promoted
        self.progress: tuple[float | None, str | None] | None = None
        self.events_here = False
        """Set once a job event of this job reached this session: the job's events come
        here, so :meth:`result` stops following it through ``job.get`` (SPEC I15)."""
        self._following = False
        self._outcome: asyncio.Future[JobOutcome] = asyncio.get_running_loop().create_future()

    def __repr__(self) -> str:
        return f"JobHandle(job_id={self.job_id!r}, tool={self.tool!r}, done={self.done()})"

    def done(self) -> bool:
        """Whether the job's end is known."""
        return self._outcome.done()

    async def result(self, timeout: float | None = None) -> JobOutcome:
        """Wait for the job's end: its terminal event (``job.done``/``failed``/
        ``cancelled``) or, whichever comes first, ``job.get`` showing it finished.

        A job's events go to the session that started it only, so a handle that a
        re-sent ``call_id`` returned in another session (SPEC I15) would never see them.
        While this waits, the client therefore asks ``job.get`` at once and then with
        a doubling delay (0.5 s up to the reconnect backoff's cap) until the job ends,
        or until a job event shows that this session receives the job's events. The
        handle resolves exactly once, from whichever answer comes first.

        Args:
            timeout: seconds to wait; ``None`` waits as long as the job runs.

        Returns:
            The :class:`JobOutcome`; check ``ok`` / ``state`` (a failed job is an outcome,
            not an exception).

        Raises:
            RequestTimeout: no end within ``timeout``.
            SessionClosed: the client closed before the job ended.
        """
        self._owner.follow(self)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(self._outcome)
        except TimeoutError:
            raise RequestTimeout(f"job {self.job_id} did not end within {timeout} s") from None

    async def cancel(self, timeout: float | None = None) -> m.JobInfo:
        """Ask the server to cancel the job (SPEC J3); see :meth:`Client.cancel_job`."""
        return await self._owner.cancel(self.job_id, timeout)

    def _resolve(self, outcome: JobOutcome) -> None:
        if not self._outcome.done():
            self._outcome.set_result(outcome)

    def _fail(self, exc: BaseException) -> None:
        if not self._outcome.done():
            self._outcome.set_exception(exc)
            self._outcome.exception()  # mark retrieved: nobody may be waiting


class ApprovalRequest:
    """A gated call waiting for the user's decision (SPEC A2, A3).

    Attributes:
        approval_id: the server's unguessable id.
        call_id: the gated call.
        tool: the tool name.
        params: the call's parameters.
        expires_at: Unix time in seconds when the server denies it (SPEC A4), or ``None``.
        resolution: the ``tool.resolved`` event once settled, else ``None``.
    """

    def __init__(self, confirm: Confirm, start: m.ToolStart) -> None:
        assert start.approval_id is not None
        self._confirm = confirm
        self.event = start
        self.approval_id: str = start.approval_id
        self.call_id = start.call_id
        self.tool = start.tool
        self.params = dict(start.params)
        self.expires_at = start.expires_at
        self.resolution: m.ToolResolved | None = None
        self.decided: m.Decision | None = None
        self.handled = False
        """Set when the ``on_approval`` callback answered it."""
        self._settled = asyncio.Event()

    def __repr__(self) -> str:
        return f"ApprovalRequest({self.tool!r}, call_id={self.call_id!r}, settled={self.settled})"

    @property
    def settled(self) -> bool:
        """Whether the server settled it (``tool.resolved``) or the session that held it ended."""
        return self._settled.is_set()

    async def decide(self, decision: m.Decision, timeout: float | None = None) -> m.ConfirmResult:
        """Send ``tool.confirm`` (SPEC A3); the first decision wins.

        Args:
            decision: allow, deny or allow_always.
            timeout: seconds to wait for ``confirm.result``; ``None`` uses the client's
                request timeout.

        Returns:
            The ``confirm.result``; ``accepted`` is false with a ``reason`` when the
            decision changed nothing (already decided, expired, ...).
        """
        self.decided = decision
        return await self._confirm(self.approval_id, decision, timeout)

    async def allow(self, timeout: float | None = None) -> m.ConfirmResult:
        """Allow this one call."""
        return await self.decide(m.Decision.ALLOW, timeout)

    async def deny(self, timeout: float | None = None) -> m.ConfirmResult:
        """Deny it: the call completes with a declined result (SPEC A5)."""
        return await self.decide(m.Decision.DENY, timeout)

    async def allow_always(self, timeout: float | None = None) -> m.ConfirmResult:
        """Allow it and every later call of this tool in the session (SPEC A3)."""
        return await self.decide(m.Decision.ALLOW_ALWAYS, timeout)

    async def wait_settled(self, timeout: float | None = None) -> m.ToolResolved | None:
        """Wait for ``tool.resolved``; ``None`` when the session holding it ended instead."""
        try:
            async with asyncio.timeout(timeout):
                await self._settled.wait()
        except TimeoutError:
            text = f"approval {self.approval_id} not settled in {timeout} s"
            raise RequestTimeout(text) from None
        return self.resolution

    def _settle(self, resolved: m.ToolResolved | None) -> None:
        self.resolution = resolved
        self._settled.set()


_END = object()


class EventStream(Generic[T], AsyncIterator[T]):
    """An async iterator over client events, registered when created (not when first
    iterated), so nothing that arrives in between is missed.

    Iteration ends when the stream is closed or the client stops. Use ``async with`` or
    :meth:`close` to unsubscribe.
    """

    def __init__(self, registry: set[EventStream[T]]) -> None:
        self._queue: asyncio.Queue[T | object] = asyncio.Queue()
        self._registry = registry
        self._closed = False
        registry.add(self)

    def put(self, item: T) -> None:
        """Deliver one item (called by the client)."""
        if not self._closed:
            self._queue.put_nowait(item)

    def close(self) -> None:
        """Unsubscribe; a pending or later ``__anext__`` ends the iteration."""
        if not self._closed:
            self._closed = True
            self._registry.discard(self)
            self._queue.put_nowait(_END)

    async def next(self, timeout: float | None = None) -> T:
        """The next item.

        Args:
            timeout: seconds to wait; ``None`` waits forever.

        Raises:
            RequestTimeout: nothing arrived within ``timeout``.
            StopAsyncIteration: the stream is closed.
        """
        try:
            async with asyncio.timeout(timeout):
                item = await self._queue.get()
        except TimeoutError:
            raise RequestTimeout(f"no event within {timeout} s") from None
        if item is _END:
            self._queue.put_nowait(_END)
            raise StopAsyncIteration
        return item  # type: ignore[return-value]

    def __aiter__(self) -> EventStream[T]:
        return self

    async def __anext__(self) -> T:
        return await self.next()

    async def __aenter__(self) -> EventStream[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
