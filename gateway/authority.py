"""Authority at the moment a handler starts, and credentials with a lifetime (SPEC A7, S6).

A call waits between its first gate check (SPEC I2) and its handler's start: for the
user's approval, for a job slot, for a worker thread. Meanwhile the session's context,
its profile's grants (hot reload) and its credential may change. :meth:`Authority.check`
is the one re-check, and every path runs it on the state of that moment:

- :class:`gateway.pipeline.Pipeline` after the approval wait, so a gated call whose
  authority lapsed ends in ``call.error`` with the gate's code and is never dispatched;
- :func:`gateway.execute.run_handler`, the only place a handler is started, through
  ``ToolContext.recheck``: on the loop right before an ``async def`` handler, in the
  worker thread right before a plain one (after the queue slot of a job and after the
  wait for a free thread). A lapse there raises :class:`Lapse`; a sync call ends in
  ``call.error``, a job in ``job.failed`` whose ``error.code`` is the same code.

The gates, in order: the credential (revoked -> ``credential_revoked``, past its
``exp`` -> ``credential_expired``), the tool still in the catalog (``unknown_tool``),
then :func:`catalog.visibility.check_access` with the profile of the *current* catalog
and the session's context and origin now (``denied_capability``, ``denied_dangerous``,
``denied_scope``).

Credentials (SPEC S6): each session holds the credential it last authenticated with
(``hello``, a resume, or ``auth.refresh``). One with an expiry gets two loop timers:
``auth.expiring`` to the live socket :attr:`Authority.warn_ahead` seconds before, and at
expiry the socket is closed 4004. :meth:`Authority.sweep` re-authenticates the
credentials without an expiry (token-file tokens) and closes 4005 the sessions of one
that is no longer accepted. A closed session is parked, as after any drop: its resume
is authenticated afresh, and nothing of it runs on the lapsed credential meanwhile.
Credentials live only in memory and never reach a log. The session row keeps only a
*reference* (:mod:`gateway.credref`: the token's SHA-256 digest and profile, or a JWT's
``sub`` and ``exp``); a session a restart brought back, which has no credential in
memory until it resumes, is checked on that reference against the token file and the
clock now, so its queued and re-run jobs end ``job.failed`` ``credential_revoked`` /
``credential_expired`` as a live lapse would (SPEC S6, A7, J6).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from catalog.visibility import Scope, check_access
from gateway.auth import Authenticator, AuthError, Identity, seen_version_of, version_of
from gateway.credref import encode_ref, lapse_of
from gateway.tasks import periodic
from protocol import messages as m
from protocol.errors import CloseCode, ErrorCode

if TYPE_CHECKING:
    from gateway.catalog_state import CatalogState
    from gateway.session import Session

logger = logging.getLogger("gateway.authority")

SWEEP_BATCH = 32
"""Credentials re-authenticated per event-loop turn by :meth:`Authority.sweep`."""

_LAPSED = {
    ErrorCode.CREDENTIAL_REVOKED: "the session's credential was revoked",
    ErrorCode.CREDENTIAL_EXPIRED: "the session's credential expired",
}
"""The text of a credential :class:`Lapse`, live or re-validated from the store."""

NOT_RECORDED = "the store cannot record the new credential right now; the old one stands"
"""SPEC S6, D6: the ``unavailable`` refusal of an ``auth.refresh`` not made durable."""

CloseFn = Callable[["Session", CloseCode, str], None]
"""Closes a session's live socket with a typed code and reason (the server's part)."""


class Lapse(Exception):
    """A gate failed on the state just before a handler's start (SPEC A7).

    Attributes:
        code: the typed denial the call ends with (``call.error.code``, or the
            ``error.code`` of ``job.failed``).
        message: text for the client and the model.
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class Refusal(Exception):
    """A credential offered for a session (resume, ``auth.refresh``) is refused (SPEC S6).

    Attributes:
        code: ``auth_failed``, ``principal_mismatch`` or ``profile_denied``.
        message: text for the ``error`` reply; never the credential.
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(slots=True, eq=False)
class Credential:
    """The credential a session runs on, with its timers (SPEC S6)."""

    token: str = field(repr=False)
    identity: Identity
    revoked: bool = False
    timers: list[asyncio.TimerHandle] = field(default_factory=list, repr=False)

    def cancel(self) -> None:
        for timer in self.timers:
            timer.cancel()
        self.timers.clear()


def admits(identity: Identity, session: Session) -> Refusal | None:
    """Whether ``identity`` may carry ``session`` on (SPEC S6): the same principal
    (tenant, user) and its profile still granted. ``None`` when it may."""
    return admits_named(identity, session.user, session.tenant, session.profile.name)


def admits_named(identity: Identity, user: str, tenant: str | None, profile: str) -> Refusal | None:
    """:func:`admits` for a session known by its principal and profile name (a stored
    one not yet taken over by this node, SPEC N2, S6)."""
    if (identity.user, identity.tenant) != (user, tenant):
        return Refusal(ErrorCode.PRINCIPAL_MISMATCH, "the credential names another principal")
    if profile not in identity.profiles:
        granted = ", ".join(sorted(identity.profiles)) or "none"
        return Refusal(
            ErrorCode.PROFILE_DENIED, f"profile {profile!r} is not granted; granted: {granted}"
        )
    return None


class Authority:
    """The A7 re-check and the S6 credential lifetimes of every session; one per server.

    Args:
        catalog: the server's catalog state (its ``current`` is read at each check).
        authenticator: turns a credential into an :class:`Identity` (SPEC S2).
        clock: Unix time in seconds; a credential is lapsed from its ``exp`` on.
        warn_ahead: seconds before expiry to send ``auth.expiring``; 0 sends none.
        close: closes a session's live socket with a code and a reason.
    """

    def __init__(
        self,
        catalog: CatalogState,
        authenticator: Authenticator,
        clock: Callable[[], float],
        warn_ahead: float,
        close: CloseFn,
    ) -> None:
        self._catalog = catalog
        self._authenticator = authenticator
        self._clock = clock
        self.warn_ahead = warn_ahead
        self._close = close
        self._credentials: dict[str, Credential] = {}
        self._swept: object = object()
        """The authenticator's version at the last sweep (:func:`version_of`)."""

    # -- the re-check (SPEC A7) --------------------------------------------------------

    def check(self, session: Session, tool_name: str) -> Lapse | None:
        """Every gate of SPEC I2 and S6 on the state now; safe from a worker thread.

        Returns:
            ``None`` when the call may start, else the :class:`Lapse` to end it with.
        """
        lapse = self._credential_lapse(session)
        if lapse is not None:
            return lapse
        catalog = self._catalog.current
        tool = catalog.tools.get(tool_name)
        if tool is None:
            return Lapse(ErrorCode.UNKNOWN_TOOL, f"{tool_name} is no longer in the catalog")
        profile = catalog.profile(session.profile.name)
        scope = Scope(session.context, session.origin)
        denial = check_access(tool, profile, scope, catalog.safe_default)
        if denial is not None:
            return Lapse(ErrorCode(denial.value), f"{tool_name} is not available: {denial.value}")
        return None

    def gate(self, session: Session, tool_name: str) -> Callable[[], None]:
        """A ``recheck()`` for ``ToolContext``: raises :class:`Lapse` when :meth:`check`
        fails. :func:`gateway.execute.run_handler` calls it right before the handler."""

        def recheck() -> None:
            lapse = self.check(session, tool_name)
            if lapse is not None:
                raise lapse

        return recheck

    def _credential_lapse(self, session: Session) -> Lapse | None:
        credential = self._credentials.get(session.id)
        if credential is None:
            # A session a restart brought back, not resumed yet: its credential is not in
            # memory, so its stored reference is re-validated on the token file and the
            # clock now (SPEC S6, A7, J6; a queued job must not run on a revoked token).
            code = lapse_of(
                session.credential_ref,
                self._authenticator,
                (session.user, session.tenant),
                session.profile.name,
                self._clock(),
            )
            return None if code is None else Lapse(code, _LAPSED[code])
        if credential.revoked:
            code = ErrorCode.CREDENTIAL_REVOKED
            return Lapse(code, _LAPSED[code])
        expires = credential.identity.expires_at
        if expires is not None and self._clock() >= expires:
            code = ErrorCode.CREDENTIAL_EXPIRED
            return Lapse(code, _LAPSED[code])
        if expires is None and seen_version_of(self._authenticator) != self._swept:
            # SPEC S6, A7: a change of the token file was seen since the last sweep (by
            # a hello, say; no stat here): this credential is checked now, not at the
            # next sweep, which closes its socket 4005 (not from here: maybe a thread).
            identity = self._still(credential.token)
            if identity is None or admits(identity, session) is not None:
                code = ErrorCode.CREDENTIAL_REVOKED
                return Lapse(code, _LAPSED[code])
        return None

    # -- credential lifetimes (SPEC S6) ------------------------------------------------

    def bind(self, session: Session, token: str, identity: Identity) -> None:
        """Make ``token`` the session's credential and arm its expiry timers.

        Call after the session's socket is attached (the warning is sent at once when
        the expiry is nearer than :attr:`warn_ahead`).
        """
        self.forget(session)
        credential = Credential(token, identity)
        self._credentials[session.id] = credential
        # SPEC S6: the session row keeps a reference (never the credential) for after a
        # restart; see _credential_lapse.
        session.credential_ref = encode_ref(token, identity, session.profile.name)
        session.save()
        expires = identity.expires_at
        if expires is None:
            return
        loop = asyncio.get_running_loop()
        left = expires - self._clock()
        if self.warn_ahead > 0:
            credential.timers.append(
                loop.call_later(max(0.0, left - self.warn_ahead), self._warn, session, credential)
            )
        credential.timers.append(loop.call_later(max(0.0, left), self._expire, session, credential))

    def refresh(
        self, session: Session, token: str, durable: Callable[[], bool] | None = None
    ) -> float | None:
        """Replace the session's credential on its open socket (SPEC S6).

        Args:
            session: the session.
            token: the new credential.
            durable: makes the session row staged with the new credential's reference
                durable (SPEC D1, D6); ``False`` puts the old credential back.

        Returns:
            The new expiry in Unix seconds, or ``None`` when it does not expire.

        Raises:
            Refusal: the token is not accepted, names another principal, or does not
                grant the session's profile; the old credential and expiry stand. Or
                ``credential_expired``: the old credential's ``expires_at`` has passed
                on this clock (its close timer may not have fired yet): too late, the
                socket is closed 4004 as at the expiry. Or ``unavailable``: ``durable``
                said no; the old credential and expiry stand (SPEC D6).
        """
        current = self._credentials.get(session.id)
        if current is not None:
            expires = current.identity.expires_at
            if expires is not None and self._clock() >= expires:
                self._expire(session, current)
                code = ErrorCode.CREDENTIAL_EXPIRED
                raise Refusal(code, _LAPSED[code])
        try:
            identity = self._authenticator.authenticate(token)
        except AuthError as exc:
            logger.warning("credential refresh refused: %s", exc)
            raise Refusal(ErrorCode.AUTH_FAILED, "authentication failed") from None
        refusal = admits(identity, session)
        if refusal is not None:
            raise refusal
        ref = session.credential_ref
        self.bind(session, token, identity)
        if durable is not None and not durable():
            # SPEC S6, D6: the new credential holds only once its reference is durable
            # (a restart checks queued work against it); else the old one stands.
            self._put_back(session, current, ref)
            raise Refusal(ErrorCode.UNAVAILABLE, NOT_RECORDED)
        return identity.expires_at

    def _put_back(self, session: Session, old: Credential | None, ref: str | None) -> None:
        """Undo a :meth:`bind` of :meth:`refresh`: ``old`` (its reference ``ref``)
        is the session's credential again, its timers re-armed (SPEC S6, D6)."""
        if old is None:
            self.forget(session)
            session.credential_ref = ref
            session.save()
            return
        self.bind(session, old.token, old.identity)
        self._credentials[session.id].revoked = old.revoked

    def forget(self, session: Session) -> None:
        """Drop the session's credential and timers (its end, or a new credential)."""
        credential = self._credentials.pop(session.id, None)
        if credential is not None:
            credential.cancel()

    def _warn(self, session: Session, credential: Credential) -> None:
        expires = credential.identity.expires_at
        if self._credentials.get(session.id) is not credential or expires is None:
            return
        if session.link is not None:
            left = max(0.0, expires - self._clock())
            session.reply(m.AuthExpiring(expires_at=expires, seconds_left=round(left, 3)))

    def _expire(self, session: Session, credential: Credential) -> None:
        if self._credentials.get(session.id) is credential:
            logger.info("session %s: credential expired; closing 4004", session.id)
            self._close(session, CloseCode.CREDENTIAL_EXPIRED, "credential expired")

    async def sweep(self, sessions: Iterable[Session]) -> int:
        """Re-authenticate every credential that has no expiry, once per distinct token
        (SPEC S6: a token removed from the token file, seen by its hot reload). Each
        session whose credential is refused, or no longer admits it, is marked revoked
        and its socket closed 4005.

        A sweep is skipped while the authenticator reports the same version as at the
        last one (a token file that did not change), and it yields to the event loop
        every :data:`SWEEP_BATCH` authentications (a token file is searched linearly, so
        a large one times many sessions must not stall every socket at once).

        Returns:
            How many sessions were revoked by this sweep.
        """
        version = version_of(self._authenticator)
        if version == self._swept:
            return 0
        self._swept = version
        verdicts: dict[str, Identity | None] = {}
        revoked = batch = 0
        for session in list(sessions):
            if batch >= SWEEP_BATCH:
                batch = 0
                await asyncio.sleep(0)
            credential = self._credentials.get(session.id)
            if credential is None or credential.revoked or credential.identity.expires_at:
                continue
            if credential.token not in verdicts:
                verdicts[credential.token] = self._still(credential.token)
                batch += 1
            identity = verdicts[credential.token]
            if identity is not None and admits(identity, session) is None:
                continue
            credential.revoked = True
            credential.cancel()
            revoked += 1
            logger.info("session %s: credential revoked; closing 4005", session.id)
            self._close(session, CloseCode.CREDENTIAL_REVOKED, "credential revoked")
        return revoked

    def _still(self, token: str) -> Identity | None:
        try:
            return self._authenticator.authenticate(token)
        except AuthError:
            return None

    async def watch(self, interval: float, sessions: Callable[[], Iterable[Session]]) -> None:
        """Run :meth:`sweep` every ``interval`` seconds until cancelled; a failing sweep
        is logged and retried with backoff (:func:`gateway.tasks.periodic`)."""
        await periodic("credential sweep", interval, lambda: self.sweep(sessions()))
