"""Claiming the work of dead nodes (SPEC N4).

:class:`NodeClaim` is the part of :class:`gateway.nodes.Node` that, every lease interval,
claims once each node whose lease expired or whose process is gone (its advisory lock is
free), takes that node's sessions over and settles its calls, ledger rows and jobs with
the restart code (:meth:`gateway.recovery.Recovery.settle_node`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import psycopg

from gateway.catalog_state import CatalogState
from gateway.node_lease import gone
from gateway.outbox import Outbox
from gateway.pg_fence import Fence
from gateway.recovery import Recovery
from gateway.session import Session, SessionTable, TokenBucket
from gateway.store import StoreUnavailable
from gateway.store_pg import PgNodeWork, PgStore

logger = logging.getLogger("gateway.nodes")


class NodeClaim:
    """Claims and settles dead nodes' work here (SPEC N4).

    Args:
        node_id: this node's id.
        store: the shared store.
        fence: this node's fencing tokens (sessions held elsewhere are marked foreign).
        sessions: this node's session table.
        outbox: flushed before take-overs (they need nothing staged).
        catalog: profiles of the sessions settled here.
        bucket: a session's invoke token bucket (SPEC E2).
        take: makes this node a session's owner if the named node still holds it
            (:meth:`gateway.nodes.Node.take`).
    """

    def __init__(
        self,
        node_id: str,
        store: PgStore,
        fence: Fence,
        sessions: SessionTable,
        outbox: Outbox,
        catalog: CatalogState,
        bucket: Callable[[], TokenBucket],
        take: Callable[[str, str], Session | None],
    ) -> None:
        self.id = node_id
        self._store = store
        self._work = PgNodeWork(store.link)
        self._fence = fence
        self._sessions = sessions
        self._outbox = outbox
        self._catalog = catalog
        self._bucket = bucket
        self._take = take
        self.recovery: Recovery | None = None
        """Settles a dead node's work (SPEC N4); until set, nothing is claimed."""
        self.claimed_nodes = 0
        """Dead nodes whose work this node took over (SPEC N4)."""

    def claim_dead(self) -> list[str]:
        """Claim, once, the work of every node whose lease expired or whose process is
        gone (its lock is free), and settle it here (SPEC N4). Returns the claimed nodes.

        Each claim is a ``DELETE ... RETURNING`` of the node's row: of several live
        nodes, one wins. The claimer takes the dead node's sessions over (parked here
        for their resume window), then settles its running calls, ledger rows and jobs
        with the restart code (:meth:`gateway.recovery.Recovery.settle_node`).
        """
        store, claimed = self._store, []
        try:
            db = store.link.conn()
            others = db.execute(
                "SELECT node_id, lease_until > extract(epoch FROM clock_timestamp()) "
                "FROM nodes WHERE node_id<>%s",
                (self.id,),
            ).fetchall()
            for node, leased in others:
                if leased and not gone(db, node):
                    continue
                row = db.execute(
                    "DELETE FROM nodes WHERE node_id=%s RETURNING node_id", (node,)
                ).fetchone()
                if row is not None:
                    claimed.append(node)
                    self._settle_or_release(db, node)
        except (psycopg.Error, StoreUnavailable) as exc:
            logger.warning("node %s: claiming dead nodes failed: %s", self.id, exc)
        return claimed

    def _settle_or_release(self, db: psycopg.Connection[tuple[Any, ...]], dead: str) -> None:
        """Settle a claimed node; if the store fails midway, put its row back, expired,
        so that a live node (maybe this one) claims what is left at a later tick."""
        try:
            self._settle(dead)
        except (psycopg.Error, StoreUnavailable):
            with contextlib.suppress(psycopg.Error):
                db.execute(
                    "INSERT INTO nodes (node_id, lease_until, started_at) VALUES (%s, 0, 0) "
                    "ON CONFLICT (node_id) DO NOTHING",
                    (dead,),
                )
            raise

    def _settle(self, dead: str) -> None:
        """Take the dead node's sessions over, then settle its calls and jobs (SPEC N4)."""
        assert self.recovery is not None
        work = self._work
        self._outbox.flush()  # take-overs need nothing staged
        sessions = work.sessions_held_by(dead)
        for session_id in sessions:
            # A client that already resumed on a live node keeps its session there.
            self._take(session_id, dead)
        calls, jobs = work.running_calls_of(dead), work.unfinished_jobs_of(dead)
        named = {sid for sid, _, _ in calls} | {row.session_id for row in jobs}
        elsewhere = self._detached(named - set(self._sessions.sessions))
        found = self.recovery.settle_node(calls, work.running_ledger_of(dead), jobs, elsewhere)
        self.claimed_nodes += 1
        logger.warning(
            "node %s took over dead node %s: %d sessions, %d unfinished jobs (SPEC N4)",
            self.id,
            dead,
            len(sessions),
            found,
        )

    def _detached(self, session_ids: set[str]) -> dict[str, Session]:
        """The stored sessions of ``session_ids`` that live nodes hold, in memory but not
        in the table: what is emitted for them is forwarded to their owners (SPEC N4)."""
        found: dict[str, Session] = {}
        for session_id in sorted(session_ids):
            row = self._store.load_session(session_id)
            if row is not None:
                self._fence.foreign(session_id)
                profile = self._catalog.current.profile(row.profile)
                found[session_id] = self._sessions.detached(row, profile, self._bucket())
        return found
