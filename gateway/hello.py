"""``hello``: the session a socket opens or resumes (SPEC S1, S2, S6, D3, D4, D6, E2).

:meth:`SessionOpener.open` authenticates the hello, finds a resumable session or makes a
new one, attaches it to the socket's :class:`~gateway.outbox.Link`, sends ``welcome``,
the replay and the catalog, and binds the credential (SPEC S6). A hello it refuses
raises :class:`Refused`, naming the ``error`` code and the close code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.auth import Authenticator, AuthError, Identity, bearer
from gateway.authority import Authority, admits_named
from gateway.config import LimitsConfig
from gateway.metrics import Metrics
from gateway.nodes import Resumable
from gateway.outbox import Link, Outbox, Replay
from gateway.session import Session, SessionTable, TokenBucket
from gateway.store import Store, StoreUnavailable
from gateway.wslib import RepeatedHeader, Socket
from protocol import messages as m
from protocol.codec import encode, encode_json
from protocol.connection_state import Connection
from protocol.errors import CloseCode, ErrorCode
from protocol.version import SUBPROTOCOL_V1

if TYPE_CHECKING:
    from gateway.catalog_state import CatalogState
    from gateway.nodes import Node

logger = logging.getLogger("gateway.connection")

REPLAY_PAGE = 256
"""Events read from the store per page while replaying (SPEC D3)."""


class Refused(Exception):
    """``hello`` was refused: send ``error`` with ``code``, then close."""

    def __init__(self, code: ErrorCode, message: str, close: CloseCode) -> None:
        super().__init__(message)
        self.code, self.message, self.close = code, message, close


def context_too_large(context: dict[str, str], limits: LimitsConfig) -> bool:
    """SPEC S5/E2: a context is stored, echoed and re-sent; keep it bounded."""
    return len(encode_json(context)) > limits.max_context_bytes


def credential(hello: m.Hello, ws: Socket) -> str | None:
    """The hello's token, else the upgrade request's ``Authorization: Bearer`` value.

    Raises:
        AuthError: no token in the hello and ``Authorization`` is repeated (SPEC S2, E1:
            which of two credentials a proxy vetted is unknown; neither is taken).
    """
    if hello.token:
        return hello.token
    try:
        return bearer(ws.header("Authorization"))
    except RepeatedHeader as exc:
        raise AuthError(str(exc)) from exc


def may_resume(
    hello: m.Hello, identity: Identity, found: Resumable, store: Store, now: float
) -> bool:
    """SPEC S6, D2, D3: whether ``hello`` may resume the session ``found`` describes (its
    log in ``store``) at ``now`` (Unix s); ``False``: resumed false. Checked before a
    take-over (SPEC N2).

    Raises:
        Refused: the principal's credential no longer grants the profile.
    """
    if (found.user, found.tenant) != (identity.user, identity.tenant) or (
        hello.profile and hello.profile != found.profile
    ):
        return False
    refusal = admits_named(identity, found.user, found.tenant, found.profile)
    if refusal is not None:
        # SPEC S6, F19b: a resume is authenticated afresh; a credential of the same
        # principal that no longer grants the profile is refused like a fresh hello.
        raise Refused(refusal.code, refusal.message, CloseCode.AUTH_FAILED)
    if found.expires_at is not None and found.expires_at <= now:
        # SPEC D2: past its resume window the session is over, on the clock the purge
        # reads too: its timer may not have fired yet, or the purge may have deleted its
        # rows already. Left to end as it would.
        return False
    last = hello.last_seq or 0
    if last < found.floor_seq or last > found.last_seq:
        # SPEC D3: the history no longer reaches back (or the client claims events it
        # was never sent): resumed false. The old session is left alone, parked
        # until its own window ends; a client mistake does not cancel its work.
        return False
    if store.events_complete(found.session_id, last, found.last_seq):
        return True
    # SPEC D3, D6 (case F27): the log has a hole in what a resume would replay;
    # never deliver it as if whole.
    logger.warning(
        "session %s: events missing between %d and %d; resumed false",
        found.session_id,
        last,
        found.last_seq,
    )
    return False


class SessionOpener:
    """Opens or resumes the session of a ``hello``; one per server.

    Args:
        authenticator: checks the credential (SPEC S2).
        sessions: the session table (new, resume, attach).
        outbox: commits before a session starts (SPEC D6).
        store: the event log, read for the replay (SPEC D3).
        catalog: the catalog pushed after ``welcome`` (SPEC C1).
        authority: binds the credential to the session (SPEC S6).
        metrics: the server's metrics.
        limits: per-user session cap and context size (SPEC E2).
        welcome_limits: the limits announced in ``welcome``.
        bucket: a new session's invoke token bucket (SPEC E2).
        clock: Unix time in seconds.
    """

    def __init__(
        self,
        authenticator: Authenticator,
        sessions: SessionTable,
        outbox: Outbox,
        store: Store,
        catalog: CatalogState,
        authority: Authority,
        metrics: Metrics,
        limits: LimitsConfig,
        welcome_limits: m.Limits,
        bucket: Callable[[], TokenBucket],
        clock: Callable[[], float],
    ) -> None:
        self.authenticator = authenticator
        self.sessions = sessions
        self.outbox = outbox
        self.store = store
        self.catalog = catalog
        self.authority = authority
        self.metrics = metrics
        self.limits = limits
        self.welcome_limits = welcome_limits
        self.bucket = bucket
        self.clock = clock
        self.node: Node | None = None
        """Set on a store shared by several nodes (SPEC N2, N5): a resume takes the session
        over from whichever node held it, and sessions per user are counted in the store."""

    def open(
        self,
        hello: m.Hello,
        ws: Socket,
        link: Link,
        state: Connection,
        adopt: Callable[[Session], None],
    ) -> None:
        """Open or resume the session of ``hello`` on ``link`` (SPEC S1, S2, D3, D4).

        ``adopt`` gets the session as soon as it is known, before it is attached, so
        that the socket parks it whatever fails after. On return the session is
        attached to ``link``, ``welcome`` (and a resume's replay) and the catalog are
        queued on it, and ``state`` is open.

        Raises:
            Refused: authentication, the profile, a limit, or the store refused it.
        """
        identity = self._identity(hello, ws)
        if not self.outbox.flush():
            # SPEC D6: while the store cannot commit, no session starts or resumes here
            # (a resume's replay must read every event it announces, committed).
            raise Refused(
                ErrorCode.UNAVAILABLE,
                "the store cannot commit right now; try again later",
                CloseCode.TRY_AGAIN_LATER,
            )
        try:
            session, token = self._resumable(hello, identity)
        except StoreUnavailable as exc:
            # SPEC D6, N7: a networked store lost its connection; nothing started here.
            raise Refused(
                ErrorCode.UNAVAILABLE,
                "the store cannot be read right now; try again later",
                CloseCode.TRY_AGAIN_LATER,
            ) from exc
        resumed = session is not None
        if session is None:
            session, token = self._new_session(hello, identity)
        adopt(session)
        log = logging.LoggerAdapter(logger, {"session": session.id})
        session.origin = ws.header("Origin")
        if not self.outbox.flush():
            # SPEC D1, D6: welcome names a session the store must keep (a resume needs its
            # row); nothing is sent before that commit. A new session is ended, so its
            # staged row is deleted in the same later commit: nothing is half-created.
            if not resumed:
                self.sessions.end(session, journal=False)
            raise Refused(
                ErrorCode.UNAVAILABLE,
                "the store cannot commit right now; try again later",
                CloseCode.TRY_AGAIN_LATER,
            )
        if resumed and self.sessions.get(session.id) is not session:
            # SPEC N2, D4: a resume on another node took the session over while this one
            # was resuming it (the commit above was fenced and let it go): that one won;
            # this socket is refused and closed 4000, never welcomed to a session it
            # does not hold.
            raise Refused(
                ErrorCode.UNAVAILABLE,
                "the session was resumed on another connection meanwhile",
                CloseCode.SESSION_REPLACED,
            )
        old = self.sessions.attach(session, link)
        if old is not None:
            log.info("session taken over by a new socket (SPEC D4)")
            old.close(CloseCode.SESSION_REPLACED, "session resumed on another connection")
        state.accept_hello()
        self.metrics.connections.inc()
        link.push(encode(self._welcome(hello, session, token, resumed)))
        if resumed:
            self._replay(link, session, hello.last_seq or 0)
            self.catalog.push(session, m.CatalogReason.RELOAD)
        else:
            self.catalog.push(session, m.CatalogReason.INITIAL, force=True)
        # SPEC S6: the session now runs on this credential, for as long as it lasts.
        self.authority.bind(session, credential(hello, ws) or "", identity)
        log.info("session %s (resumed=%s, user=%s)", session.id, resumed, session.user)

    def _identity(self, hello: m.Hello, ws: Socket) -> Identity:
        try:
            return self.authenticator.authenticate(credential(hello, ws))
        except AuthError as exc:
            logger.warning("authentication failed: %s", exc)
            raise Refused(
                ErrorCode.AUTH_FAILED, "authentication failed", CloseCode.AUTH_FAILED
            ) from exc

    def _resumable(self, hello: m.Hello, identity: Identity) -> tuple[Session | None, str]:
        """SPEC D3, S6: the session ``hello`` may resume and its token, or ``None``."""
        node = self.node
        if node is not None and hello.session_id and hello.resume_token:
            # SPEC N2: wherever it was, a resume with its token takes the session here,
            # but only once every check below passed on the stored session: a refused
            # resume leaves it with its owner, its socket open (SPEC D4, S6).
            found = node.resumable(hello.session_id, hello.resume_token)
            if found is None or not may_resume(hello, identity, found, self.store, self.clock()):
                return None, ""
            session = node.take(hello.session_id)
        else:
            session = self.sessions.get(hello.session_id)
        if (
            session is None
            or not hello.resume_token
            or not session.token_matches(hello.resume_token)
        ):
            return None, ""
        if not may_resume(hello, identity, Resumable.of(session), self.store, self.clock()):
            return None, ""
        return session, hello.resume_token

    def _whole(self, session_id: str, last: int, upto: int) -> bool:
        """SPEC D3, D6 (case F27): whether the log holds every event a resume would
        replay; never deliver a log with a hole as if whole."""
        if self.store.events_complete(session_id, last, upto):
            return True
        logger.warning(
            "session %s: events missing between %d and %d; resumed false",
            session_id,
            last,
            upto,
        )
        return False

    def _new_session(self, hello: m.Hello, identity: Identity) -> tuple[Session, str]:
        name = hello.profile
        if name is None and len(identity.profiles) == 1:
            name = next(iter(identity.profiles))
        if name is None or name not in identity.profiles:
            granted = ", ".join(sorted(identity.profiles)) or "none"
            asked = "hello names no profile" if name is None else f"profile {name!r} is not granted"
            raise Refused(
                ErrorCode.PROFILE_DENIED, f"{asked}; granted: {granted}", CloseCode.AUTH_FAILED
            )
        limits = self.limits
        if self._sessions_of(identity) >= limits.max_sessions_per_user:
            raise Refused(
                ErrorCode.TOO_MANY_SESSIONS,
                "too many sessions for this user",
                CloseCode.TRY_AGAIN_LATER,
            )
        if context_too_large(hello.context, limits):
            raise Refused(
                ErrorCode.CONTEXT_TOO_LARGE,
                f"context over {limits.max_context_bytes} bytes",
                CloseCode.POLICY_VIOLATION,
            )
        profile = self.catalog.current.profile(name)
        return self.sessions.new(
            identity.user,
            identity.tenant,
            profile,
            dict(hello.context),
            hello.options.model_dump(exclude_none=True),
            self.bucket(),
            self.clock(),
        )

    def _sessions_of(self, identity: Identity) -> int:
        """Sessions the principal holds (SPEC E2): gateway-wide with nodes (SPEC N5)."""
        if self.node is None:
            held = self.sessions.count_for(identity.user, identity.tenant)
            if held >= self.limits.max_sessions_per_user:  # SPEC D2: some may be over
                held = self.sessions.end_expired(identity.user, identity.tenant, self.clock())
            return held
        try:
            return self.node.sessions_of(identity.user, identity.tenant)
        except StoreUnavailable as exc:
            raise Refused(
                ErrorCode.UNAVAILABLE,
                "the store cannot be read right now; try again later",
                CloseCode.TRY_AGAIN_LATER,
            ) from exc

    def _welcome(self, hello: m.Hello, session: Session, token: str, resumed: bool) -> m.Welcome:
        return m.Welcome(
            id=hello.id,
            protocol=SUBPROTOCOL_V1,
            session_id=session.id,
            resume_token=token,
            resumed=resumed,
            last_seq=session.last_seq,
            user=session.user,
            profile=session.profile.name,
            limits=self.welcome_limits,
        )

    def _replay(self, link: Link, session: Session, after: int) -> None:
        """SPEC D3: every logged event after ``after``, in order, once, then live.

        The events are read a page at a time as the socket takes them (SPEC D5: a long
        backlog must not overflow the bounded queue); events emitted from now on queue
        behind the replay.
        """
        if after >= session.last_seq:
            return
        store, session_id = self.store, session.id

        def page(cursor: int) -> list[tuple[int, bytes]]:
            return store.events_after(session_id, cursor, REPLAY_PAGE)

        link.push_replay(Replay(page, after, session.last_seq))
        self.metrics.replayed.inc(session.last_seq - after)
