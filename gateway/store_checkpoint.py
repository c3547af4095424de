"""WAL checkpoints of the SQLite store, off the event loop (SPEC D1, D6).

Checkpoints fsync; run inline by SQLite they were a third of the commit cost. The
:class:`Checkpointer` thread copies the WAL into the database file on its own connection
so that commits on the event loop stay short appends to the WAL
(:class:`gateway.store.SqliteStore`).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading

logger = logging.getLogger("gateway.store")


class Checkpointer:
    """Copies the WAL into the database file every ``interval`` seconds, on its own
    thread and connection (``PRAGMA wal_checkpoint(PASSIVE)``: it never blocks writers).

    Args:
        path: the database file.
        interval: seconds between two checkpoints.

    The thread starts at once; :meth:`stop` ends it after a last full checkpoint.
    """

    def __init__(self, path: str, interval: float) -> None:
        self._path = path
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolbus-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        db = sqlite3.connect(self._path, isolation_level=None)
        failing = False
        try:
            while not self._stop.wait(self._interval):
                # A full disk or an I/O error fails a checkpoint; the WAL keeps the data
                # and the next one catches up. The thread must not die of it (SPEC D6).
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as exc:
                    if not failing:
                        logger.warning("%s: checkpoint failed, will retry: %s", self._path, exc)
                    failing = True
                    continue
                failing = False
            with contextlib.suppress(sqlite3.Error):
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()

    def stop(self) -> None:
        """Run a last full checkpoint and end the thread."""
        self._stop.set()
        self._thread.join()


def start_checkpoints(
    db: sqlite3.Connection, path: str, interval: float, wal_pages: int
) -> Checkpointer:
    """Bound the WAL of ``db`` (the store's connection to ``path``) and start the
    :class:`Checkpointer` thread, a checkpoint every ``interval`` seconds.

    Checkpoints (which fsync) leave the event loop for a thread of their own; they were a
    third of the commit cost when SQLite ran them inline. The thread's PASSIVE
    checkpoints cannot restart the WAL while writes keep landing; a rare inline
    checkpoint past ``wal_pages`` pages of 4 KiB, run between two commits, can. By then
    the thread has copied most frames, so it is cheap, and the WAL stays bounded.
    """
    db.execute(f"PRAGMA wal_autocheckpoint={wal_pages}")
    db.execute(f"PRAGMA journal_size_limit={wal_pages * 4096}")
    return Checkpointer(path, interval)
