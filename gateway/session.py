"""Sessions: identity, context, the event log's sequence, and where to send (SPEC D1-D4).

A :class:`Session` outlives its sockets. While a socket holds it, ``link`` is that
socket's writer; when the socket goes, the session is *parked* for the resume window
(SPEC D2) and its events keep landing in the log. :class:`SessionTable` owns every
session of the process, their resume deadlines and per-user counts (SPEC E2).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pydantic import BaseModel

from catalog.model import Profile
from gateway.auth import hash_token
from gateway.outbox import Link, Outbox
from gateway.store import SessionRow, Store
from protocol.codec import encode, encode_event
from protocol.messages import DurableEvent, ToolStarts

logger = logging.getLogger("gateway.session")

INTERNAL_PREFIX = "m_"
"""Session id prefix of an internal session (the ``/mcp`` endpoint's, SPEC M4); a
socket's session ids start ``s_``. The prefix survives a restart in the stored row."""


BYE_REFUSED = "the store cannot record the end of the session now; it stays open"
"""SPEC D6: the ``unavailable`` answer of a ``bye`` the store cannot make durable."""


@dataclass(slots=True)
class TokenBucket:
    """Invoke rate limit (SPEC E2): ``rate`` tokens per second, at most ``burst`` saved."""

    rate: float
    burst: float
    tokens: float
    stamp: float

    def take(self, now: float) -> bool:
        """Spend one token at time ``now`` (seconds); ``False`` when none is left."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass(slots=True, eq=False)
class Session:
    """One session's state in memory. Create through :class:`SessionTable`."""

    id: str
    token_hash: str
    user: str
    tenant: str | None
    profile: Profile
    context: dict[str, str]
    options: dict[str, Any]
    grants: set[str]
    last_seq: int
    acked_seq: int
    floor_seq: int
    created_at: float
    bucket: TokenBucket
    store: Store
    outbox: Outbox
    max_unacked: int
    origin: str | None = None
    link: Link | None = None
    expires_at: float | None = None
    catalog_version: str | None = None
    catalog_names: frozenset[str] = frozenset()
    inflight: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    promoted: int = 0
    """Calls promoted to jobs (SPEC I14) whose handler has not returned: they still
    count in flight (``limits.max_inflight_calls``, SPEC E2)."""
    done_calls: dict[str, None] = field(default_factory=dict)
    """Finished call ids, oldest first, for idempotent re-sends (SPEC I12); bounded by
    ``max_call_records``."""
    max_call_records: int = 10_000
    pending_approvals: set[str] = field(default_factory=set)
    ended: bool = False
    credential_ref: str | None = None
    """The stored reference of its last credential (SPEC S6; :mod:`gateway.credref`)."""
    _expiry: asyncio.TimerHandle | None = None

    @property
    def confirm_tool_calls(self) -> bool:
        return bool(self.options.get("confirm_tool_calls", False))

    @property
    def ungated_tool_start(self) -> bool:
        """Whether a call that needs no approval sends ``tool_start`` (SPEC A6: hello
        option ``tool_start``, ``all`` unless the client chose ``gated``)."""
        return self.options.get("tool_start") != ToolStarts.GATED

    @property
    def internal(self) -> bool:
        """An internal session (``/mcp``, SPEC M4): no socket, not counted against
        ``limits.max_sessions_per_user`` (SPEC E2)."""
        return self.id.startswith(INTERNAL_PREFIX)

    def emit(self, event: DurableEvent) -> bytes:
        """Append a durable event to the log and queue it for sending (SPEC D1).

        Args:
            event: a :data:`protocol.messages.DurableEvent`, built without ``seq``: the
                session's next ``seq`` (gap-free) is assigned here, in the encoded bytes
                only (``event`` itself is frozen and keeps its default).

        Returns:
            The encoded event; its ``seq`` is now :attr:`last_seq`. An ended session
            logs and sends nothing.

        Raises:
            TypeError: a value the codec cannot encode (SPEC I16); nothing is staged.
        """
        return self.emit_encoded(partial(encode_event, event))

    def emit_encoded(self, encode_at: Callable[[int], bytes]) -> bytes:
        """:meth:`emit` of an event given as ``encode_at(seq)``, its bytes under a ``seq``
        (e.g. :func:`protocol.codec.encode_result` of a value encoded once); same log,
        same queue, same errors (SPEC D1)."""
        seq = self.last_seq + 1
        data = encode_at(seq)
        if self.ended:
            return data
        self.last_seq = seq
        self.store.stage_event(self.id, seq, data)
        if seq - self.floor_seq > self.max_unacked:
            # SPEC D2 cap: the oldest unacknowledged event is dropped from the log.
            self.floor_seq = seq - self.max_unacked
            self.store.stage_seq(self.id, seq, self.acked_seq, self.floor_seq)
        link = self.link
        if (
            link is not None
            and seq - self.acked_seq > max(1, self.max_unacked * 9 // 10)
            and link.backlogged
        ):
            # SPEC D5, D2: the reader is not keeping up. Close it while its resume can
            # still replay everything, not after the cap dropped what it never read.
            link.slow_consumer("unacknowledged events near the cap")
        self.outbox.put(self, data, True)
        return data

    def emit_raw(self, data: bytes) -> None:
        """Queue already-encoded bytes (a recorded event re-sent for I12) or a reply."""
        self.outbox.put(self, data)

    def reply(self, message: BaseModel) -> None:
        """Queue a non-durable reply; it is not logged and not replayed."""
        self.outbox.put(self, encode(message))

    def call_done(self, call_id: str, body: bytes) -> None:
        """Record a finished call and its terminal event for re-sends (SPEC I12).

        The record is kept for the session's last ``max_call_records`` calls: an older
        ``call_id`` re-sent is a new call. The window keeps a long-lived session's memory
        and store bounded.
        """
        self.done_calls[call_id] = None
        if self.ended:
            return
        self.store.stage_call(self.id, call_id, "done", body)
        while len(self.done_calls) > self.max_call_records:
            oldest = next(iter(self.done_calls))
            del self.done_calls[oldest]
            self.store.stage_forget_call(self.id, oldest)

    def ack(self, seq: int) -> None:
        """Cumulative acknowledgement (SPEC D2): events up to ``seq`` may be trimmed."""
        seq = min(seq, self.last_seq)
        if seq <= self.acked_seq:
            return
        self.acked_seq = seq
        self.floor_seq = max(self.floor_seq, seq)
        self.store.stage_seq(self.id, self.last_seq, self.acked_seq, self.floor_seq)

    def row(self) -> SessionRow:
        """The durable form of this session (SPEC D3)."""
        return SessionRow(
            session_id=self.id,
            token_hash=self.token_hash,
            user=self.user,
            tenant=self.tenant,
            profile=self.profile.name,
            context=dict(self.context),
            options=dict(self.options),
            grants=sorted(self.grants),
            last_seq=self.last_seq,
            acked_seq=self.acked_seq,
            floor_seq=self.floor_seq,
            created_at=self.created_at,
            expires_at=self.expires_at,
            catalog_version=self.catalog_version,
            credential_ref=self.credential_ref,
        )

    def save(self) -> None:
        """Stage the whole session row (context, grants, options changed)."""
        self.store.stage_session(self.row())

    def token_matches(self, resume_token: str) -> bool:
        return hmac.compare_digest(self.token_hash, hash_token(resume_token))


class SessionTable:
    """Every session of this process, live or parked (SPEC D2-D4, E2).

    Args:
        store: durable state.
        outbox: the shared outbound path.
        resume_window: seconds a parked session stays resumable.
        max_unacked: events kept per session before the oldest are dropped.
        on_end: called with each session that ends (calls cancelled, approvals denied).
    """

    def __init__(
        self,
        store: Store,
        outbox: Outbox,
        resume_window: float,
        max_unacked: int,
        on_end: Callable[[Session], None],
        max_call_records: int = 10_000,
    ) -> None:
        self.store = store
        self.outbox = outbox
        self.resume_window = resume_window
        self.max_unacked = max_unacked
        self.max_call_records = max_call_records
        self._on_end = on_end
        self.sessions: dict[str, Session] = {}
        self._per_user: dict[tuple[str | None, str], int] = {}
        """Live and parked sessions per (tenant, user) (SPEC E2)."""

    def owners(self) -> int:
        """How many (tenant, user) principals hold a session now (case F33)."""
        return len(self._per_user)

    def count_for(self, user: str, tenant: str | None) -> int:
        """Sessions (live or parked) the user of that tenant holds (SPEC E2); internal
        sessions (:attr:`Session.internal`) are not counted."""
        return self._per_user.get((tenant, user), 0)

    def end_expired(self, user: str, tenant: str | None, now: float) -> int:
        """End the user's parked sessions whose resume window passed by ``now`` (Unix s)
        while their timers have not fired yet (SPEC D2, E2): they are over, as a resume
        and the purge see them, and no longer count. Returns :meth:`count_for` then.
        Scans every session: call it only when the count reached its limit."""
        for session in [
            s
            for s in self.sessions.values()
            if (s.user, s.tenant) == (user, tenant)
            and s.expires_at is not None
            and s.expires_at <= now
        ]:
            self.end(session)
        return self.count_for(user, tenant)

    def new(
        self,
        user: str,
        tenant: str | None,
        profile: Profile,
        context: dict[str, str],
        options: dict[str, Any],
        bucket: TokenBucket,
        now_wall: float,
        *,
        internal: bool = False,
    ) -> tuple[Session, str]:
        """Create a session; returns it and its resume token (shown once, stored hashed).
        ``internal``: the ``/mcp`` endpoint's (SPEC M4), not counted (SPEC E2)."""
        resume_token = secrets.token_urlsafe(32)
        session = Session(
            id=(INTERNAL_PREFIX if internal else "s_") + secrets.token_urlsafe(16),
            token_hash=hash_token(resume_token),
            user=user,
            tenant=tenant,
            profile=profile,
            context=context,
            options=options,
            grants=set(),
            last_seq=0,
            acked_seq=0,
            floor_seq=0,
            created_at=now_wall,
            bucket=bucket,
            store=self.store,
            outbox=self.outbox,
            max_unacked=self.max_unacked,
            max_call_records=self.max_call_records,
        )
        self._add(session)
        session.save()
        return session, resume_token

    def adopt(
        self, row: SessionRow, profile: Profile, bucket: TokenBucket, now_wall: float
    ) -> Session:
        """Bring a stored session back into memory after a restart, parked (SPEC D3).

        Its resume window is the stored one; a session that had a socket when the
        process stopped gets a fresh window from ``now_wall`` (Unix seconds).
        """
        session = self.detached(row, profile, bucket)
        session.done_calls.update(dict.fromkeys(self.store.done_call_ids(row.session_id)))
        self._add(session)
        expires = row.expires_at if row.expires_at is not None else now_wall + self.resume_window
        session.expires_at = expires
        session.save()
        session._expiry = asyncio.get_running_loop().call_later(
            max(0.0, expires - now_wall), self.end, session
        )
        return session

    def detached(self, row: SessionRow, profile: Profile, bucket: TokenBucket) -> Session:
        """A stored session in memory but not in this table: held by another node, it
        lets this node emit the events of work it settles for that node's session; the
        store's fence forwards them to the owner (SPEC N3, N4)."""
        return Session(
            id=row.session_id,
            token_hash=row.token_hash,
            user=row.user,
            tenant=row.tenant,
            profile=profile,
            context=dict(row.context),
            options=dict(row.options),
            grants=set(row.grants),
            last_seq=row.last_seq,
            acked_seq=row.acked_seq,
            floor_seq=row.floor_seq,
            created_at=row.created_at,
            bucket=bucket,
            store=self.store,
            outbox=self.outbox,
            max_unacked=self.max_unacked,
            max_call_records=self.max_call_records,
            catalog_version=row.catalog_version,
            credential_ref=row.credential_ref,
        )

    def _add(self, session: Session) -> None:
        self.sessions[session.id] = session
        if session.internal:
            return
        owner = (session.tenant, session.user)
        self._per_user[owner] = self._per_user.get(owner, 0) + 1

    def get(self, session_id: str | None) -> Session | None:
        return self.sessions.get(session_id) if session_id else None

    def attach(self, session: Session, link: Link) -> Link | None:
        """Give ``session`` a live socket; returns the link it replaces (SPEC D4)."""
        old, session.link = session.link, link
        if session._expiry is not None:
            session._expiry.cancel()
            session._expiry = None
        if session.expires_at is not None:
            session.expires_at = None
            session.save()
        return old

    def park(
        self, session: Session, link: Link, now_wall: float, delay: float | None = None
    ) -> None:
        """Detach ``link`` (if still current) and start the resume window (SPEC D2)."""
        if session.link is not link or session.ended:
            return
        session.link = None
        wait = self.resume_window if delay is None else delay
        session.expires_at = now_wall + wait
        session.save()
        loop = asyncio.get_running_loop()
        session._expiry = loop.call_later(wait, self.end, session)

    def release(self, session: Session) -> Link | None:
        """Forget ``session`` here without ending it: another node holds it now (SPEC
        N2). Nothing is cancelled, denied or deleted; its resume timer stops. Returns
        the link it had, for the caller to close (4000)."""
        if self.sessions.get(session.id) is not session:
            return None
        del self.sessions[session.id]
        if session._expiry is not None:
            session._expiry.cancel()
            session._expiry = None
        self._uncount(session)
        link, session.link = session.link, None
        return link

    def _uncount(self, session: Session) -> None:
        owner = (session.tenant, session.user)
        if not session.internal:
            self._per_user[owner] -= 1
            if not self._per_user[owner]:
                del self._per_user[owner]

    def end(self, session: Session, journal: bool = True) -> None:
        """End a session for good: no resume; calls cancelled, approvals denied (SPEC A4).
        ``journal=False``: its deletion needs no journal entry when the commit fails
        (SPEC D6): :meth:`bye` journaled it, or its row was never durable (a ``hello``
        refused before its ``welcome``)."""
        if session.ended:
            return
        session.ended = True
        if session._expiry is not None:
            session._expiry.cancel()
        if self.sessions.get(session.id) is session:  # not released (SPEC N2)
            del self.sessions[session.id]
            self._uncount(session)
        self._on_end(session)
        self.outbox.flush()
        self.store.delete_session(session.id)
        # Committed now: a crash right after a `bye` must not bring the session back at
        # the next start (SPEC D2). While commits fail, the deletion is journaled on its
        # own (SPEC D6) and stays staged for the next commit.
        if not (self.outbox.commit() or not journal or self.store.journal_delete(session.id)):
            logger.warning("session %s ended; its deletion waits for the store", session.id)
            return
        logger.info("session %s ended", session.id)

    def bye(self, session: Session) -> bool:
        """End ``session`` for a ``bye`` (SPEC A4) when that end can be made durable now
        (SPEC D2, D6): a commit of what is staged succeeded (:meth:`end` commits the
        end), or else the store journaled the deletion (:meth:`Store.journal_delete
        <gateway.store.Store.journal_delete>`, even while commits fail; replayed after
        a crash, it deletes the session). ``False``: nothing ended (a store without a
        usable journal that cannot commit); the caller answers ``unavailable``
        :data:`BYE_REFUSED` and the session stays as it was, as the client is told."""
        committed = self.outbox.commit()
        if not (committed or self.store.journal_delete(session.id)):
            logger.warning("bye of session %s refused: the store cannot commit", session.id)
            return False
        self.end(session, journal=committed)
        return True
