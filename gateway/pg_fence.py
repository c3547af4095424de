"""Session ownership on a shared PostgreSQL store: the fencing token (SPEC N2, N3, D1).

A session lives on one node at a time. Its row holds ``owner_node`` and ``owner_epoch``;
a node that takes a session over (:meth:`Fence.take_over`) raises the epoch by one, and
the new value is that node's *fencing token* for the session. Every commit of a node
that touches sessions (events, rows, counters, call records, deletions) first reads the
touched rows ``FOR KEY SHARE`` in the same transaction (:meth:`Fence.check`): a session
whose epoch is no longer this node's token is *fenced*. Nothing of it is written under its
``seq`` and nothing of it is sent (SPEC D1); its events, unless they came from the inbox,
go to the ``inbox`` table for the new owner, which gives them its own ``seq`` (SPEC N3).
The row lock orders a take-over and a commit: a take-over (``SELECT ... FOR UPDATE``, as
every change of an epoch is: :meth:`Fence.take_over`, :func:`claim_all`) waits for a
commit holding the row, and a commit after a take-over sees the new epoch. ``FOR KEY
SHARE`` is the weakest lock that does this: it conflicts with ``FOR UPDATE`` and
``DELETE``, not with the owner's own row updates (``FOR NO KEY UPDATE``: counters, the
session row), so a node forwarding events of a session another node now holds never
waits for the owner's updates of that row, nor they for its check (the owner's
``DELETE`` of an ended session still orders with it). With ``FOR SHARE`` the two waited
for each other, and under load a wait past ``lock_timeout`` (100 ms) failed a commit
that had nothing to wait for.

The inbox: the owner reads the rows of its sessions (:meth:`Fence.inbox`), emits each as
a new event of the session and deletes the row in the commit that stores the event
(:meth:`Fence.consumed`), so each arrives once. A fenced commit drops such events and
keeps the rows for whoever holds the session now.

Notifications (``LISTEN``/``NOTIFY`` on :data:`CHANNEL`) only make it fast: a payload
``fence <node> <session>`` tells the old owner to close its socket (close 4000), and
``inbox <node>`` tells an owner to read its inbox. The token is the guarantee.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from gateway.store import StoreUnavailable

CHANNEL = "toolbus_nodes"
"""The one ``LISTEN``/``NOTIFY`` channel of the nodes of a store; payloads name a node."""

LOST_KEPT = 100_000
"""Lost sessions remembered (:attr:`Fence.lost`); older ones are forgotten."""

_Cursor = psycopg.Cursor[tuple[Any, ...]]
Event = tuple[str, int, bytes]
"""A staged event: ``(session_id, seq, body)``."""


@dataclass(slots=True)
class Fence:
    """This node's fencing tokens and staged inbox consumption (SPEC N2, N3).

    Args:
        node_id: this node's id (SPEC N4).
        on_fenced: called after a commit, on the event loop, with each session found
            held by another node; the node then lets the session go (close 4000).
    """

    node_id: str
    on_fenced: Callable[[str], None] = lambda session_id: None
    epochs: dict[str, int] = field(default_factory=dict)
    """Sessions this node holds, and its token of each."""
    lost: dict[str, None] = field(default_factory=dict)
    """Sessions this node held and lost, the last :data:`LOST_KEPT`: a row a stale copy
    stages for one is not a new session (it would bring back a session ended since)."""
    dead: bool = False
    """Another node claimed this node's work (SPEC N4): every commit fails from now on."""
    consumed_rows: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Inbox rows emitted and staged, not yet committed: row id -> (session, seq)."""

    def new_session(self, session_id: str) -> int:
        """The token of a session this node creates (the first row insert), or holds."""
        if session_id not in self.epochs and session_id not in self.lost:
            self.epochs[session_id] = 1
        return self.epochs.get(session_id, 0)

    def foreign(self, session_id: str) -> None:
        """``session_id`` is held by another node: a row staged for it here is not a new
        session (a detached copy, SPEC N4), so its writes stay fenced."""
        if session_id not in self.epochs:
            self.lost[session_id] = None

    def release(self, session_id: str) -> None:
        """Stop holding ``session_id`` (another node took it, or it ended here)."""
        if self.epochs.pop(session_id, None) is not None:
            self.lost[session_id] = None
            if len(self.lost) > LOST_KEPT:
                del self.lost[next(iter(self.lost))]

    def consumed(self, row_id: int, session_id: str, seq: int) -> None:
        """Inbox row ``row_id`` became the event ``seq`` of ``session_id``: delete it in
        the commit that stores the event (SPEC N3: once)."""
        self.consumed_rows[row_id] = (session_id, seq)

    def take_over(
        self,
        db: psycopg.Connection[tuple[Any, ...]],
        session_id: str,
        only_from: str | None = None,
    ) -> TakeOver | None:
        """Make this node the owner of ``session_id`` (SPEC N2), in one transaction: the
        row is locked, its epoch raised (the new token), the previous owner notified.
        ``only_from``: take it only from that node (a dead node's claim, SPEC N4: a
        session its client already resumed on a live node stays there).

        Returns:
            ``None`` when no such session is stored (or ``only_from`` no longer owns
            it), else what the take-over found.

        Raises:
            psycopg.Error: the database refused (the caller maps it, SPEC D6).
        """
        with db.transaction():
            row = db.execute(
                "SELECT owner_node, owner_epoch FROM sessions WHERE session_id=%s FOR UPDATE",
                (session_id,),
            ).fetchone()
            if row is None or (only_from is not None and row[0] != only_from):
                return None
            previous, old_epoch = row
            db.execute(
                "UPDATE sessions SET owner_node=%s, owner_epoch=%s WHERE session_id=%s",
                (self.node_id, old_epoch + 1, session_id),
            )
            if previous is not None and previous != self.node_id:
                db.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"fence {previous} {session_id}"))
        kept = previous == self.node_id and self.epochs.get(session_id) == old_epoch
        self.epochs[session_id] = old_epoch + 1
        self.lost.pop(session_id, None)
        return TakeOver(previous, old_epoch + 1, kept)

    def check(self, cur: _Cursor, touched: set[str]) -> dict[str, str | None]:
        """Inside a commit's transaction: the touched sessions this node does not hold
        (SPEC N2), each with its owner now (``None``: no such session). Holds a key share
        lock on every touched row until the commit ends: a take-over of one waits."""
        if not touched:
            return {}
        cur.execute(
            "SELECT session_id, owner_node, owner_epoch FROM sessions "
            "WHERE session_id = ANY(%s) FOR KEY SHARE",
            (sorted(touched),),
        )
        rows = {sid: (node, epoch) for sid, node, epoch in cur.fetchall()}
        fenced: dict[str, str | None] = {}
        for sid in touched:
            mine, row = self.epochs.get(sid), rows.get(sid)
            if mine is not None and (row is None or row[1] == mine):
                continue  # held (row None: created here, inserted by this commit)
            fenced[sid] = row[0] if row is not None else None
        return fenced

    def forward(
        self, cur: _Cursor, fenced: dict[str, str | None], events: Iterable[Event], now: float
    ) -> None:
        """Inside a commit: the events of fenced sessions go to the inbox of their owner
        (SPEC N3), in order, except those that came from the inbox (their rows stay for
        the owner); each owner is notified."""
        derived = {(sid, seq) for sid, seq in self.consumed_rows.values()}
        rows = [
            (sid, body, now)
            for sid, seq, body in events
            if fenced.get(sid) is not None and (sid, seq) not in derived
        ]
        if rows:
            self._alive(cur)
            cur.executemany(
                "INSERT INTO inbox (session_id, body, created_at) VALUES (%s,%s,%s)", rows
            )
            owners = {owner for sid, _, _ in rows if (owner := fenced[sid]) is not None}
            for owner in sorted(owners):
                cur.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"inbox {owner}"))
        done = [rid for rid, (sid, _) in self.consumed_rows.items() if sid not in fenced]
        if done:
            cur.execute("DELETE FROM inbox WHERE id = ANY(%s)", (done,))

    def _alive(self, cur: _Cursor) -> None:
        """Inside a commit that forwards events: this node's row must still exist (read
        ``FOR KEY SHARE``, which orders it with a claim's ``DELETE`` but not with this
        node's lease renewals, an ``UPDATE`` on another connection); a node whose work
        was claimed forwards nothing, since the claimer settled it (SPEC N4).

        Raises:
            StoreUnavailable: the node was declared dead; the transaction rolls back.
        """
        cur.execute("SELECT 1 FROM nodes WHERE node_id=%s FOR KEY SHARE", (self.node_id,))
        if cur.fetchone() is None:
            self.dead = True
            raise StoreUnavailable(f"node {self.node_id} was declared dead")

    def committed(self, fenced: dict[str, str | None], deleted: Iterable[str]) -> None:
        """After a successful commit: consumed rows are gone, deleted sessions are no
        longer held, fenced sessions are let go."""
        self.consumed_rows.clear()
        for sid in deleted:
            if sid not in fenced:
                self.release(sid)
        for sid in fenced:
            self.release(sid)
        for sid in sorted(fenced):
            self.on_fenced(sid)

    def inbox(
        self, db: psycopg.Connection[tuple[Any, ...]], limit: int
    ) -> list[tuple[int, str, bytes]]:
        """Inbox rows of the sessions this node owns in the store, oldest first, without
        those already emitted and staged (SPEC N3)."""
        rows = db.execute(
            "SELECT i.id, i.session_id, i.body FROM inbox i JOIN sessions s "
            "ON s.session_id = i.session_id WHERE s.owner_node=%s ORDER BY i.id LIMIT %s",
            (self.node_id, limit),
        ).fetchall()
        return [(int(i), sid, bytes(b)) for i, sid, b in rows if int(i) not in self.consumed_rows]


@dataclass(frozen=True, slots=True)
class TakeOver:
    """What :meth:`Fence.take_over` found (SPEC N2).

    Attributes:
        previous: the node that held the session (``None``: none since it was stored).
        epoch: this node's new token.
        kept: this node held it already, with the token before: its memory is current.
    """

    previous: str | None
    epoch: int
    kept: bool


def claim_all(db: psycopg.Connection[tuple[Any, ...]], node_id: str) -> dict[str, int]:
    """Make ``node_id`` the owner of every stored session, each epoch raised by one
    (SPEC N2, N4: a node that starts alone claims the work of the dead ones). Run it in
    the caller's transaction. The rows are locked ``FOR UPDATE``, as a take-over's are,
    so the claim waits for a commit still checking one of them (:meth:`Fence.check`); a
    plain ``UPDATE`` would not wait for its ``FOR KEY SHARE``. Lock and update are one
    statement, one snapshot: a row committed after the statement began (a session a
    node declared dead creates meanwhile) is neither locked nor claimed; as two
    statements, the ``UPDATE`` would raise such a row's epoch without the lock, and
    that node's next check would not wait for it.

    Returns:
        The claimed sessions and this node's new token of each.

    Raises:
        psycopg.Error: the database refused (a lock held past ``lock_timeout``).
    """
    claimed = db.execute(
        "WITH locked AS (SELECT session_id FROM sessions FOR UPDATE) "
        "UPDATE sessions s SET owner_node=%s, owner_epoch=s.owner_epoch+1 "
        "FROM locked WHERE s.session_id = locked.session_id "
        "RETURNING s.session_id, s.owner_epoch",
        (node_id,),
    ).fetchall()
    return {sid: int(epoch) for sid, epoch in claimed}
