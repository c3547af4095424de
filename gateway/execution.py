"""Execution of a call: its context, hooks and handler (SPEC I5, I6, I8-I10, I14, A7).

:meth:`Execution.prepare` builds the :class:`~gateway.context.ToolContext` (I5) and runs
the pre-hooks (I6). :meth:`Execution.execute` re-checks every gate after the approval
wait (A7), then dispatches an async tool to the job runner (I9) or runs a sync one under
its timeout, promoting it to a job past ``promote_after`` (I8, I14); post-hooks (I10)
follow. Every path ends through :class:`~gateway.call_end.CallEnd`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from catalog.model import Mode, ToolDef
from gateway.authority import Authority, Lapse
from gateway.call_end import PASS_THROUGH, Call, CallEnd
from gateway.call_start import CallStart, mark_unstarted
from gateway.config import CallsConfig
from gateway.context import ProgressRelay, ToolContext, no_progress
from gateway.execute import as_object, run_handler
from gateway.failures import ToolFailure, describe
from gateway.hooks import CallInfo, PostHook, PreHook, run_post, run_pre
from gateway.jobs import NOT_DURABLE, Adopted, JobRunner, PostProcess
from gateway.ledger import CallLedger
from gateway.session import Session
from gateway.store import JobRow, StoreUnavailable
from gateway.store_rows import BadValue
from gateway.workers import Lane
from protocol import messages as m
from protocol.codec import decode_json, encode_json
from protocol.errors import ErrorCode
from protocol.outcomes import CallOutcome

if TYPE_CHECKING:
    from gateway.catalog_state import CatalogState

logger = logging.getLogger("gateway.pipeline")


class Execution:
    """Runs an admitted, approved call's handler; one per server.

    Args:
        catalog: the server's current catalog state (for :meth:`rerun_plan`).
        jobs: the job runner (SPEC I9, I14).
        calls: call settings (``default_timeout``, ``thread_wait``).
        pre_hooks: pre-execute hooks in order (SPEC I6).
        post_hooks: post-execute hooks in order (SPEC I10).
        pool: the worker lane for plain handlers of sync calls (SPEC S3, E3).
        data_dir: the folder handed to tools as ``ctx.data_dir``.
        authority: the re-check of every gate after each wait (SPEC A7, S6).
        ledger: the principals' call ids (SPEC I15): a call's rows made durable.
        end: the one exit.
    """

    def __init__(
        self,
        catalog: CatalogState,
        jobs: JobRunner,
        calls: CallsConfig,
        pre_hooks: Sequence[PreHook],
        post_hooks: Sequence[PostHook],
        pool: Lane,
        data_dir: Any,
        authority: Authority,
        ledger: CallLedger,
        end: CallEnd,
    ) -> None:
        self.catalog = catalog
        self.jobs = jobs
        self.calls = calls
        self.pre_hooks = list(pre_hooks)
        self.post_hooks = list(post_hooks)
        self.pool = pool
        self.data_dir = data_dir
        self.authority = authority
        self.ledger = ledger
        self.end = end

    async def prepare(self, call: Call, tool: ToolDef) -> tuple[ToolContext, CallInfo] | None:
        """SPEC I5, I6: the call's context, then the pre-hooks; ``None`` when a hook
        denied the call (it has ended ``denied_by_hook``)."""
        ctx, info = self.context(call, tool)
        if not self.pre_hooks:
            return ctx, info  # the default: no coroutine, no callback per call
        # SPEC J6: a call that waits for a pre-hook has not started; the store is told.
        deny = await run_pre(self.pre_hooks, info, lambda: mark_unstarted(call, self.ledger))
        if deny is None:
            return ctx, info
        self.end.error(
            call,
            ErrorCode.DENIED_BY_HOOK,
            deny.reason,
            CallOutcome.DENIED_BY_HOOK,
            reason_code=deny.reason_code,
        )
        return None

    def context(self, call: Call, tool: ToolDef) -> tuple[ToolContext, CallInfo]:
        """SPEC I5: the handler's context and the hooks' view of the call, as of now."""
        session = call.session
        ctx = ToolContext(
            session_id=session.id,
            user=session.user,
            profile=session.profile.name,
            context=dict(session.context),
            call_id=call.call_id,
            tool=tool.name,
            data_dir=self.data_dir,
            tenant=session.tenant,
            progress=ProgressRelay() if tool.promote_after is not None else no_progress,
            recheck=self.authority.gate(session, tool.name),
        )
        info = CallInfo(
            session.id,
            session.user,
            session.profile.name,
            call.call_id,
            tool,
            call.params,
            ctx.context,
        )
        return ctx, info

    async def execute(self, call: Call, tool: ToolDef, ctx: ToolContext, info: CallInfo) -> None:
        """SPEC A7, I8, I9, I14: run the approved call to its terminal event, once what
        must be durable before its handler (or its job) starts is (SPEC A3, I15, J6:
        :func:`_durable_now`)."""
        # SPEC A7: the approval was a wait; every gate again, on the state now, so a
        # lapsed call ends in call.error and is never dispatched. (The same check runs
        # right before every handler start, after any queue or thread wait, too.)
        lapse = self.authority.check(call.session, tool.name) if call.approval else None
        if lapse is not None:
            self.end.lapsed(call, lapse)
            return
        if not _durable_now(self.ledger, call, tool) and not await _made_durable(
            self.ledger, self.end, call
        ):
            return
        if tool.mode is Mode.ASYNC:
            self._dispatch(call, tool, ctx, info)
            return
        await self._execute_sync(call, tool, ctx, info)

    def _dispatch(self, call: Call, tool: ToolDef, ctx: ToolContext, info: CallInfo) -> None:
        """SPEC I9: answer ``dispatched`` at once; the job runner takes over. A job that
        cannot be created ends the call as :func:`_not_a_job` says."""
        try:
            job_id = self.jobs.submit(
                call.session, tool, call.params, ctx, self._post(info), unstarted=call.unstarted
            )
        except BaseException as exc:
            _not_a_job(self.end, call, tool, exc)
            return
        call.job_id = job_id
        message = tool.dispatch_message or f"Started {tool.name}."
        self.end.finish(call, CallOutcome.DISPATCHED, m.Dispatched, job_id=job_id, message=message)

    def rerun_plan(self, row: JobRow) -> tuple[ToolDef, ToolContext, PostProcess] | None:
        """How to run a stored job after a restart (SPEC J5, J6): ``None`` when its tool
        is no longer in the catalog with a server handler. Whether it may run again (a
        job that had started runs again only when its tool is ``idempotent``; one that
        never started always may) is the job runner's decision."""
        tool = self.catalog.current.tools.get(row.tool)
        if tool is None or tool.func is None or tool.mode is Mode.CLIENT:
            return None
        ctx = ToolContext(
            session_id=row.session_id,
            user=row.user,
            profile=row.profile,
            context=dict(row.context),
            call_id=row.call_id or "",
            tool=tool.name,
            data_dir=self.data_dir,
            tenant=row.tenant,
        )
        info = CallInfo(
            row.session_id, row.user, row.profile, ctx.call_id, tool, row.params, ctx.context
        )
        return tool, ctx, self._post(info)

    def _post(self, info: CallInfo) -> PostProcess:
        async def post(result: dict[str, Any]) -> tuple[dict[str, Any], bool]:
            return await run_post(self.post_hooks, info, result)

        return post

    async def _execute_sync(
        self, call: Call, tool: ToolDef, ctx: ToolContext, info: CallInfo
    ) -> None:
        """SPEC I8, I14: run with the run timeout; promote past the soft deadline."""
        assert tool.func is not None
        limit = self._run_timeout(tool)
        # SPEC E3: the limit counts from the handler's start; the wait for a worker
        # thread is bounded by calls.thread_wait (then ``busy``, never started). SPEC
        # I8, J6: executing only once its handler starts; a wait is recorded (CallStart).
        start = CallStart(call, self.ledger)
        # SPEC I14, J5: a handler that may be promoted gets its own copy of the
        # arguments; the job a promotion creates stores the ones the call was given.
        params = call.params
        if tool.promote_after is not None:
            params = decode_json(encode_json(params))
            # SPEC J1: a job that adopts the handler holds its slots until it returned.
            start.returned = asyncio.get_running_loop().create_future()
        handler = run_handler(
            tool.func,
            params,
            ctx,
            self.pool,
            limit,
            wait=self.calls.thread_wait,
            on_start=start,
            waiter=start,
            returned=start.returned,
        )
        try:
            if tool.promote_after is None:
                # Awaited in this task: a handler that answers at once costs no extra
                # loop turn, so tool_start and result share one commit (SPEC D1).
                value = await handler
            else:
                work = asyncio.ensure_future(handler)
                try:
                    done, _ = await asyncio.wait({work}, timeout=tool.promote_after)
                except asyncio.CancelledError:
                    work.cancel()
                    raise
                if not done:
                    self._promote(call, tool, ctx, info, (work, start))
                    return
                value = work.result()
        except TimeoutError:
            text = f"{tool.name} did not finish within {limit} s"
            self.end.error(call, ErrorCode.TIMEOUT, text, CallOutcome.TIMEOUT)
            return
        except Lapse as lapse:
            self.end.lapsed(call, lapse)
            return
        except ToolFailure as failure:
            # SPEC M2, M3: a typed failure keeps its code and its exact text.
            self.end.error(call, failure.code, failure.message, failure.outcome)
            return
        except PASS_THROUGH:
            raise
        except BaseException as exc:  # SPEC I16: any other raise ends the call
            logger.info("handler %s raised %s", tool.name, type(exc).__name__, exc_info=True)
            self.end.error(call, ErrorCode.HANDLER_ERROR, describe(exc), CallOutcome.HANDLER_ERROR)
            return
        result, replaced = await run_post(self.post_hooks, info, as_object(value))
        self.end.finish(call, CallOutcome.OK, m.Result, result=result, replaced=replaced)

    def _run_timeout(self, tool: ToolDef) -> float | None:
        limit = self.calls.default_timeout if tool.timeout is None else tool.timeout
        return None if tool.long_running else (limit or None)

    def _promote(
        self, call: Call, tool: ToolDef, ctx: ToolContext, info: CallInfo, work: Adopted
    ) -> None:
        """SPEC I14: the running call becomes a job; the client hears ``dispatched`` now.

        A job that cannot be created (its row cannot be stored, any other failure of the
        runner) cancels the handler and ends the call with one typed ``call.error``
        (SPEC I16, :func:`_not_a_job`); nothing of the job is left behind."""
        try:
            job_id = self.jobs.submit(
                call.session,
                tool,
                call.params,
                ctx,
                self._post(info),
                adopt=work,
                unstarted=call.unstarted,
            )
        except BaseException as exc:
            work[0].cancel()
            _not_a_job(self.end, call, tool, exc)
            return
        call.job_id = job_id
        _in_flight_until_done(call.session, work[0])
        message = (
            tool.dispatch_message
            or f"{tool.name} is taking a while; I'll report back when it's done."
        )
        self.end.finish(
            call, CallOutcome.PROMOTED, m.Dispatched, job_id=job_id, message=message, promoted=True
        )


def _durable_now(ledger: CallLedger, call: Call, tool: ToolDef) -> bool:
    """SPEC A3, I15, J6, D6: whether the call's handler, or its job, may start with no
    wait for a commit. Nothing must be durable first for an ungated idempotent tool
    (SPEC I15: a re-send may run it again) or an ungated job (its start makes its own
    ``running`` row durable, SPEC J5); for any other call, its ``running`` rows must
    be (:meth:`CallLedger.durable_now <gateway.ledger.CallLedger.durable_now>`: they
    may be already). A decided approval's outcome must be committed before any
    handler starts, a job's and an idempotent tool's too: else a kill after a failed
    commit of the decision (D6) leaves the call waiting for its approval in the store,
    and the restart says "it did not run" of a handler that ran (J6). Not a coroutine:
    an ungated call costs no wait and no commit more."""
    decided = call.approval is not None
    if not decided and (tool.idempotent or tool.mode is Mode.ASYNC):
        return True
    return ledger.durable_now(call.session, call.call_id, decided)


async def _made_durable(ledger: CallLedger, end: CallEnd, call: Call) -> bool:
    """For a call :func:`_durable_now` said must wait: commit what it must (SPEC A3,
    I15, D6; :meth:`CallLedger.durable <gateway.ledger.CallLedger.durable>`).
    ``False`` when the store could not: the call has ended ``unavailable`` "the tool
    did not run" (it did not: no handler started, no job was created)."""
    if await ledger.durable(call.session, call.approval is not None):
        return True
    end.error(call, ErrorCode.UNAVAILABLE, NOT_DURABLE, CallOutcome.UNAVAILABLE)
    return False


def _in_flight_until_done(session: Session, handler: asyncio.Future[Any]) -> None:
    """SPEC E2, I14: a promoted call's handler counts in flight until it returns."""
    if not handler.done():
        session.promoted += 1
        handler.add_done_callback(lambda _: _unpromoted(session))


def _unpromoted(session: Session) -> None:
    """A promoted call's handler returned: it no longer counts in flight (SPEC E2)."""
    session.promoted -= 1


def _not_a_job(end: CallEnd, call: Call, tool: ToolDef, exc: BaseException) -> None:
    """The call's job could not be created (SPEC I9, I14, I16): its row cannot be
    stored (:class:`~gateway.store_rows.BadValue`) or the runner failed. The call
    ends in one typed ``call.error``: ``unavailable`` when the store refused, else
    ``handler_error`` "the call could not become a job: …". Cancellation and exit
    requests propagate."""
    if isinstance(exc, PASS_THROUGH):
        raise exc
    logger.warning(
        "call %s (%s) could not become a job: %s", call.call_id, tool.name, describe(exc)
    )
    if isinstance(exc, StoreUnavailable):
        text = "the store cannot keep the job right now; the call was cancelled"
        end.error(call, ErrorCode.UNAVAILABLE, text, CallOutcome.UNAVAILABLE)
        return
    why = str(exc) if isinstance(exc, BadValue) else describe(exc)
    text = f"the call could not become a job: {why}"
    end.error(call, ErrorCode.HANDLER_ERROR, text, CallOutcome.HANDLER_ERROR)
