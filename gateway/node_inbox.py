"""A node's inbox: events other nodes produced for the sessions it holds (SPEC N3).

:class:`NodeInbox` is the part of :class:`gateway.nodes.Node` that emits the inbox rows
of this node's sessions (a job that ended on another node, a call's result there) under
this node's own ``seq``, deleting each row in the commit that stores its event: once,
in order. The node sweeps it when notified, after a take-over, and every lease interval
as a safety net.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gateway.outbox import Outbox
from gateway.pg_fence import Fence
from gateway.session import SessionTable
from gateway.store import StoreUnavailable
from gateway.store_pg import PgStore
from protocol import messages as m
from protocol.codec import decode_server
from protocol.messages import DURABLE_TYPES, DurableEvent

logger = logging.getLogger("gateway.nodes")

TERMINALS = (m.Result, m.Dispatched, m.CallError)
"""The terminal events of a call (SPEC I12)."""

INBOX_PAGE = 256
"""Inbox rows read per sweep; more wait for the next one (SPEC N3)."""


class NodeInbox:
    """Emits the inbox rows of this node's sessions (SPEC N3).

    Args:
        store: the shared store (reads the inbox).
        fence: this node's fencing tokens: which sessions it holds; a row is marked
            consumed there, and deleted with the commit.
        sessions: this node's session table.
        outbox: commits what a sweep emitted.
        resolved: told of each ``tool.resolved`` emitted, with its session's id: an
            approval settled on another node (SPEC A3, N3; a later decision for it is
            answered as one node would: ``NodeRequests.settled_elsewhere``).
    """

    def __init__(
        self,
        store: PgStore,
        fence: Fence,
        sessions: SessionTable,
        outbox: Outbox,
        resolved: Callable[[str, m.ToolResolved], None] = lambda _s, _e: None,
    ) -> None:
        self._store = store
        self._fence = fence
        self._sessions = sessions
        self._outbox = outbox
        self._resolved = resolved
        self.inbox_emitted = 0
        """Inbox rows emitted as events of this node's sessions (SPEC N3)."""

    def sweep(self) -> None:
        """Emit the inbox rows of this node's sessions as their events; each row is
        deleted in the commit that stores its event (once, in order)."""
        try:
            rows = self._store.inbox(INBOX_PAGE)
        except StoreUnavailable as exc:
            logger.warning("inbox not read now: %s", exc)
            return
        for row_id, session_id, body in rows:
            session = self._sessions.get(session_id)
            if session is None or session_id not in self._fence.epochs:
                continue
            event = decode_server(body)
            if not isinstance(event, DURABLE_TYPES):
                logger.error("inbox row %d is not a durable event; dropped", row_id)
                self._fence.consumed(row_id, session_id, 0)
                continue
            durable: DurableEvent = event  # type: ignore[assignment]
            data = session.emit(durable)
            if isinstance(durable, TERMINALS):
                # SPEC I12: the owner records the call's end under its own seq (the
                # node that ran it could not: its write was fenced).
                session.call_done(durable.call_id, data)
            elif isinstance(durable, m.ToolResolved):
                self._resolved(session_id, durable)
                if durable.always and durable.resolution is m.Resolution.ALLOWED:
                    # SPEC A3, N3: "allow always" decided for a call that waited on
                    # another node is a grant of the session, which lives here (that
                    # node's write of it was fenced).
                    session.grants.add(durable.tool)
                    session.save()
            self._fence.consumed(row_id, session_id, session.last_seq)
            self.inbox_emitted += 1
        if rows:
            self._outbox.flush()
