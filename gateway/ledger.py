"""The call ledger: a ``call_id`` is an idempotency key of its principal (SPEC I15).

A session's own record of its calls (SPEC I12) dies with the session. The ledger keeps
each call id of a principal (tenant + user) for ``calls.call_id_window`` seconds,
durably in the store, whatever happens to the session that first used it: a resume
that fails, an expired session, a restart. An ``invoke`` whose call id the principal
used before, from any of its sessions, never runs the tool again:

    running here     -> the session is *attached*: the call's one terminal event is
                        delivered to it as well, under a seq of its own
    running on another node
                     -> attached too: its outcome is read from the shared store once
                        recorded (:class:`Elsewhere`, SPEC N3)
    finished         -> the recorded terminal event is delivered again
    cut off          -> a call a restart cut off answers the restart's ``cancelled``
                        (recovery records it at start); one that was still waiting
                        for a worker thread or for its approval answers
                        ``unavailable``, saying it did not run (SPEC J6,
                        :meth:`CallLedger.waiting`)
    another tool or
    other parameters -> refused ``call_id_conflict``; the record stays as it was

:class:`CallLedger` holds the calls running in this process (:class:`LiveCall`) and
reads and stages :class:`~gateway.store.LedgerRow` s; the pipeline asks it before it
admits an ``invoke`` and tells it each terminal event.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from gateway.records import record
from gateway.session import Session
from gateway.store import LedgerRow, Store, StoreUnavailable
from protocol import messages as m
from protocol.codec import SERVER_ADAPTER, canonical_json, decode_json, encode
from protocol.errors import ErrorCode

logger = logging.getLogger("gateway.ledger")

RESTARTED: Final = "the server restarted while this call ran"
"""The message of the ``cancelled`` terminal of a call a restart cut off (SPEC I12, I15)."""

UNSTARTED: Final = "the server restarted before this call started; it did not run"
"""The message of the ``unavailable`` terminal of a call a restart cut off before its
handler started: its plain handler still waited for a worker thread
(:meth:`CallLedger.waiting`), or the call still waited for its approval (SPEC J6: never
reported as cut off while it ran)."""

Key = tuple[str, str, str]
"""``(tenant or "", user, call_id)``."""


class Verdict(Enum):
    """What to do with an ``invoke`` (SPEC I12, I15)."""

    NEW = "new"
    """The principal never used this call id (or it left the window): run the call."""
    ATTACHED = "attached"
    """Running in another session: its terminal event will be delivered here too."""
    RECORDED = "recorded"
    """Finished: deliver :attr:`Check.outcome`."""
    CONFLICT = "conflict"
    """Used before for another tool or other parameters: refuse ``call_id_conflict``."""
    DUPLICATE = "duplicate"
    """This session already waits for this call: refuse ``duplicate_call`` (SPEC I12)."""
    ELSEWHERE = "elsewhere"
    """Running in another process sharing the store (a node, SPEC N3): the session
    waits for its recorded outcome (:class:`Elsewhere`)."""


@record
class Check:
    """The ledger's answer about one ``invoke``; ``outcome`` is set for ``RECORDED``,
    ``params_size`` for ``NEW``: the bytes of the params' JSON, as the server encodes them
    (the canonical JSON the hash is made of has the same length), so the E2 check need
    not encode them again (SPEC E2)."""

    verdict: Verdict
    params_hash: str
    outcome: bytes | None = None
    params_size: int | None = None


@dataclass(slots=True, eq=False)
class LiveCall:
    """A call running in this process, by principal key."""

    tool: str
    params_hash: str
    created_at: float
    waiters: dict[str, Session] = field(default_factory=dict)
    """Other sessions of the principal that re-sent the call, by session id."""


def params_hash(params: Mapping[str, Any]) -> str:
    """SHA-256 hex of the parameters' canonical JSON (sorted keys): equal parameters,
    in any key order, give the same hash (SPEC I15)."""
    return hashlib.sha256(canonical_json(params)).hexdigest()


def principal_key(session: Session, call_id: str) -> Key:
    return (session.tenant or "", session.user, call_id)


class CallLedger:
    """Call ids of every principal, across sessions and restarts (SPEC I15).

    Args:
        store: where :class:`~gateway.store.LedgerRow` s live.
        window: seconds a call id stays a key after its call was first admitted.
        clock: Unix time in seconds.
    """

    def __init__(self, store: Store, window: float, clock: Callable[[], float]) -> None:
        self._store = store
        self.window = window
        self._clock = clock
        self._live: dict[Key, LiveCall] = {}
        self.elsewhere = Elsewhere(store)
        """Sessions waiting for calls that run in another process (SPEC I15, N3)."""

    def check(self, session: Session, call_id: str, tool: str, params: dict[str, Any]) -> Check:
        """Decide what an ``invoke`` from ``session`` is (see :class:`Verdict`).

        An ``ATTACHED`` answer has already registered ``session`` as a waiter. Call only
        for a call id the session itself is not running and has no record of (those
        are SPEC I12's: ``duplicate_call`` and the session's recorded event).
        """
        canonical = canonical_json(params)
        digest = hashlib.sha256(canonical).hexdigest()
        key = principal_key(session, call_id)
        live = self._live.get(key)
        if live is not None:
            if (live.tool, live.params_hash) != (tool, digest):
                return Check(Verdict.CONFLICT, digest)
            if session.id in live.waiters:
                return Check(Verdict.DUPLICATE, digest)
            live.waiters[session.id] = session
            return Check(Verdict.ATTACHED, digest)
        row = self._store.ledger(*key)
        if row is None or row.created_at < self._clock() - self.window:
            return Check(Verdict.NEW, digest, params_size=len(canonical))
        if (row.tool, row.params_hash) != (tool, digest):
            return Check(Verdict.CONFLICT, digest)
        if row.state != "done" or row.outcome is None:
            # Running, but not in this process: recovery settled every call this
            # process's store had running at start, so another writer of the store runs
            # it. It must not run here too; its outcome is awaited (Elsewhere).
            return Check(Verdict.ELSEWHERE, digest)
        return Check(Verdict.RECORDED, digest, row.outcome)

    def conflicts(
        self, session: Session, call_id: str, tool: str, params: dict[str, Any]
    ) -> bool | None:
        """For a re-send the session itself has a record of (SPEC I12): whether the
        principal's record of ``call_id`` names another tool or other parameters.
        ``None`` when the key has left the window (purged, or older than
        :attr:`window`): the id is new again (SPEC I15), and the session's record of it
        with it."""
        row = self._store.ledger(*principal_key(session, call_id))
        if row is None or row.created_at < self._clock() - self.window:
            return None
        return (row.tool, row.params_hash) != (tool, params_hash(params))

    def open(
        self, session: Session, call_id: str, tool: str, digest: str, *, journal: bool = False
    ) -> None:
        """Record a call admitted to run: ``running`` in the store and live here.

        With ``journal`` (a call just admitted, its session's call row staged), the
        rows go to the store's intent journal at once (:meth:`Store.keep_intent
        <gateway.store.Store.keep_intent>`), in the loop turn that staged them, so no
        commit writes a ``running`` row that the call's end rewrites (issue 13). Not
        for a session that gets ungated ``tool_start``: that event must be in its log
        before the handler starts (SPEC A6), and only the commit keeps it."""
        now = self._clock()
        key = principal_key(session, call_id)
        self._live[key] = LiveCall(tool, digest, now)
        self._store.stage_ledger(LedgerRow(*key, tool, digest, "running", None, now))
        if journal and not session.ungated_tool_start:
            self._store.keep_intent(session.id, call_id, key)

    def durable_now(self, session: Session, call_id: str, decided: bool) -> bool:
        """SPEC I15, D6: whether the call's handler may start with no wait: ``True`` when
        nothing but its ``running`` rows must be durable (no approval was decided, the
        session does not get ungated ``tool_start``) and the store says they already
        are (:meth:`Store.running_durable <gateway.store.Store.running_durable>`:
        journaled at admission, or committed since). ``False``: :meth:`durable` first.
        Not a coroutine: the common case costs none on every call.

        Args:
            session: the call's session.
            call_id: the call.
            decided: the call waited for an approval; its outcome, staged since, must be
                committed before the handler (SPEC A3).
        """
        # A session that gets ungated tool_start must find it in its log after a crash
        # (SPEC A6: every started tool emits one): only the commit keeps it. The store
        # itself says no while its last commit attempt (any, a purge's too) failed (D6).
        return not (session.ungated_tool_start or decided) and self._store.running_durable(
            principal_key(session, call_id)
        )

    async def durable(self, session: Session, decided: bool) -> bool:
        """SPEC I15, D6: for a call :meth:`durable_now` said must wait, make its
        ``running`` rows (and a decided approval's outcome) durable before its handler
        starts; ``False`` when they could not be (the handler must not start).

        Args:
            session: the call's session.
            decided: as for :meth:`durable_now`.

        The rows (PostgreSQL, no journal or a failed append, a decided approval, a
        session that gets its ``tool_start``, commits failing) ride the tick's group
        commit (:meth:`Outbox.durable <gateway.outbox.Outbox.durable>`). A call whose
        approval was just decided, or
        whose session gets its ``tool_start``, commits at once when first in its tick:
        the handler runs in this turn, so its ``result`` leaves in the same write as
        ``tool_start`` (or as ``confirm.result`` and ``tool.resolved``), one wake-up of
        the client instead of two (issue 13, P7). A lone call commits as often as it
        would at the flush; a turn with many pays at most one commit more.
        Otherwise the call joins the group commit (one loop turn, no extra write)."""
        return await session.outbox.durable(session.ungated_tool_start or decided)

    def waiting(self, session: Session, call_id: str) -> bool:
        """SPEC J6: the call's plain handler has to wait for a worker thread. Its
        ``running`` row is staged again, holding as its ``outcome`` the terminal event a
        restart records for it: ``unavailable`` :data:`UNSTARTED` instead of the
        ``cancelled`` :data:`RESTARTED` of a call whose handler started
        (:meth:`recover`). Durable with the next flush, as every staged row; the call's
        start must then be staged (:meth:`started`) and made durable before its handler
        runs (:class:`gateway.execution.CallStart`). ``False`` when the call does not
        run here (nothing staged).

        Only a call that waits pays this: a call that gets its thread at once, or runs
        on the loop, stages nothing more than before (issue 13). A ``running`` row keeps
        ``state`` ``running`` (a node of an earlier release reads it as before, SPEC
        N6), and each one staged counts as a key more in the SQLite store's filter
        (:class:`gateway.store_keys.LedgerKeys`: it fills a little sooner, never a
        false negative)."""
        key = principal_key(session, call_id)
        live = self._live.get(key)
        if live is None:
            return False
        event = m.CallError(
            seq=1, call_id=call_id, tool=live.tool, code=ErrorCode.UNAVAILABLE, message=UNSTARTED
        )
        outcome = encode(event)
        row = LedgerRow(*key, live.tool, live.params_hash, "running", outcome, live.created_at)
        self._store.stage_ledger(row)
        return True

    def started(self, session: Session, call_id: str) -> None:
        """SPEC J6: a call :meth:`waiting` recorded got its thread and its handler is
        about to start: its ``running`` row is staged again without an outcome, so a
        restart from now on reports it cut off while it ran (:data:`RESTARTED`). The
        caller makes it durable before the handler starts."""
        key = principal_key(session, call_id)
        live = self._live.get(key)
        if live is not None:
            row = LedgerRow(*key, live.tool, live.params_hash, "running", None, live.created_at)
            self._store.stage_ledger(row)

    def never_started(self, session: Session, call_id: str) -> bool:
        """Whether the store records the call as not started (SPEC J6): a ``running`` row
        :meth:`waiting` staged, whose start (:meth:`started`) never became durable."""
        row = self._store.ledger(*principal_key(session, call_id))
        return row is not None and _unstarted(row)

    def finish(self, session: Session, call_id: str, body: bytes) -> list[Session]:
        """Record the call's terminal event; returns the sessions to deliver it to
        (those that attached, still open)."""
        key = principal_key(session, call_id)
        live = self._live.pop(key, None)
        if live is None:
            return []
        row = LedgerRow(*key, live.tool, live.params_hash, "done", body, live.created_at)
        self._store.stage_ledger(row)
        return [s for s in live.waiters.values() if not s.ended]

    def ended(self, session: Session, call_id: str) -> bool:
        """Whether the store records the call's terminal event (state ``done``)."""
        row = self._store.ledger(*principal_key(session, call_id))
        return row is not None and row.state == "done"

    def forget(self, session: Session) -> None:
        """``session`` ended: it waits for nothing any more."""
        for live in self._live.values():
            live.waiters.pop(session.id, None)
        self.elsewhere.forget(session)

    def recover(
        self,
        rows: list[LedgerRow] | None = None,
        keep: Collection[Key] = frozenset(),
        unstarted: Collection[Key] = frozenset(),
    ) -> list[tuple[LedgerRow, ErrorCode]]:
        """At start: every call still ``running`` in the store was cut off by a crash or
        restart; it ends ``cancelled`` (SPEC I12, I15) and never runs again, or, when its
        handler had not started, ``unavailable`` :data:`UNSTARTED` (SPEC J6): its row
        says so (:meth:`waiting`), or its key is in ``unstarted`` (it waited for its
        approval, :meth:`gateway.recovery.Recovery._settle_calls`). Returns each row
        ended, as it was, with the code it ended with (``cancelled`` or
        ``unavailable``). ``rows``: only these (a dead node's, SPEC N4); default: every
        running row. ``keep``: keys of calls adopted here, which run on (SPEC N6)."""
        rows = self._store.running_ledger() if rows is None else rows
        rows = [r for r in rows if (r.tenant, r.user, r.call_id) not in keep]
        ended = [
            (row, self._interrupt(row, (row.tenant, row.user, row.call_id) in unstarted))
            for row in rows
        ]
        if rows:
            logger.info(
                "%d call ids cut off by the restart recorded as ended (cancelled, or "
                "unavailable for those that had not started)",
                len(rows),
            )
        return ended

    def purge(self) -> None:
        """Delete the rows that left the window (run by the server's purge loop)."""
        self._store.purge_ledger(self._clock() - self.window)

    def _interrupt(self, row: LedgerRow, unstarted: bool = False) -> ErrorCode:
        # The seq is a placeholder: a recorded event reaches a session under its own.
        # SPEC J6: a call that never started carries the outcome recorded for it
        # (:meth:`waiting`: unavailable, it did not run).
        outcome = row.outcome if _unstarted(row) else None
        code = ErrorCode.UNAVAILABLE
        if outcome is None:
            code, message = ErrorCode.CANCELLED, RESTARTED
            if unstarted:
                code, message = ErrorCode.UNAVAILABLE, UNSTARTED
            event = m.CallError(
                seq=1, call_id=row.call_id, tool=row.tool, code=code, message=message
            )
            outcome = encode(event)
        done = LedgerRow(
            row.tenant,
            row.user,
            row.call_id,
            row.tool,
            row.params_hash,
            "done",
            outcome,
            row.created_at,
        )
        self._store.stage_ledger(done)
        return code


def _unstarted(row: LedgerRow) -> bool:
    """Whether ``row`` records a call whose handler had not started (SPEC J6): only
    :meth:`CallLedger.waiting` stages a ``running`` row with an outcome."""
    return row.state == "running" and row.outcome is not None


def deliver(session: Session, call_id: str, outcome: bytes) -> None:
    """Give ``session`` a terminal event recorded in another session (SPEC I15): it is
    emitted anew under the session's next seq, logged and recorded for the session's
    own re-sends (SPEC I12). A session that has a terminal event for ``call_id``
    already (it re-sent the call once the tool left its catalog, SPEC C3) gets no
    second one (SPEC I12)."""
    if call_id in session.done_calls:
        return
    message = SERVER_ADAPTER.validate_python(decode_json(outcome))
    assert isinstance(message, (m.Result, m.Dispatched, m.CallError)), "a terminal reply"
    session.done_calls[call_id] = None
    body = session.emit(message)  # re-numbered: seq is the receiving session's next
    session.call_done(call_id, body)


class Elsewhere:
    """Sessions waiting for a call of their principal that runs in another process
    sharing the store (another node, SPEC I15, N3): a re-send from a session on this
    node is attached to it as a re-send on the call's own node is. The ledger row is
    read until the call's terminal event is recorded there (every 20 ms at first, then
    less often, at most every :data:`POLL_MAX` s), then that event is delivered to each
    waiting session under a seq of its own (:func:`deliver`). One task polls for all,
    and only while some session waits.

    Args:
        store: the shared store, where the call's node records its outcome.
    """

    POLL_FIRST = 0.02
    POLL_MAX = 0.5
    """Seconds between two reads of the awaited ledger rows: first, and at most."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._waiters: dict[Key, dict[str, Session]] = {}
        self._task: asyncio.Task[None] | None = None
        self._delay = self.POLL_FIRST

    def attach(self, session: Session, call_id: str) -> bool:
        """Wait for ``call_id`` of ``session``'s principal; ``False`` when the session
        waits for it already (a second re-send: ``duplicate_call``, SPEC I12)."""
        waiters = self._waiters.setdefault(principal_key(session, call_id), {})
        if session.id in waiters:
            return False
        waiters[session.id] = session
        self._delay = self.POLL_FIRST
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._poll(), name="ledger: calls elsewhere")
        return True

    def forget(self, session: Session) -> None:
        """``session`` ended: it waits for nothing any more."""
        for key in list(self._waiters):
            self._waiters[key].pop(session.id, None)
            if not self._waiters[key]:
                del self._waiters[key]
        if not self._waiters and self._task is not None:
            self._task.cancel()
            self._task = None

    async def _poll(self) -> None:
        while self._waiters:
            await asyncio.sleep(self._delay)
            self._delay = min(self._delay * 2, self.POLL_MAX)
            try:
                self._deliver_ended()
            except StoreUnavailable as exc:  # read again next round (SPEC D6, N7)
                logger.warning("awaited calls elsewhere: %s", exc)
        self._task = None

    def _deliver_ended(self) -> None:
        for key in list(self._waiters):
            row = self._store.ledger(*key)
            if row is not None and (row.state != "done" or row.outcome is None):
                continue
            waiters = self._waiters.pop(key)
            if row is None or row.outcome is None:
                # Purged meanwhile (past calls.call_id_window): nothing left to deliver.
                logger.warning("call %s ended with no outcome left to deliver", key[2])
                continue
            for session in waiters.values():
                if not session.ended:
                    deliver(session, key[2], row.outcome)
