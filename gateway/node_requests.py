"""Requests routed to the node where a call, approval or job runs (SPEC N3, A3, I8, J3).

A session may move to node B while its call waits for approval on node A, or its job
runs there. ``tool.confirm``, ``call.cancel`` and ``job.cancel`` sent to B then name
something B does not hold. B writes a row to ``node_requests`` and notifies every node
(:meth:`NodeRequests.route`); the node that holds the approval, call or job deletes the
row (``DELETE ... RETURNING``: exactly one node acts on it) and applies it as if its own
socket had sent it (:meth:`NodeRequests.sweep`). What that produces (``tool.resolved``,
the call's result, ``job.cancelled``) reaches the client on B through the inbox
(:mod:`gateway.pg_fence`). Rows nobody holds are dropped after :data:`REQUEST_TTL`.

Each node reads the table when notified and every lease interval (the safety net).
"""

from __future__ import annotations

import logging
import time
from enum import StrEnum

from gateway.approvals import Approvals
from gateway.jobs import JobRunner
from gateway.pg_fence import CHANNEL
from gateway.pipeline import Pipeline
from gateway.store import StoreUnavailable
from gateway.store_pg import PgStore
from protocol.codec import encode_json
from protocol.messages import Decision

logger = logging.getLogger("gateway.nodes")

REQUEST_TTL = 60.0
"""Seconds a routed request waits for a node that holds its target before it is dropped
(the call or job ended meanwhile, or its node died)."""


class Kind(StrEnum):
    """What a routed request asks of the node that holds its target."""

    CONFIRM = "confirm"
    CANCEL_CALL = "cancel_call"
    CANCEL_JOB = "cancel_job"


class NodeRequests:
    """Routes requests between nodes and applies those for this node (SPEC N3).

    Args:
        store: the shared store.
        approvals: this node's pending approvals (SPEC A3).
        pipeline: this node's running calls (SPEC I8).
        jobs: this node's running jobs (SPEC J3).
    """

    def __init__(
        self, store: PgStore, approvals: Approvals, pipeline: Pipeline, jobs: JobRunner
    ) -> None:
        self._store = store
        self._approvals = approvals
        self._pipeline = pipeline
        self._jobs = jobs
        self.applied = 0
        """Requests from other nodes applied here."""

    def running_elsewhere(self, session_id: str, call_id: str | None, approval_id: str) -> bool:
        """Whether the stored calls of ``session_id`` hold a running one with that call
        id or that pending approval id (the node that runs it is elsewhere).

        Raises:
            StoreUnavailable: the store cannot be read now.
        """
        # The call's note (gateway.approval_gate, gateway.handoff) is searched as bytes,
        # not cast to json: PostgreSQL's json refuses a NUL escape (\u0000), which a
        # tool name may hold. Inside a JSON string a quote is escaped, so the key and
        # value below can only match the note's own "approval_id" member.
        named = encode_json({"approval_id": approval_id})[1:-1]
        rows = self._store.link.read(
            "SELECT 1 FROM calls WHERE session_id=%s AND state='running' AND "
            "(call_id=%s OR position(%s::bytea in body) > 0) LIMIT 1",
            (session_id, (call_id or "").encode("utf-8", "surrogatepass"), named),
        )
        return bool(rows)

    def route(
        self, kind: Kind, session_id: str, user: str, target: str, decision: str | None = None
    ) -> None:
        """Store a request for whichever node holds ``target`` and notify every node.

        Raises:
            StoreUnavailable: it could not be stored; nothing was sent.
        """
        self._store.link.execute(
            "WITH r AS (INSERT INTO node_requests "
            '(kind, session_id, "user", target, decision, created_at) '
            "VALUES (%s,%s,%s,%s,%s,%s) RETURNING id) SELECT pg_notify(%s, 'requests *') FROM r",
            (str(kind), session_id, user, target, decision, time.time(), CHANNEL),
        )

    def sweep(self) -> None:
        """Apply the stored requests whose target this node holds, each once."""
        try:
            self._store.link.execute(
                "DELETE FROM node_requests WHERE created_at < %s", (time.time() - REQUEST_TTL,)
            )
            rows = self._store.link.read(
                'SELECT id, kind, session_id, "user", target, decision FROM node_requests '
                "ORDER BY id"
            )
            for row_id, kind, session_id, user, target, decision in rows:
                if self._holds(Kind(kind), session_id, target) and self._claim(row_id):
                    self._apply(Kind(kind), session_id, user, target, decision)
        except StoreUnavailable as exc:
            logger.warning("routed requests not read now: %s", exc)

    def _holds(self, kind: Kind, session_id: str, target: str) -> bool:
        if kind is Kind.CONFIRM:
            return target in self._approvals.pending
        if kind is Kind.CANCEL_JOB:
            return target in self._jobs.active
        return self._pipeline.running(session_id, target)

    def _claim(self, row_id: int) -> bool:
        rows = self._store.link.read(
            "DELETE FROM node_requests WHERE id=%s RETURNING id", (row_id,)
        )
        return bool(rows)

    def _apply(
        self, kind: Kind, session_id: str, user: str, target: str, decision: str | None
    ) -> None:
        self.applied += 1
        if kind is Kind.CONFIRM:
            reason = self._approvals.confirm(
                session_id, user, target, Decision(decision or Decision.DENY)
            )
            logger.info("routed decision on %s: %s", target, reason or "accepted")
        elif kind is Kind.CANCEL_JOB:
            self._jobs.cancel(target)
        else:
            self._pipeline.cancel_by_id(session_id, target)
