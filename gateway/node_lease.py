"""A node's liveness lease and its notification thread (SPEC N2, N3, N4).

:class:`NodeLease` is the part of :class:`gateway.nodes.Node` that talks to the other
nodes through PostgreSQL: it registers the node (atomically with the check for other
live nodes), holds the node's advisory lock on a connection of its own for the process's
life, renews the lease every ``nodes.lease_interval`` seconds to ``nodes.lease_ttl``
seconds ahead of the database's clock, and ``LISTEN``s for notifications. All of it on
one thread; what the loop must do is handed to it (the event loop never waits here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from gateway.config import NodesConfig
from gateway.pg_fence import CHANNEL, Fence, claim_all
from gateway.store import StoreError
from gateway.store_pg import PgStore

logger = logging.getLogger("gateway.nodes")

_START_LOCK = 0x746F6F6C6E6F6465  # "toolnode": registration and the "alone" check, atomic
_LOCK_PREFIX = "toolbus node "
"""Prefix of a node's advisory lock name, held by its lease connection (SPEC N4)."""

_LOCK = "hashtextextended(%s || current_schema() || ' ' || %s, 0)"
"""A node's advisory lock key. Advisory locks are the database's, not a schema's: the
store's schema is part of the name, so gateways on two schemas of one database (two
deployments, or parallel tests) may use the same node ids."""


def gone(db: psycopg.Connection[tuple[Any, ...]], node: str) -> bool:
    """Whether no live connection holds ``node``'s lock: its process is gone (a crash
    drops its connections, and the lock, at once; a lease outlives it by up to its TTL)."""
    row = db.execute(f"SELECT pg_try_advisory_lock({_LOCK})", (_LOCK_PREFIX, node)).fetchone()
    if not (row and row[0]):
        return False
    db.execute(f"SELECT pg_advisory_unlock({_LOCK})", (_LOCK_PREFIX, node))
    return True


class NodeLease:
    """The lease and notification thread of one node (SPEC N4, N3).

    Args:
        node_id: this node's id.
        config: the ``nodes`` section (lease interval and TTL).
        store: the shared store (its link; registration runs on its connection).
        fence: this node's fencing tokens; registration fills them when alone, and a lost
            lease marks it dead (SPEC N2, N4).
        tick: called on the loop every lease interval (the safety net, SPEC N3, N4).
        notified: called on the loop with each notification's payload.
        declared_dead: called on the loop once another node claimed this one (SPEC N4).
    """

    def __init__(
        self,
        node_id: str,
        config: NodesConfig,
        store: PgStore,
        fence: Fence,
        tick: Callable[[], None],
        notified: Callable[[str], None],
        declared_dead: Callable[[], None],
    ) -> None:
        self.id = node_id
        self.config = config
        self._store = store
        self._fence = fence
        self._tick = tick
        self._notified = notified
        self._declared_dead = declared_dead
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lease_db: psycopg.Connection[tuple[Any, ...]] | None = None
        self._renewed = 0.0  # monotonic time of the last renewal that succeeded
        self._back_at: float | None = None
        """Monotonic time this node got the database back after losing it (a failed
        renewal, a broken lease connection, or renewals more than ``lease_ttl`` apart);
        ``None`` while it never lost it since start."""

    def judging(self) -> bool:
        """Whether this node may now judge other nodes dead (SPEC N4, N7): only once it
        has itself been in touch with the database for ``lease_ttl`` seconds since it last
        got it back. Another node's lease that expired while this node could not reach
        the database either (a database restart, a network outage) is no death: the
        other node had no chance to renew, and gets ``lease_ttl`` to do it."""
        back = self._back_at
        return back is None or time.monotonic() - back >= self.config.lease_ttl

    def register(self) -> bool:
        """Write this node's lease; ``True`` when no other node holds a live one (then this
        node has claimed every stored session, for the start-up recovery). Called once,
        before serving.

        Raises:
            StoreError: the store cannot be reached (SPEC O5).
        """
        try:
            return self._register()
        except psycopg.Error as exc:
            where = self._store.link.where
            raise StoreError(f"store {where}: node registration failed: {exc}") from exc

    def _register(self) -> bool:
        self._lease_db = self._connect()
        db = self._store.link.conn()
        self._wait_for_renewals(db)
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (_START_LOCK,))
            others = db.execute(
                "SELECT node_id, lease_until > extract(epoch FROM clock_timestamp()) "
                "FROM nodes WHERE node_id<>%s",
                (self.id,),
            ).fetchall()
            dead = [node for node, leased in others if not leased or gone(db, node)]
            db.execute("DELETE FROM nodes WHERE node_id = ANY(%s)", (dead,))
            self._renew(db)
            alone = len(dead) == len(others)
            if alone:
                self._fence.epochs.update(claim_all(db, self.id))
        logger.info("node %s registered (alone=%s)", self.id, alone)
        return alone

    def _wait_for_renewals(self, db: psycopg.Connection[tuple[Any, ...]]) -> None:
        """If the database itself (re)started less than ``lease_ttl`` seconds ago and
        another node looks dead (lease expired, or lock free), wait until the database has
        been up for ``lease_ttl`` before judging it: a live node that lost its connection
        (and its lock) in the restart renews by then (SPEC N4, N7). Measured on the
        database's clock."""
        with db.transaction():
            row = db.execute(
                "SELECT %s - extract(epoch FROM clock_timestamp() - pg_postmaster_start_time())",
                (self.config.lease_ttl,),
            ).fetchone()
            early = float(row[0]) if row else 0.0
            others = db.execute(
                "SELECT node_id, lease_until > extract(epoch FROM clock_timestamp()) "
                "FROM nodes WHERE node_id<>%s",
                (self.id,),
            ).fetchall()
            doubt = early > 0 and any(not leased or gone(db, node) for node, leased in others)
        if doubt:
            logger.info(
                "node %s: the database started less than nodes.lease_ttl ago; waiting %.1f s "
                "for the other nodes to renew before judging them",
                self.id,
                early,
            )
            time.sleep(early)

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        """The lease connection: it holds this node's advisory lock for its life, which
        tells the other nodes at once that this process is alive (a killed process's
        connection, and lock, go with it), and it listens on :data:`CHANNEL`.

        Raises:
            psycopg.Error: no connection; StoreError: another live process has this id.
        """
        db = psycopg.connect(self._store.link.conninfo, autocommit=True)
        row = db.execute(
            f"SELECT pg_try_advisory_lock({_LOCK})", (_LOCK_PREFIX, self.id)
        ).fetchone()
        if not (row and row[0]):
            db.close()
            raise StoreError(
                f"store {self._store.link.where}: node id {self.id!r} is in use by a live "
                f"node (nodes.node_id must differ per process)"
            )
        db.execute(f"LISTEN {CHANNEL}")
        return db

    def _renew(self, db: psycopg.Connection[tuple[Any, ...]]) -> None:
        db.execute(
            "INSERT INTO nodes (node_id, lease_until, started_at) VALUES (%s, "
            "extract(epoch FROM clock_timestamp()) + %s, extract(epoch FROM clock_timestamp())) "
            "ON CONFLICT (node_id) DO UPDATE SET lease_until = EXCLUDED.lease_until",
            (self.id, self.config.lease_ttl),
        )

    def start(self) -> None:
        """Start the lease and notification thread (call on the running loop)."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="toolbus-node", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop renewing and close the lease connection: its lock goes, so the node is
        known gone at once, and a live node claims what the drain left (calls still
        running, SPEC N4) as it would a dead node's."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            # Wake the thread from its wait for notifications (up to one interval).
            with contextlib.suppress(StoreError):
                self._store.link.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"stop {self.id}"))
            await asyncio.to_thread(thread.join, self.config.lease_interval + 5.0)
        db, self._lease_db = self._lease_db, None
        if db is not None:  # registered, never started (a start-up that failed later)
            db.close()

    def _run(self) -> None:
        """The thread: renew the lease, wait for notifications up to one interval, again."""
        db, self._lease_db = self._lease_db, None
        interval = self.config.lease_interval
        while not self._stop.is_set():
            try:
                if db is None or db.closed or db.broken:
                    db = self._connect()
                if not self._kept(db):
                    self._fence.dead = True  # SPEC N4: from now on, no commit writes
                    self.call(self._declared_dead)
                    break
                now = time.monotonic()
                late = self._renewed and now - self._renewed > self.config.lease_ttl
                if late or self._back_at == float("inf"):
                    self._back_at = now  # back after being out of touch (SPEC N7)
                self._renewed = now
                self.call(self._tick)  # the safety net (SPEC N3)
                for note in db.notifies(timeout=interval):
                    self.call(self._notified, note.payload)
                    if self._stop.is_set():
                        break
            except (psycopg.Error, StoreError) as exc:
                logger.warning("node %s: lease or listen failed: %s", self.id, exc)
                db = None
                self._back_at = float("inf")  # no judging until back, then lease_ttl more
                self._stop.wait(interval)
        if db is not None:
            db.close()  # the lock goes with it: a live node claims what is left (SPEC N4)

    def _kept(self, db: psycopg.Connection[tuple[Any, ...]]) -> bool:
        """Renew the lease; ``False`` when the row is gone: another node found this one
        dead (its lease expired: a frozen process, a partition) and claimed its work."""
        row = db.execute(
            "UPDATE nodes SET lease_until = extract(epoch FROM clock_timestamp()) + %s "
            "WHERE node_id=%s RETURNING node_id",
            (self.config.lease_ttl, self.id),
        ).fetchone()
        return row is not None

    def call(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop, from any thread; dropped once the loop closed."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            # RuntimeError: the loop closed meanwhile; the process is stopping.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(fn, *args)
