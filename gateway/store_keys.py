"""The call-ledger keys a SQLite file may hold, in memory, so a new call id costs no read
(issue 13; SPEC I12, I15).

Every ``invoke`` of a call id the session has no record of asks the ledger whether the
principal used that id before (:meth:`gateway.ledger.CallLedger.check`). Almost every
such id is new, and on SQLite the answer was a primary-key read of ``call_ledger`` on the
event loop for every call (about 8 % of the loop's time under 50 sessions, measured).

:class:`LedgerKeys` is a Bloom filter (the ``rbloom`` package) over every key the file
may hold: those in it at open (after the journal's replay, which writes the rows it puts
back), and every key staged since. A key the filter has never seen is in no row, so the
store answers "no record" without reading; a key it may have seen (every key used
before, and about 1 % of the new ones) is read as before. Purged rows stay in the filter:
they only cost a read.

It is exact only while one store writes the file. A SQLite store is the only writer of
its file while it holds the journal's ``flock`` (:mod:`gateway.store_journal`), or when
the database is ``:memory:`` (private to its connection); without either the store does
not keep one and reads every key.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rbloom import Bloom

Key = tuple[str, str, str]
"""``(tenant, user, call_id)``, the ledger's primary key."""


@dataclass(slots=True)
class _Filter:
    bloom: Bloom
    size: int
    """Keys it is sized for at its rate."""
    keys: int = 0
    """Keys added (a key added twice counts twice)."""
    latest: float = 0.0
    """The newest ``created_at`` of the rows whose keys it took (Unix seconds)."""


class LedgerKeys:
    """A growing Bloom filter over ledger keys: no false negatives, about ``rate`` false
    positives per filter.

    Args:
        keys: the keys the file holds now.
        count: how many they are (sizes the first filter: twice that, at least
            ``first``).
        latest: the newest ``created_at`` among those rows (Unix seconds; 0 for none).
        first: the smallest filter, in keys.
        rate: the false-positive rate each filter is sized for (0 < rate < 1).

    When the newest filter has taken as many new keys as it was sized for, a new one
    takes the next keys, sized for twice the rows the file may hold now (at least
    ``first``): the rows at open, plus the new keys since, minus the rows purges deleted.
    A lookup asks each filter. A purge of the rows created before a time drops the
    filters whose every key is older (:meth:`expire`), so memory follows the rows the
    ledger keeps (``calls.call_id_window``), not every call since the start: about 1.2
    bytes per key at a rate of 1 % (``rbloom``'s optimal sizing), 80 KB for the first
    65,536, and a few filters of up to twice the ledger's rows.
    """

    def __init__(
        self,
        keys: Iterable[Key],
        count: int,
        latest: float = 0.0,
        *,
        first: int = 1 << 16,
        rate: float = 0.01,
    ) -> None:
        self._first = first
        self._rate = rate
        self._filters: list[_Filter] = []
        self._rows = count
        """The rows the file may hold: at open, plus new keys, minus purged rows."""
        newest = self._start(max(first, 2 * count))
        newest.bloom.update(keys)
        newest.keys, newest.latest = count, latest

    def _start(self, size: int) -> _Filter:
        self._newest = _Filter(Bloom(size, self._rate), size)
        self._filters.append(self._newest)
        return self._newest

    def add(self, key: Key, created_at: float, new: bool = True) -> None:
        """The file may hold a row of ``key`` created at ``created_at`` from now on (it
        was staged). ``new``: the row starts a call (``running``), so it counts as a row
        more; a later row of the same call (its end) replaces that one."""
        newest = self._newest
        if new:
            if newest.keys >= newest.size:
                newest = self._start(max(self._first, 2 * self._rows))
            newest.keys += 1
            self._rows += 1
        newest.bloom.add(key)
        if created_at > newest.latest:
            newest.latest = created_at

    def expire(self, before: float, deleted: int) -> None:
        """The file has no row created before ``before`` (a purge committed, deleting
        ``deleted`` rows): drop the filters, but the newest, whose every key's rows are
        older (a key used again since is in a newer filter too)."""
        self._rows = max(0, self._rows - deleted)
        self._filters = [f for f in self._filters if f is self._newest or f.latest >= before]

    def __contains__(self, key: Key) -> bool:
        """``False``: no row of the file has ``key``. ``True``: one may have."""
        return any(key in f.bloom for f in self._filters)

    @property
    def capacity(self) -> int:
        """The keys the filters are sized for, together (memory: about 1.2 bytes each)."""
        return sum(f.size for f in self._filters)

    @property
    def filters(self) -> int:
        """How many filters a lookup asks (one until the first has filled)."""
        return len(self._filters)
