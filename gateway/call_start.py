"""The start of a sync call's handler, and its waits before it (SPEC I8, J6).

A plain handler runs in a worker thread (:mod:`gateway.workers`); when every thread the
call may use is held, the call waits for one. A pre-hook that returns an awaitable
(SPEC I6) may make the call wait too. A call cut off by a crash while it waits never
ran, and a restart must say so (SPEC J6: "one that never started is never reported as
interrupted"), where a call whose handler had started answers the restart's
``cancelled`` "while this call ran". :func:`mark_unstarted` and :class:`CallStart` make
the difference durable, in the call's ledger row (:meth:`CallLedger.waiting
<gateway.ledger.CallLedger.waiting>`), and only for a call that waits: a call that gets
its thread at once, or whose handler is a coroutine, after plain pre-hooks only,
stages and commits nothing more than before (issue 13).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from gateway.call_end import Call
from gateway.execute import Start
from gateway.failures import ToolFailure
from gateway.jobs import NOT_DURABLE
from gateway.ledger import CallLedger
from protocol.errors import ErrorCode


def mark_unstarted(call: Call, ledger: CallLedger) -> None:
    """SPEC J6: ``call`` waits from now on (a worker thread, a pre-hook's awaitable) and
    its handler has not started: its ledger row says so, durable at the next loop turn's
    flush (scheduled here: a session that gets no ungated ``tool_start`` sends no frame
    that would bring one, and the row would stay staged for as long as the server is
    idle). Its start is then made durable before its handler runs
    (:meth:`CallStart.begin`). Once is enough: a second wait finds it marked."""
    if not call.unstarted and ledger.waiting(call.session, call.call_id):
        call.unstarted = True
        call.session.outbox.soon()


class CallStart(Start):
    """The ``on_start`` and the :class:`~gateway.workers.Waiter` of a sync call's
    handler (:func:`gateway.execute.run_handler`; SPEC I8, J6, I15).

    A call whose handler starts without waiting for a worker thread is marked
    executing at its start (an expiring session no longer cancels it, SPEC I8, I15),
    as before: nothing is staged, committed or awaited.

    A call that has to wait is recorded as not started when the wait begins
    (:meth:`waiting`): a restart then ends it ``unavailable`` "the server restarted
    before this call started; it did not run" (SPEC J6). When it gets its thread, its
    start stages it as started and makes that durable before the handler runs (a
    journal append at once on SQLite, else its share of the turn's group commit, as a
    job's start does), and only then is the call executing. So a kill can only ever
    report a call that did not run as not started: never one that ran. When the start
    cannot be made durable, :class:`~gateway.failures.ToolFailure` ``unavailable``
    ends the call and its handler does not run.

    A call promoted to a job while it waits (SPEC I14) is the job's to record: its
    ``queued`` row says it has not started, the call has ended ``dispatched``, and the
    job runner points :attr:`then` at the job's start instead of :meth:`begin`.

    Args:
        call: the call.
        ledger: the principals' call ids (SPEC I15), where the record is staged.
    """

    __slots__ = ("_call", "_ledger")

    def __init__(self, call: Call, ledger: CallLedger) -> None:
        super().__init__()
        self._call = call
        self._ledger = ledger

    def waiting(self) -> None:
        """SPEC J6: the handler waits for a worker thread from now on
        (:func:`mark_unstarted`)."""
        if self.then is None:  # else promoted already: its job's queued row is the record
            mark_unstarted(self._call, self._ledger)

    def begin(self) -> Awaitable[None] | None:
        """The call's own start: executing now, or, after a recorded wait (a worker
        thread, a pre-hook), once its start is durable (SPEC J6)."""
        call = self._call
        if not call.unstarted:
            call.executing = True
            return None
        session = call.session
        self._ledger.started(session, call.call_id)
        if not session.store.journals:
            return self._committed(session.outbox.durable(at_once=False))
        if not session.outbox.commit():
            raise ToolFailure(ErrorCode.UNAVAILABLE, NOT_DURABLE)
        call.executing = True
        return None

    async def _committed(self, commit: asyncio.Future[bool]) -> None:
        """Wait for the group commit that holds the call's start, then mark it executing;
        :class:`~gateway.failures.ToolFailure` ``unavailable`` when it failed."""
        if not await commit:
            raise ToolFailure(ErrorCode.UNAVAILABLE, NOT_DURABLE)
        self._call.executing = True
