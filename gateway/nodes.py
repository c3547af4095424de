"""Several nodes on one PostgreSQL store as one gateway (SPEC N2, N3, N4, N5).

A node is one ``toolbus serve`` process; :class:`Node` is its part of the gateway, built
only on a shared (PostgreSQL) store. It holds:

- the node id (``nodes.node_id``, default ``host-pid-random``) and a liveness lease in
  the ``nodes`` table, renewed every ``nodes.lease_interval`` seconds to
  ``nodes.lease_ttl`` seconds ahead of the database's clock, by a thread that also
  ``LISTEN``s for the other nodes' notifications (the event loop never waits on it;
  :mod:`gateway.node_lease`);
- session take-over (SPEC N2): :meth:`Node.take` makes this node a session's owner under
  a new fencing token (:mod:`gateway.pg_fence`), whichever node held it, loads it from
  the store (``last_seq`` = the highest stored ``seq``) and the caller replays it; the
  node that lost it closes its socket 4000 when notified, or at its next commit at the
  latest, which the token fences;
- the inbox (SPEC N3): events a node produced for a session another node holds (a job
  that ended here, a call's result) reach the owner, which emits them under its own
  ``seq`` and deletes the inbox row in the same commit: once, in order. It reads its
  inbox when notified, after a take-over, and every lease interval as a safety net;
  decisions and cancels for calls and jobs running on another node are routed to it
  (:mod:`gateway.node_inbox`, :mod:`gateway.node_requests`);
- dead nodes (SPEC N4): every lease interval the node claims, once, each node whose
  lease expired or whose advisory lock (held by its lease connection) is free, takes its
  sessions over and settles its calls, ledger rows and jobs with the restart code
  (:meth:`gateway.recovery.Recovery.settle_node`; :mod:`gateway.node_claim`);
- sessions per user counted gateway-wide, in the store (SPEC N5, E2).

Start-up: a node that finds no other live node when it registers (an advisory lock makes
that check and the registration atomic) claims every stored session and runs the
one-node recovery (:mod:`gateway.recovery`). A node that joins live nodes recovers
nothing at start: their work is theirs, and a dead node's is claimed as above.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass

from gateway.auth import hash_token
from gateway.catalog_state import CatalogState
from gateway.config import NodesConfig
from gateway.node_claim import NodeClaim
from gateway.node_inbox import NodeInbox
from gateway.node_lease import NodeLease
from gateway.node_requests import NodeRequests
from gateway.outbox import Outbox
from gateway.pg_fence import Fence
from gateway.recovery import Recovery
from gateway.session import Session, SessionTable, TokenBucket
from gateway.store_pg import PgStore
from gateway.store_rows import SessionRow
from protocol import messages as m
from protocol.errors import CloseCode

logger = logging.getLogger("gateway.nodes")


@dataclass(frozen=True, slots=True)
class Resumable:
    """A stored session as a resume is checked against it before the take-over
    (:meth:`Node.resumable`; SPEC N2, S6, D3)."""

    session_id: str
    user: str
    tenant: str | None
    profile: str
    floor_seq: int
    last_seq: int
    expires_at: float | None
    """End of its resume window (Unix s); ``None`` while a socket holds it (SPEC D2)."""

    @classmethod
    def of(cls, session: Session) -> Resumable:
        """The same facts of a session in memory."""
        return cls(
            session.id,
            session.user,
            session.tenant,
            session.profile.name,
            session.floor_seq,
            session.last_seq,
            session.expires_at,
        )


def node_id(configured: str | None) -> str:
    """``configured``, else ``host-pid-random`` (a restarted process is a new node)."""
    return configured or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class Node:
    """This process's part of a gateway of nodes sharing a PostgreSQL store (SPEC N2-N5).

    Its parts, built here: :class:`~gateway.node_lease.NodeLease` (lease and
    notification thread), :class:`~gateway.node_claim.NodeClaim` (dead nodes),
    :class:`~gateway.node_inbox.NodeInbox` (the inbox); requests routed to other nodes
    are :attr:`requests`'. Session ownership (take-over, fencing) is the node's own.

    Args:
        store: the shared store; its :attr:`~gateway.store_pg.PgStore.fence` is set here.
        config: the ``nodes`` section.
        sessions: this node's session table.
        outbox: commits what the inbox sweep emits.
        catalog: profiles and catalog views of sessions taken over.
        bucket: a session's invoke token bucket (SPEC E2).
        clock: Unix time in seconds.
    """

    def __init__(
        self,
        store: PgStore,
        config: NodesConfig,
        sessions: SessionTable,
        outbox: Outbox,
        catalog: CatalogState,
        bucket: Callable[[], TokenBucket],
        clock: Callable[[], float],
    ) -> None:
        self.id = node_id(config.node_id)
        self.config = config
        self.fence = Fence(self.id, self._fenced)
        store.fence = self.fence
        self.store = store
        self._store = store
        self._sessions = sessions
        self._catalog = catalog
        self._bucket = bucket
        self._clock = clock
        self._lease = NodeLease(
            self.id, config, store, self.fence, self._tick, self._notified, self._declared_dead
        )
        self._claim = NodeClaim(
            self.id, store, self.fence, sessions, outbox, catalog, bucket, self.take
        )
        self._inbox = NodeInbox(store, self.fence, sessions, outbox, self._resolved)
        self.requests: NodeRequests | None = None
        """Requests routed to the node that runs a call or job (SPEC N3); set by
        :func:`gateway.wiring.build_gateway`."""
        self.on_dead: Callable[[], None] = lambda: None
        """Called on the loop once another node declared this one dead (SPEC N4);
        ``serve`` stops then (:func:`gateway.server.run`)."""
        self.taken_over = 0
        """Sessions this node took from another node (SPEC N2)."""

    @property
    def recovery(self) -> Recovery | None:
        """Settles a dead node's work (SPEC N4); set by
        :func:`gateway.wiring.build_gateway`. Until then no dead node is claimed."""
        return self._claim.recovery

    @recovery.setter
    def recovery(self, recovery: Recovery | None) -> None:
        self._claim.recovery = recovery

    # -- lease (SPEC N4) ------------------------------------------------------------------

    def register(self) -> bool:
        """Write this node's lease (:meth:`gateway.node_lease.NodeLease.register`);
        ``True`` when no other node holds a live one. Called once, before serving.

        Raises:
            StoreError: the store cannot be reached (SPEC O5).
        """
        return self._lease.register()

    def start(self) -> None:
        """Start the lease and notification thread (call on the running loop)."""
        self._lease.start()

    async def stop(self) -> None:
        """Stop renewing and close the lease connection (SPEC N4;
        :meth:`gateway.node_lease.NodeLease.stop`)."""
        await self._lease.stop()

    def _declared_dead(self) -> None:
        """On the loop: another node took this one's work (SPEC N4). Its sessions are
        let go (sockets closed 4000: the clients resume elsewhere), nothing more is
        committed, and :attr:`on_dead` stops the process (``serve`` drains and exits)."""
        logger.error(
            "node %s: its lease was claimed by another node (declared dead); stopping", self.id
        )
        for session in list(self._sessions.sessions.values()):
            self._drop(session, "session moved: this node is stopping")
        self.on_dead()

    def _tick(self) -> None:
        self.sweep()
        if self.requests is not None:
            self.requests.sweep()
        # Not right after an outage of this node's own (SPEC N7). SPEC A3, N6: a decision
        # routed to a call adopted just now is applied in this turn, before a later
        # decision sent here can settle its approval.
        judging = self.recovery is not None and self._lease.judging()
        if judging and self.claim_dead() and self.requests is not None:
            self.requests.sweep()

    def claim_dead(self) -> list[str]:
        """Claim and settle the work of dead nodes here (SPEC N4;
        :meth:`gateway.node_claim.NodeClaim.claim_dead`). Returns the claimed nodes."""
        return self._claim.claim_dead()

    def _notified(self, payload: str) -> None:
        """On the loop: ``fence <node> <session>``, ``inbox <node>`` or ``requests *``
        (SPEC N2, N3)."""
        kind, _, rest = payload.partition(" ")
        target, _, session_id = rest.partition(" ")
        if kind == "requests" and self.requests is not None:
            self.requests.sweep()
        if target != self.id:
            return
        if kind == "fence":
            self._let_go(session_id)
        elif kind == "inbox":
            self.sweep()

    # -- ownership (SPEC N2) --------------------------------------------------------------

    def resumable(self, session_id: str, resume_token: str) -> Resumable | None:
        """What the stored (or local) session a resume with ``resume_token`` names is,
        without taking it: the caller checks the resume against it (principal, profile,
        ``last_seq``; SPEC S6, D3) and only then calls :meth:`take`, so a refused resume
        leaves the session with its owner (SPEC N2, D4). ``None`` when no session has
        that id and token.

        Raises:
            StoreUnavailable: the store cannot be read now.
        """
        local = self._sessions.get(session_id)
        if local is not None:
            if not local.token_matches(resume_token):
                return None
            return Resumable.of(local)
        row = self._store.load_session(session_id)
        if row is None or not hmac.compare_digest(row.token_hash, hash_token(resume_token)):
            return None
        return Resumable(
            session_id,
            row.user,
            row.tenant,
            row.profile,
            row.floor_seq,
            row.last_seq,
            row.expires_at,
        )

    def take(self, session_id: str, only_from: str | None = None) -> Session | None:
        """Make this node the owner of a stored session and return it, in memory and
        parked (the caller attaches and replays it). Call with nothing staged.
        ``only_from``: only if that node holds it now (a dead node's claim, SPEC N4).

        Returns:
            ``None`` when the store has no such session (or ``only_from`` lost it).

        Raises:
            StoreUnavailable: the store cannot do it now; nothing changed.
        """
        got = self._store.take_over(session_id, only_from)
        local = self._sessions.get(session_id)
        if got is None:
            return None
        row, took = got
        if took.kept and local is not None:
            return local
        if local is not None:
            self._drop(local, "session resumed on another node")
        if took.previous is not None and took.previous != self.id:
            self.taken_over += 1
            logger.info("session %s taken over from node %s (SPEC N2)", session_id, took.previous)
        session = self._adopt(row)
        self._lease.call(self.sweep)
        return session

    def _adopt(self, row: SessionRow) -> Session:
        profile = self._catalog.current.profile(row.profile)
        session = self._sessions.adopt(row, profile, self._bucket(), self._clock())
        session.catalog_names = self._catalog.view(session)[2]
        return session

    def _fenced(self, session_id: str) -> None:
        """A commit found ``session_id`` held by another node: let it go (SPEC N2)."""
        logger.info("session %s is held by another node; its events go there", session_id)
        self._let_go(session_id)

    def _let_go(self, session_id: str) -> None:
        self.fence.release(session_id)
        session = self._sessions.get(session_id)
        if session is not None:
            self._drop(session, "session resumed on another node")

    def _drop(self, session: Session, why: str) -> None:
        """Forget ``session`` here without ending it: its calls and jobs run on, and what
        they emit goes to the owner's inbox (SPEC N2, N3); its socket closes 4000."""
        self.fence.release(session.id)
        link = self._sessions.release(session)
        if link is not None:
            link.close(CloseCode.SESSION_REPLACED, why)

    # -- inbox (SPEC N3) -----------------------------------------------------------------

    def _resolved(self, session_id: str, event: m.ToolResolved) -> None:
        """An approval of a session held here was settled on another node (SPEC A3, N3)."""
        if self.requests is not None:
            self.requests.settled_elsewhere(session_id, event)

    def sweep(self) -> None:
        """Emit the inbox rows of this node's sessions as their events (SPEC N3;
        :meth:`gateway.node_inbox.NodeInbox.sweep`)."""
        self._inbox.sweep()

    # -- limits (SPEC N5) ----------------------------------------------------------------

    def sessions_of(self, user: str, tenant: str | None) -> int:
        """Unexpired sessions of the principal in the whole gateway (SPEC N5, E2).

        Raises:
            StoreUnavailable: the store cannot be read now.
        """
        rows = self._store.link.read(
            'SELECT count(*) FROM sessions WHERE "user"=%s AND tenant IS NOT DISTINCT FROM '
            "%s::text AND left(session_id, 2)='s_' AND (expires_at IS NULL OR expires_at>%s)",
            (user, tenant, self._clock()),
        )
        return int(rows[0][0])
