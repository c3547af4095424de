"""The client's jobs: handles, how each job ended, and following jobs through ``job.get``
(SPEC I9, I14, I15, J2-J4, D3).

:class:`Jobs` is one part of :class:`toolbus.client.Client`, built with the few things
it uses: a way to ask ``job.get`` and ``job.cancel``, a task spawner, the reconnect
backoff (its cap bounds the follow delay) and a test for "the client is closed". The
inbound part hands it ``dispatched`` and job events; the link part asks it to resync
after ``resumed: false`` and to fail every handle when the session ends.
"""

# ASYNC109: ``timeout=`` arguments are the API (SPEC K1), applied with asyncio.timeout().
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Final

from protocol import messages as m
from toolbus.errors import RequestRefused, ToolbusClientError
from toolbus.handles import FINISHED, Backoff, JobEvent, JobHandle, JobOutcome

KEEP_OUTCOMES: Final = 1000
"""Finished job outcomes remembered for handles created late (recorded re-sends)."""

FOLLOW_FIRST_DELAY: Final = 0.5
"""Seconds between the first two ``job.get`` of a followed job; doubles up to the
reconnect backoff's cap (SPEC I15, see :meth:`Jobs.follow`)."""

AskJob = Callable[[str], Awaitable[m.JobInfo]]
"""``job.get`` of one job id (SPEC J3); raises like :meth:`Client.job`."""


class Jobs:
    """Every job handle of one client, and how the jobs ended (SPEC J4, I15).

    Args:
        ask: sends ``job.get`` and returns the job's info.
        cancel: sends ``job.cancel`` (``job_id``, ``timeout`` in seconds or ``None``).
        spawn: runs a coroutine as a task the client cancels when it closes.
        backoff: the reconnect policy; its ``cap`` bounds the follow delay.
        is_open: whether the client still runs.
    """

    def __init__(
        self,
        ask: AskJob,
        cancel: Callable[[str, float | None], Awaitable[m.JobInfo]],
        spawn: Callable[[Awaitable[Any]], None],
        backoff: Backoff,
        is_open: Callable[[], bool],
    ) -> None:
        self._ask = ask
        self._cancel = cancel
        self._spawn = spawn
        self._backoff = backoff
        self._is_open = is_open
        self.handles: dict[str, JobHandle] = {}
        """Job id -> the handle of a job whose end is not known yet."""
        self._outcomes: OrderedDict[str, JobOutcome] = OrderedDict()

    def dispatched(self, msg: m.Dispatched) -> JobHandle:
        """The handle of ``msg``'s job, made once; already resolved when its end is known
        (a recorded ``dispatched`` re-sent after the job ended, SPEC I12)."""
        handle = self.handles.get(msg.job_id)
        if handle is None:
            handle = JobHandle(self, msg)
            self.handles[msg.job_id] = handle
            known = self._outcomes.get(msg.job_id)
            if known is not None:
                handle._resolve(known)
        return handle

    def event(self, msg: JobEvent) -> None:
        """A job event reached this session: note progress, or resolve the handle."""
        handle = self.handles.get(msg.job_id)
        if handle is not None:
            handle.events_here = True
        if isinstance(msg, m.JobProgress):
            if handle is not None:
                handle.progress = (msg.progress, msg.message)
        else:
            self.ended(JobOutcome.from_event(msg))

    def ended(self, outcome: JobOutcome) -> None:
        """Record ``outcome`` (the last :data:`KEEP_OUTCOMES`) and resolve its handle."""
        self._outcomes[outcome.job_id] = outcome
        while len(self._outcomes) > KEEP_OUTCOMES:
            self._outcomes.popitem(last=False)
        handle = self.handles.pop(outcome.job_id, None)
        if handle is not None:
            handle._resolve(outcome)

    async def cancel(self, job_id: str, timeout: float | None) -> m.JobInfo:
        """``job.cancel`` (SPEC J3), for :meth:`JobHandle.cancel`."""
        return await self._cancel(job_id, timeout)

    def follow(self, handle: JobHandle) -> None:
        """Start following ``handle`` through ``job.get`` (once; SPEC I15, K1).

        A job started by another session of the user (a re-sent ``call_id``) sends its
        events there; asking ``job.get`` at once, then with a doubling delay, is how its
        re-sender learns its end, exactly once.
        """
        if handle._following or handle.done() or not self._is_open():
            return
        handle._following = True
        self._spawn(self._poll(handle))

    async def _poll(self, handle: JobHandle) -> None:
        """``job.get`` until the job ended, a job event showed its events come to this
        session, or the client closed."""
        delay = FOLLOW_FIRST_DELAY
        while not handle.done() and not handle.events_here and self._is_open():
            try:
                info = await self._ask(handle.job_id)
            except RequestRefused as exc:
                handle._fail(exc)
                return
            except ToolbusClientError:
                info = None  # no answer (a reconnect is under way): ask again later
            if info is not None and info.state in FINISHED:
                self.ended(JobOutcome.from_info(info))
                return
            await asyncio.wait([handle._outcome], timeout=delay)
            delay = min(delay * 2, self._backoff.cap)

    async def resync(self, resent: Callable[[], bool], stop: asyncio.Event) -> None:
        """After ``resumed: false``: the old session's pushes are gone, so learn how
        unfinished jobs ended from ``job.get`` (SPEC D3), polling those still running,
        and keep going while ``resent()`` says a re-sent invoke may still bring a job
        (a recorded ``dispatched`` whose events went to the lost session, SPEC I15)."""
        delay = 0.5
        while True:
            waiting = [h for h in self.handles.values() if not h.done()]
            if (not waiting and not resent()) or not self._is_open():
                return
            for handle in waiting:
                try:
                    info = await self._ask(handle.job_id)
                except RequestRefused as exc:
                    handle._fail(exc)
                    continue
                except ToolbusClientError:
                    return
                if info.state in FINISHED:
                    self.ended(JobOutcome.from_info(info))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await stop.wait()
            delay = min(delay * 2, self._backoff.cap) if waiting else 0.5

    def fail(self, reason: BaseException) -> None:
        """The session ended: every handle still waiting raises ``reason``."""
        for handle in self.handles.values():
            handle._fail(reason)
