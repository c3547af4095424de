"""The invocation pipeline, in SPEC order I1-I14.

:meth:`Pipeline.accept` runs the cheap, synchronous checks of an ``invoke`` (limits,
idempotency) and starts the call as a task; :meth:`Pipeline.run` is that task:

    I13 stale catalog -> I1 unknown tool -> I2 gates -> I3 wrong route -> I4 params
    -> I5 context -> I6 pre hooks -> I7 approval -> I8/I9/I14 execute
    -> I10 post hooks -> terminal reply -> I11 audit -> I12 record

Every path ends in exactly one terminal event (``result``, ``dispatched`` or
``call.error``), emitted through :meth:`Pipeline._finish`, which also records it for
idempotent re-sends (SPEC I12) and writes the audit record (SPEC I11).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from catalog.exports import suggest
from catalog.model import Mode, ToolDef
from catalog.visibility import Scope, check_access
from gateway import audit
from gateway.approvals import Approvals
from gateway.audit import Outcome
from gateway.config import CallsConfig, LimitsConfig
from gateway.context import ProgressRelay, ToolContext, no_progress
from gateway.execute import as_object, run_handler
from gateway.hooks import CallInfo, PostHook, PreHook, run_post, run_pre
from gateway.jobs import JobRunner, PostProcess
from gateway.metrics import Metrics
from gateway.session import Session
from gateway.store import JobRow
from protocol import messages as m
from protocol.codec import encode_json
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from gateway.catalog_state import CatalogState

logger = logging.getLogger("gateway.pipeline")

MAX_VIOLATIONS = 50
"""Violations listed in one ``invalid_params`` reply (SPEC I4); the message counts all."""
MAX_VIOLATION_CHARS = 300
"""Longest violation message sent; longer ones (a list of 2,000 unknown keys) are cut."""


def _clip(text: str) -> str:
    if len(text) <= MAX_VIOLATION_CHARS:
        return text
    return text[: MAX_VIOLATION_CHARS - 1] + "…"


@dataclass(slots=True)
class Call:
    """One invocation on its way through the pipeline."""

    session: Session
    call_id: str
    tool_name: str
    params: dict[str, Any]
    started: float
    tool: ToolDef | None = None
    approval: dict[str, Any] | None = None
    job_id: str | None = None
    cancel_requested: bool = False
    approval_id: str | None = None
    """The approval this call waits on, while it waits."""
    audit_extra: dict[str, Any] = field(default_factory=dict)


class Pipeline:
    """Runs ``invoke`` messages (SPEC I1-I14); one per server.

    Args:
        catalog: the server's current catalog state (swapped on hot reload).
        approvals: the approval registry.
        jobs: the job runner.
        calls: call settings (timeouts, declined text, audit size).
        limits: per-session limits (SPEC E2).
        pre_hooks: pre-execute hooks in order (SPEC I6).
        post_hooks: post-execute hooks in order (SPEC I10).
        metrics: the server's metrics.
        pool: worker threads for plain handlers (SPEC S3).
        data_dir: the folder handed to tools as ``ctx.data_dir``.
        clock: Unix time in seconds.
    """

    def __init__(
        self,
        catalog: CatalogState,
        approvals: Approvals,
        jobs: JobRunner,
        calls: CallsConfig,
        limits: LimitsConfig,
        pre_hooks: Sequence[PreHook],
        post_hooks: Sequence[PostHook],
        metrics: Metrics,
        pool: ThreadPoolExecutor,
        data_dir: Any,
        clock: Callable[[], float],
    ) -> None:
        self.catalog = catalog
        self.approvals = approvals
        self.jobs = jobs
        self.calls = calls
        self.limits = limits
        self.pre_hooks = list(pre_hooks)
        self.post_hooks = list(post_hooks)
        self.metrics = metrics
        self.pool = pool
        self.data_dir = data_dir
        self.clock = clock
        self._call_state: dict[tuple[str, str], Call] = {}

    # -- admission (synchronous) ---------------------------------------------------------

    def accept(self, session: Session, msg: m.Invoke) -> None:
        """Admit an ``invoke`` and start it, or refuse it at once (SPEC E2, I12).

        Refusals for limits and duplicate in-flight ids are ``error`` replies, not call
        outcomes: the call never started, so the client may retry the same ``call_id``.
        A ``call_id`` that already finished gets its recorded terminal event again.
        """
        call_id = msg.call_id
        if call_id in session.inflight:
            self._refuse(session, msg, ErrorCode.DUPLICATE_CALL, "this call_id is still running")
            return
        if call_id in session.done_calls:
            self._resend(session, call_id)
            return
        if len(session.inflight) >= self.limits.max_inflight_calls:
            self._refuse(session, msg, ErrorCode.TOO_MANY_INFLIGHT, "too many calls in flight")
            return
        if not session.bucket.take(time.monotonic()):
            self._refuse(session, msg, ErrorCode.RATE_LIMITED, "invoke rate limit reached")
            return
        call = Call(session, call_id, msg.tool, dict(msg.params or {}), time.perf_counter())
        session.store.stage_call(session.id, call_id, "running", encode_json({"tool": msg.tool}))
        task = asyncio.get_running_loop().create_task(self.run(call, msg.catalog_version))
        session.inflight[call_id] = task
        self._call_state[(session.id, call_id)] = call

    def _refuse(self, session: Session, msg: m.Invoke, code: ErrorCode, text: str) -> None:
        self.metrics.errors.labels(code.value).inc()
        details = {"call_id": msg.call_id}
        session.reply(m.Error(id=msg.id, code=code, message=text, details=details))

    def _resend(self, session: Session, call_id: str) -> None:
        # The terminal event may still be staged (finished this tick): commit it first,
        # or the store has no body to re-send and the client would get nothing (I12).
        session.outbox.flush()
        recorded = session.store.call(session.id, call_id)
        if recorded is not None and recorded[1] is not None:
            session.emit_raw(recorded[1])

    def cancel(self, session: Session, call_id: str) -> bool:
        """Cancel a running or approval-pending call (SPEC I8, A4, F11)."""
        task = session.inflight.get(call_id)
        call = self._call_state.get((session.id, call_id))
        if task is None or call is None:
            return False
        call.cancel_requested = True
        if call.approval_id is not None:
            # SPEC A4: settled now, so a confirm in the same batch of frames finds it
            # decided (cancelled) instead of allowing a call that is being cancelled.
            self.approvals.settle(
                call.approval_id, m.Resolution.DENIED, m.ResolutionReason.CANCELLED
            )
        task.cancel()
        return True

    # -- the pipeline --------------------------------------------------------------------

    async def run(self, call: Call, catalog_version: str | None) -> None:
        """Run one call to its single terminal event (SPEC I1-I14)."""
        session = call.session
        try:
            await self._steps(call, catalog_version)
        except asyncio.CancelledError:
            # SPEC I8: the call ends ``cancelled`` and the cancellation propagates.
            self._error(call, ErrorCode.CANCELLED, "the call was cancelled", Outcome.CANCELLED)
            raise
        except Exception:
            logger.exception("internal error in call %s of session %s", call.call_id, session.id)
            self._error(call, ErrorCode.HANDLER_ERROR, "internal error", Outcome.HANDLER_ERROR)
        finally:
            session.inflight.pop(call.call_id, None)
            self._call_state.pop((session.id, call.call_id), None)

    async def _steps(self, call: Call, catalog_version: str | None) -> None:
        session = call.session
        if catalog_version is not None and catalog_version != session.catalog_version:
            self._stale(call)
            return
        tool = self._lookup(call)
        if tool is None:
            return
        call.tool = tool
        if not self._admissible(call, tool):
            return
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
        deny = await run_pre(self.pre_hooks, info)
        if deny is not None:
            self._error(
                call,
                ErrorCode.DENIED_BY_HOOK,
                deny.reason,
                Outcome.DENIED_BY_HOOK,
                reason_code=deny.reason_code,
            )
            return
        if not await self._approved(call, tool):
            return
        if tool.mode is Mode.ASYNC:
            self._dispatch(call, tool, ctx, info)
            return
        await self._execute_sync(call, tool, ctx, info)

    def _stale(self, call: Call) -> None:
        """SPEC I13: refuse, then push the current catalog."""
        session = call.session
        self._error(
            call,
            ErrorCode.STALE_CATALOG,
            "the catalog changed; use the new one",
            Outcome.STALE_CATALOG,
            catalog_version=session.catalog_version,
        )
        self.catalog.push(session, m.CatalogReason.STALE, force=True)

    def _lookup(self, call: Call) -> ToolDef | None:
        """SPEC I1, C3: a tool absent from the session's catalog does not exist for it."""
        tool = self.catalog.current.tools.get(call.tool_name)
        if tool is not None and tool.name in call.session.catalog_names:
            return tool
        visible = call.session.catalog_names
        guidance = self.catalog.current.guidance.get(call.tool_name)
        self._error(
            call,
            ErrorCode.UNKNOWN_TOOL,
            f"no tool named {call.tool_name!r}",
            Outcome.UNKNOWN_TOOL,
            suggestions=suggest(call.tool_name, visible),
            guidance=guidance,
        )
        return None

    def _admissible(self, call: Call, tool: ToolDef) -> bool:
        """SPEC I2 (gates re-checked now), I3 (route), I4 (parameters)."""
        session = call.session
        denial = check_access(
            tool,
            session.profile,
            Scope(session.context, session.origin),
            self.catalog.current.safe_default,
        )
        if denial is not None:
            code = ErrorCode(denial.value)
            self._error(
                call, code, f"{tool.name} is not available: {denial.value}", Outcome(denial.value)
            )
            return False
        if tool.mode is Mode.CLIENT:
            self._error(
                call,
                ErrorCode.WRONG_ROUTE,
                f"{tool.name} runs in the client, not on the server",
                Outcome.WRONG_ROUTE,
            )
            return False
        violations = self.catalog.validators[tool.name].validate(call.params)
        if violations:
            # Every violation up to a bound: a hostile call with thousands of bad keys
            # gets a reply of bounded size; the message still gives the total.
            wire = [
                m.Violation(pointer=v.pointer, message=_clip(v.message), keyword=v.keyword)
                for v in violations[:MAX_VIOLATIONS]
            ]
            shown = "" if len(violations) <= MAX_VIOLATIONS else f", first {MAX_VIOLATIONS} listed"
            self._error(
                call,
                ErrorCode.INVALID_PARAMS,
                f"{len(violations)} parameter problem(s){shown}",
                Outcome.INVALID_PARAMS,
                violations=wire,
            )
            return False
        return True

    def _needs_approval(self, session: Session, tool: ToolDef) -> bool:
        """SPEC A1."""
        if tool.name in session.grants or tool.name in session.profile.auto_approve:
            return False
        return tool.requires_approval or session.confirm_tool_calls

    async def _approved(self, call: Call, tool: ToolDef) -> bool:
        """SPEC I7, A1-A6: ``tool_start``, and when gated, wait for the decision."""
        session = call.session
        if not self._needs_approval(session, tool):
            session.emit(m.ToolStart, call_id=call.call_id, tool=tool.name, params=call.params)
            return True
        if len(session.pending_approvals) >= self.limits.max_pending_approvals:
            self._error(
                call,
                ErrorCode.TOO_MANY_PENDING_APPROVALS,
                "too many approvals pending",
                Outcome.CANCELLED,
            )
            return False
        # SPEC A2: registered before tool_start is emitted, so an instant answer is kept.
        approval = self.approvals.open(
            session.id, session.user, call.call_id, tool.name, call.params
        )
        session.pending_approvals.add(approval.approval_id)
        call.approval_id = approval.approval_id
        note = encode_json({"tool": tool.name, "approval_id": approval.approval_id})
        session.store.stage_call(session.id, call.call_id, "running", note)
        self.metrics.pending_approvals.inc()
        session.emit(
            m.ToolStart,
            call_id=call.call_id,
            tool=tool.name,
            params=call.params,
            approval_id=approval.approval_id,
            expires_at=approval.expires_at,
        )
        try:
            # F01: waiting decides nothing; only Approvals.settle does.
            outcome = await approval.wait()
        except asyncio.CancelledError:
            self.approvals.settle(
                approval.approval_id, m.Resolution.DENIED, m.ResolutionReason.CANCELLED
            )
            assert approval.outcome is not None
            self._resolved(call, approval.approval_id, tool, approval.outcome)
            raise
        self._resolved(call, approval.approval_id, tool, outcome)
        if outcome.resolution is m.Resolution.ALLOWED:
            if outcome.always:
                session.grants.add(tool.name)
                session.save()
            return True
        self._declined(call, tool, outcome.reason)
        return False

    def _resolved(self, call: Call, approval_id: str, tool: ToolDef, outcome: Any) -> None:
        """SPEC A6: the resolution is an event in the log and part of the audit record."""
        session = call.session
        session.pending_approvals.discard(approval_id)
        call.approval_id = None
        # The recovery note no longer names the approval: it is settled (SPEC A3/A6: a
        # restart must not resolve it a second time).
        note = encode_json({"tool": tool.name})
        session.store.stage_call(session.id, call.call_id, "running", note)
        self.metrics.pending_approvals.dec()
        call.approval = {
            "approval_id": approval_id,
            "resolution": outcome.resolution.value,
            "reason": outcome.reason.value,
            "always": outcome.always,
            "at": outcome.at,
            "by": session.user if outcome.reason is m.ResolutionReason.USER else "server",
        }
        session.emit(
            m.ToolResolved,
            call_id=call.call_id,
            approval_id=approval_id,
            tool=tool.name,
            resolution=outcome.resolution,
            reason=outcome.reason,
            always=outcome.always,
        )

    def _declined(self, call: Call, tool: ToolDef, reason: m.ResolutionReason) -> None:
        """SPEC A5: a declined call completes normally, telling the model the user said no."""
        result = {"declined": True, "reason": reason.value, "message": self.calls.declined_message}
        outcome = (
            Outcome.APPROVAL_TIMEOUT
            if reason is m.ResolutionReason.TIMEOUT
            else Outcome.REJECTED_BY_USER
        )
        self._finish(call, outcome, m.Result, result=result, declined=True)

    def _dispatch(self, call: Call, tool: ToolDef, ctx: ToolContext, info: CallInfo) -> None:
        """SPEC I9: answer ``dispatched`` at once; the job runner takes over."""
        job_id = self.jobs.submit(call.session, tool, call.params, ctx, self._post(info))
        call.job_id = job_id
        message = tool.dispatch_message or f"Started {tool.name}."
        self._finish(call, Outcome.DISPATCHED, m.Dispatched, job_id=job_id, message=message)

    def rerun_plan(self, row: JobRow) -> tuple[ToolDef, ToolContext, PostProcess] | None:
        """How to run a job a restart cut off again (SPEC J5): only when its tool is still
        in the catalog and marked ``idempotent``; ``None`` means report it failed."""
        tool = self.catalog.current.tools.get(row.tool)
        if tool is None or not tool.idempotent or tool.func is None or tool.mode is Mode.CLIENT:
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
        try:
            if tool.promote_after is None:
                # Awaited in this task: a handler that answers at once costs no extra
                # loop turn, so tool_start and result share one commit (SPEC D1).
                value = await self._timed(tool.func, call.params, ctx, limit)
            else:
                work = asyncio.ensure_future(self._timed(tool.func, call.params, ctx, limit))
                try:
                    done, _ = await asyncio.wait({work}, timeout=tool.promote_after)
                except asyncio.CancelledError:
                    work.cancel()
                    raise
                if not done:
                    self._promote(call, tool, ctx, info, work)
                    return
                value = work.result()
        except TimeoutError:
            self._error(
                call,
                ErrorCode.TIMEOUT,
                f"{tool.name} did not finish within {limit} s",
                Outcome.TIMEOUT,
            )
            return
        except Exception as exc:
            logger.info("handler %s raised %s", tool.name, type(exc).__name__, exc_info=True)
            self._error(
                call, ErrorCode.HANDLER_ERROR, f"{type(exc).__name__}: {exc}", Outcome.HANDLER_ERROR
            )
            return
        result, replaced = await run_post(self.post_hooks, info, as_object(value))
        self._finish(call, Outcome.OK, m.Result, result=result, replaced=replaced)

    def _run_timeout(self, tool: ToolDef) -> float | None:
        if tool.long_running:
            return None
        limit = self.calls.default_timeout if tool.timeout is None else tool.timeout
        return limit or None

    async def _timed(
        self, func: Any, params: dict[str, Any], ctx: ToolContext, limit: float | None
    ) -> Any:
        async with asyncio.timeout(limit):
            return await run_handler(func, params, ctx, self.pool)

    def _promote(
        self, call: Call, tool: ToolDef, ctx: ToolContext, info: CallInfo, work: asyncio.Future[Any]
    ) -> None:
        """SPEC I14: the running call becomes a job; the client hears ``dispatched`` now."""
        job_id = self.jobs.submit(
            call.session, tool, call.params, ctx, self._post(info), adopt=work
        )
        call.job_id = job_id
        if isinstance(ctx.progress, ProgressRelay):
            ctx.progress.target = self.jobs.progress_sink(job_id)
        message = (
            tool.dispatch_message
            or f"{tool.name} is taking a while; I'll report back when it's done."
        )
        self._finish(
            call, Outcome.PROMOTED, m.Dispatched, job_id=job_id, message=message, promoted=True
        )

    # -- the one exit --------------------------------------------------------------------

    def _error(
        self, call: Call, code: ErrorCode, message: str, outcome: Outcome, **fields: Any
    ) -> None:
        self._finish(call, outcome, m.CallError, code=code, message=message, **fields)

    def _finish(self, call: Call, outcome: Outcome, cls: type[Any], **fields: Any) -> None:
        """Emit the call's one terminal event, record it, audit it (SPEC I11, I12)."""
        session = call.session
        if call.call_id in session.done_calls:
            return
        session.done_calls[call.call_id] = None  # before emit: a second finish is refused
        body = session.emit(cls, call_id=call.call_id, tool=call.tool_name, **fields)
        session.call_done(call.call_id, body)
        elapsed = time.perf_counter() - call.started
        self.metrics.invocation(
            outcome.value, call.tool.mode.value if call.tool else "none", elapsed
        )
        if audit.enabled():
            sensitive = call.tool.sensitive if call.tool else ()
            audit.record(
                tool=call.tool_name,
                outcome=outcome.value,
                profile=session.profile.name,
                user=session.user,
                session=session.id,
                call_id=call.call_id,
                duration_ms=round(elapsed * 1000, 3),
                params=audit.redact(call.params, sensitive, self.calls.audit_param_bytes),
                approval=call.approval,
                job_id=call.job_id,
                code=fields.get("code"),
            )
