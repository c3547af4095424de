"""What a restart finds in the store, settled before serving (SPEC D3, I12, I15, J5, J6).

:meth:`Recovery.run` is called once by :meth:`gateway.server.Gateway.start`, before the
port is bound: stored sessions come back parked (expired ones are deleted), calls a
restart cut off end ``cancelled``, or ``unavailable`` saying they did not run when
their handler had not started (SPEC J6): it still waited for a worker thread, or for
its approval (resolved ``disconnected`` first, SPEC A4, A6), the call ledger's running
rows end the same way, and the job runner settles unfinished jobs, re-running those it
may (SPEC J5), each gated again at its handler's start (SPEC A7). The jobs of mounted
MCP tools not listed yet are held and settled by :meth:`Recovery.settle_mounted` once
their servers answered (SPEC J5, M2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from catalog.model import ToolDef
from gateway import audit
from gateway.authority import Authority
from gateway.call_end import audit_fields
from gateway.catalog_state import CatalogState
from gateway.context import ToolContext
from gateway.handoff import Handoff
from gateway.job_recovery import JobRecovery
from gateway.jobs import PostProcess
from gateway.ledger import RESTARTED, UNSTARTED, Key, principal_key
from gateway.mcp.mounts import McpMounts
from gateway.outbox import Outbox
from gateway.pipeline import Pipeline
from gateway.session import Session, SessionTable, TokenBucket
from gateway.store import JobRow, LedgerRow, SessionRow, Store
from protocol import messages as m
from protocol.codec import decode_json
from protocol.errors import ErrorCode

logger = logging.getLogger("gateway.server")


class Recovery:
    """Brings a store's sessions, calls and jobs back after a restart (SPEC D3, J5).

    Args:
        store: the store opened at start.
        catalog: profiles of the adopted sessions, and their catalog views.
        sessions: the session table the stored sessions join, parked.
        bucket: a new session's invoke token bucket (SPEC E2).
        pipeline: the call ledger and the plan of a stored job.
        jobs: settles unfinished jobs (SPEC J5, J6).
        authority: gates a re-run job at its handler's start (SPEC A7).
        outbox: commits what recovery staged (SPEC D6: holds and retries if it cannot).
        mounts: the mounted MCP servers that may bring a stored job's tool (SPEC M2).
        handoff: adopts the calls a drained node handed off (SPEC N6).
        clock: Unix time in seconds.
    """

    def __init__(
        self,
        store: Store,
        catalog: CatalogState,
        sessions: SessionTable,
        bucket: Callable[[], TokenBucket],
        pipeline: Pipeline,
        jobs: JobRecovery,
        authority: Authority,
        outbox: Outbox,
        mounts: McpMounts,
        handoff: Handoff,
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._catalog = catalog
        self._sessions = sessions
        self._bucket = bucket
        self._pipeline = pipeline
        self._jobs = jobs
        self._authority = authority
        self._outbox = outbox
        self._mounts = mounts
        self._handoff = handoff
        self._clock = clock

    def run(self) -> list[JobRow]:
        """Bring stored sessions back after a restart, parked (SPEC D3, J5).

        Returns:
            The unfinished jobs of mounted MCP tools not listed yet, held until their
            servers answered (:meth:`settle_mounted`).
        """
        now = self._clock()
        sessions = self._sessions
        gone: dict[str, SessionRow] = {}
        for row in self._store.all_sessions():
            if row.expires_at is not None and row.expires_at < now:
                self._store.delete_session(row.session_id)
                gone[row.session_id] = row
                continue
            profile = self._catalog.current.profile(row.profile)
            session = sessions.adopt(row, profile, self._bucket(), now)
            session.catalog_names = self._catalog.view(session)[2]
        running = self._store.running_calls()
        settled = self._settle_calls(running, sessions.sessions, gone)
        # SPEC I15: a call id cut off here never runs again, from any session.
        ended = self._pipeline.ledger.recover(keep=settled.adopted, unstarted=settled.unstarted)
        self._audit_orphans(ended, settled)
        count, held = self._jobs.settle(
            sessions.sessions,
            lambda row: self._rerun_plan(row, sessions.get(row.session_id)),
            lambda row: bool(self._mounts.owners(row.tool)),
        )
        self._outbox.flush()  # SPEC D6: a store that cannot commit yet holds and retries
        if sessions.sessions or count:
            logger.info("recovered %d sessions, %d interrupted jobs", len(sessions.sessions), count)
        return held

    def settle_node(
        self,
        calls: list[tuple[str, str, bytes | None]],
        ledger: list[LedgerRow],
        jobs: list[JobRow],
        elsewhere: dict[str, Session],
    ) -> int:
        """A dead node's work, settled by the node that claimed it (SPEC N4) with the
        same steps as a restart: its running ``calls`` end ``cancelled`` (``unavailable``
        when their handler had not started: a pending approval is resolved
        ``disconnected`` first, SPEC J6), its ``ledger`` rows end, its ``jobs``
        re-run when they may (SPEC J5) or end ``failed``. Call after the dead node's
        sessions were taken over; ``elsewhere`` holds the other sessions its work names,
        held by live nodes (:meth:`SessionTable.detached`: their events are forwarded).
        Returns the jobs found."""
        sessions = {**elsewhere, **self._sessions.sessions}
        settled = self._settle_calls(calls, sessions)
        ended = self._pipeline.ledger.recover(
            ledger, keep=settled.adopted, unstarted=settled.unstarted
        )
        self._audit_orphans(ended, settled)
        count, _ = self._jobs.settle(
            sessions, lambda row: self._rerun_plan(row, sessions.get(row.session_id)), rows=jobs
        )
        self._outbox.flush()  # SPEC D6: a store that cannot commit yet holds and retries
        return count

    async def settle_mounted(self, held: list[JobRow]) -> None:
        """SPEC J5, M2: the jobs of mounted tools a restart cut off are settled once the
        servers that may bring their tools made their first connection attempt (at most
        their ``connect_timeout``): re-run when the tool is there and idempotent (or the
        job never started), else ``failed`` as :meth:`JobRecovery.settle` says."""
        mounts = self._mounts
        await mounts.settled(name for row in held for name in mounts.owners(row.tool))
        table = self._sessions
        self._jobs.settle(
            table.sessions, lambda row: self._rerun_plan(row, table.get(row.session_id)), rows=held
        )

    def _settle_calls(
        self,
        calls: list[tuple[str, str, bytes | None]],
        sessions: Mapping[str, Session],
        gone: Mapping[str, SessionRow] | None = None,
    ) -> Settled:
        """Calls a restart or a dead node cut off end ``cancelled`` (SPEC I12, A4), or
        ``unavailable`` :data:`~gateway.ledger.UNSTARTED` when their handler had not
        started (SPEC J6: their ledger row says they waited for a worker thread, or their
        note names the approval they still waited for), unless their ledger row says
        they ended (N3: their end waits in an inbox); those a drained node handed off
        while pending approval are adopted here and run on (SPEC N6,
        :mod:`gateway.handoff`). ``gone``: the stored rows of the sessions that expired
        before the restart, by id: a call of theirs has no session to be told, but its
        ledger row still ends, :data:`~gateway.ledger.UNSTARTED` when it waited for its
        approval (SPEC J6, I15: a re-send from the principal's next session must not
        hear it ran), and its audit record names the session (SPEC I11).

        Returns:
            What was settled, by ledger key (:class:`Settled`).
        """
        settled = Settled()
        adopted, unstarted = settled.adopted, settled.unstarted
        for session_id, call_id, note in calls:
            note_dict = decode_json(note) if note else {}
            session = sessions.get(session_id)
            if session is not None and self._pipeline.ledger.ended(session, call_id):
                # SPEC I12, N3: it ended on a node that no longer held its session (its
                # write of this row was fenced); the terminal event waits in the new
                # owner's inbox, or was delivered. Ending it again would end it twice.
                continue
            if session is None:
                expired = (gone or {}).get(session_id)
                if expired is not None:
                    key = (expired.tenant or "", expired.user, call_id)
                    approval_id = note_dict.get("approval_id")
                    settled.orphans[key] = (session_id, expired.profile, approval_id)
                    if approval_id:
                        unstarted.add(key)
                continue
            key = principal_key(session, call_id)
            settled.told.add(key)
            if self._handoff.adopt(session, call_id, note_dict):
                adopted.add(key)
            elif self._interrupt_call(call_id, note_dict, session):
                unstarted.add(key)
        return settled

    def _audit_orphans(self, ended: list[tuple[LedgerRow, ErrorCode]], settled: Settled) -> None:
        """SPEC I11: an audit record for each call the ledger ended (``ended``: the row
        and its code) with no session to tell: its session expired before the restart,
        or had ended (``bye``) with the call still running. ``session`` and ``profile``
        name the expired session when its call row was still there
        (:attr:`Settled.orphans`), else ``null``."""
        now = self._clock()
        for row, code in ended:
            key = (row.tenant, row.user, row.call_id)
            if key in settled.told:
                continue  # its session was told, and its record written (_interrupt_call)
            session_id, profile, approval_id = settled.orphans.get(key, (None, None, None))
            who = (profile, row.user, session_id)
            _audit_cut_off(who, row.call_id, row.tool, code, approval_id, now, self._outbox)

    def _interrupt_call(self, call_id: str, note: dict[str, str], session: Session) -> bool:
        """A call a restart cut off ends ``cancelled`` (SPEC I12: one terminal reply).
        One whose handler had not started ends ``unavailable``
        :data:`~gateway.ledger.UNSTARTED` (SPEC J6, I15): its ledger row says it waited
        for a worker thread, or it still waited for its approval, which is resolved
        ``disconnected`` first (SPEC A4, A6: a handler starts only after its approval's
        settlement is durable). Returns whether the approval made it unstarted (the
        ledger row must be ended the same way)."""
        tool = note.get("tool", "")
        approval_id = note.get("approval_id")
        if approval_id:
            session.emit(
                m.ToolResolved(
                    call_id=call_id,
                    approval_id=approval_id,
                    tool=tool,
                    resolution=m.Resolution.DENIED,
                    reason=m.ResolutionReason.DISCONNECTED,
                )
            )
        if approval_id or self._pipeline.ledger.never_started(session, call_id):
            code, message = ErrorCode.UNAVAILABLE, UNSTARTED
        else:
            code, message = ErrorCode.CANCELLED, RESTARTED
        body = session.emit(m.CallError(call_id=call_id, tool=tool, code=code, message=message))
        session.call_done(call_id, body)
        who = (session.profile.name, session.user, session.id)
        _audit_cut_off(who, call_id, tool, code, approval_id, self._clock(), self._outbox)
        return bool(approval_id)

    def _rerun_plan(
        self, row: JobRow, session: Session | None
    ) -> tuple[ToolDef, ToolContext, PostProcess] | None:
        """The pipeline's plan for a stored job (SPEC J5), gated like any other handler
        start (SPEC A7): its ``session``'s profile and context are re-checked when the
        job gets its slot after the restart."""
        plan = self._pipeline.execution.rerun_plan(row)
        if plan is None or session is None:
            return plan
        tool, ctx, post = plan
        return tool, replace(ctx, recheck=self._authority.gate(session, tool.name)), post


@dataclass(slots=True)
class Settled:
    """The calls :meth:`Recovery._settle_calls` settled, by ledger key (SPEC I15).

    ``adopted``: handed off by a drained node, running on here (SPEC N6).
    ``unstarted``: ended :data:`~gateway.ledger.UNSTARTED` because they waited for
    approval (their ledger rows say nothing of it: :meth:`CallLedger.recover
    <gateway.ledger.CallLedger.recover>` ends them the same way). ``told``: those whose
    session was told (and their audit record written). ``orphans``: calls of sessions
    that expired before the restart, each ``(session_id, profile, approval_id or
    None)``.
    """

    adopted: set[Key] = field(default_factory=set)
    unstarted: set[Key] = field(default_factory=set)
    told: set[Key] = field(default_factory=set)
    orphans: dict[Key, tuple[str, str, str | None]] = field(default_factory=dict)


def _audit_cut_off(
    who: tuple[str | None, str, str | None],
    call_id: str,
    tool: str,
    code: ErrorCode,
    approval_id: str | None,
    now: float,
    outbox: Outbox,
) -> None:
    """SPEC I11: the audit record of a call a restart (or a dead node) cut off. The
    process that ran it died before it could write one; its duration and parameters
    died with it (``null``). A pending approval it waited on is recorded as resolved
    ``denied`` ``disconnected`` by the server at ``now`` (Unix seconds), as the session
    was told (SPEC A4, A6). Written by ``outbox`` once the call's end is durable (a
    start killed before that leaves it to the next one)."""
    if not audit.enabled():
        return
    approval: dict[str, Any] | None = None
    if approval_id:
        approval = {
            "approval_id": approval_id,
            "resolution": m.Resolution.DENIED.value,
            "reason": m.ResolutionReason.DISCONNECTED.value,
            "always": False,
            "at": now,
            "by": "server",
        }
    # The outcome of a call ended with an error is its code (protocol.outcomes).
    fields = audit_fields(
        who,
        tool,
        call_id,
        code.value,
        code.value,
        duration_ms=None,
        params=None,
        approval=approval,
        job_id=None,
    )
    outbox.audit(fields)
