"""The SQLite store's call-ledger keys in memory (SPEC I12, I15; issue 13;
``gateway/store_keys.py``).

A new call id is answered "no record" from a Bloom filter over every key the file may
hold, without reading the file; every key the filter may have seen is read as before.
Checked here on a real store, with SQLite's own statement trace: which lookups read the
file, that keys committed by an earlier store, staged, committed, or purged are answered
as the file says, and that a store that is not the file's only writer reads every key.
The put-back of a journaled call at open (its key is in the file, not staged) is
checked end to end by ``test_i15_a_call_killed_before_any_commit_comes_back_from_the_journal``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gateway.store import SqliteStore, StoreError
from gateway.store_journal import SUFFIX, encode_batch
from gateway.store_keys import LedgerKeys
from gateway.store_rows import LedgerRow


def _row(call_id: str, state: str = "running", created_at: float = 1.0) -> LedgerRow:
    outcome = None if state == "running" else b'{"type":"result"}'
    return LedgerRow("", "alice", call_id, "t", "h", state, outcome, created_at)


@contextmanager
def _ledger_reads(store: SqliteStore) -> Iterator[list[str]]:
    """The ledger reads the store's connection runs (SQLite's statement trace)."""
    reads: list[str] = []

    def seen(statement: str) -> None:
        if statement.startswith("SELECT") and "call_ledger" in statement:
            reads.append(statement)

    store._db.set_trace_callback(seen)
    try:
        yield reads
    finally:
        store._db.set_trace_callback(None)


def _lookup(store: SqliteStore, call_id: str) -> tuple[LedgerRow | None, int]:
    """The store's answer for alice's ``call_id``, and how many ledger reads it ran."""
    with _ledger_reads(store) as reads:
        row = store.ledger("", "alice", call_id)
    return row, len(reads)


def test_i12_a_new_call_id_is_answered_without_reading_the_file(tmp_path: Path) -> None:
    """A key never staged is answered from memory; a committed one is read (it is no
    longer staged) and comes back whole."""
    store = SqliteStore(tmp_path / "toolbus.db")
    try:
        store.stage_ledger(_row("c1", "done"))
        store.commit()
        assert _lookup(store, "new-call") == (None, 0)
        assert _lookup(store, "c1") == (_row("c1", "done"), 1)
    finally:
        store.close()


def test_i12_keys_committed_by_an_earlier_store_are_found(tmp_path: Path) -> None:
    """The filter is built from the file at open: a re-send after a restart finds the
    recorded outcome (SPEC I12)."""
    db = tmp_path / "toolbus.db"
    first = SqliteStore(db)
    first.stage_ledger(_row("c1", "done"))
    first.close()
    second = SqliteStore(db)
    try:
        assert second.ledger("", "alice", "c1") == _row("c1", "done")
        assert second.ledger("", "bob", "c1") is None
    finally:
        second.close()


def test_i12_a_staged_key_is_found_before_and_after_its_commit(tmp_path: Path) -> None:
    """Staged (the batch answers), journaled and still owed (the batch still answers),
    then committed (the file answers): the same row each time."""
    store = SqliteStore(tmp_path / "toolbus.db")
    try:
        store.stage_ledger(_row("c2"))
        assert store.ledger("", "alice", "c2") == _row("c2")
        assert store.journal() is True
        assert store.ledger("", "alice", "c2") == _row("c2")
        store.commit()
        assert store.ledger("", "alice", "c2") == _row("c2")
    finally:
        store.close()


def test_i12_a_purged_key_is_read_and_found_gone(tmp_path: Path) -> None:
    """A purge deletes rows; their keys stay in the filter and only cost a read."""
    store = SqliteStore(tmp_path / "toolbus.db")
    try:
        store.stage_ledger(_row("old", "done", created_at=1.0))
        store.commit()
        store.purge_ledger(before=2.0)
        assert _lookup(store, "old") == (None, 1)
    finally:
        store.close()


def test_i12_a_store_without_the_journal_lock_reads_every_key(tmp_path: Path) -> None:
    """Without the journal (here a device, which the store refuses) nothing makes this
    store the file's only writer: every lookup reads the file."""
    db = tmp_path / "toolbus.db"
    os.symlink("/dev/null", str(db) + SUFFIX)
    store = SqliteStore(db)
    try:
        assert _lookup(store, "new-call") == (None, 1)
    finally:
        store.close()


def test_i12_an_in_memory_store_keeps_its_keys(tmp_path: Path) -> None:
    """``:memory:`` is private to its connection: one writer, so the filter is exact."""
    store = SqliteStore(":memory:")
    try:
        store.stage_ledger(_row("c3", "done"))
        store.commit()
        assert _lookup(store, "c4") == (None, 0)
        assert _lookup(store, "c3") == (_row("c3", "done"), 1)
    finally:
        store.close()


def test_i12_the_filter_grows_with_no_false_negatives() -> None:
    """Past the first filter's size new ones take the keys, each sized for twice the
    keys kept: every key added is still found, and the keys never added are mostly
    answered absent."""
    keys = LedgerKeys(iter([("", "alice", "at-open")]), 1, 1.0, first=4)
    added = [("t", f"u{i % 7}", f"call-{i}") for i in range(1000)]
    for key in added:
        keys.add(key, 2.0)
    # Sized 4 (the key at open and 3 more), then twice the keys so far: 8, 24, 72, 216,
    # 648, 1,944 (4 + ... + 648 = 972 < 1,001 keys).
    assert keys.filters == 7
    assert ("", "alice", "at-open") in keys
    assert all(key in keys for key in added)
    others = [("t", "u0", f"other-{i}") for i in range(10_000)]
    false_positives = sum(key in keys for key in others)
    assert false_positives < 1000  # each filter about 1 %, seven of them


def test_i12_a_purge_drops_the_filters_of_rows_it_deleted() -> None:
    """Memory follows the rows the ledger keeps: once the file has no row created
    before a time, the filters whose every key is older go; the newest stays, and a key
    used again since is still found."""
    keys = LedgerKeys(iter([("", "alice", "old")]), 1, 10.0, first=2)
    keys.add(("", "alice", "old-2"), 11.0)  # fills the first filter (2 keys, latest 11)
    keys.add(("", "alice", "mid"), 20.0)  # a second filter, for 4 keys
    keys.add(("", "alice", "old"), 21.0)  # "old" used again: its new row is kept
    keys.add(("", "alice", "mid-2"), 22.0)
    keys.add(("", "alice", "mid-3"), 23.0)  # the second is full (latest 23)
    keys.add(("", "alice", "new"), 30.0)  # a third filter, the newest
    assert keys.filters == 3
    keys.expire(15.0, deleted=2)
    assert keys.filters == 2
    assert ("", "alice", "old") in keys
    assert ("", "alice", "mid") in keys
    assert ("", "alice", "new") in keys
    keys.expire(100.0, deleted=5)  # the newest is never dropped: it takes the next keys
    assert keys.filters == 1
    assert ("", "alice", "new") in keys
    assert sum(key in keys for key in [("", "alice", "mid"), ("", "alice", "old")]) < 2


def test_i12_lookups_after_a_committed_purge_answer_as_the_file_does(tmp_path: Path) -> None:
    """On the store: after a purge commits (it expires the filters it emptied), a
    deleted row's key is answered "no record" and a kept row is found."""
    store = SqliteStore(tmp_path / "toolbus.db")
    try:
        store.stage_ledger(_row("old", "done", created_at=1.0))
        store.stage_ledger(_row("kept", "done", created_at=5.0))
        store.commit()
        store.purge_ledger(before=2.0)
        assert store.ledger("", "alice", "old") is None
        assert store.ledger("", "alice", "kept") == _row("kept", "done", created_at=5.0)
    finally:
        store.close()


def test_i12_memory_follows_the_ledgers_rows_not_every_call() -> None:
    """A long-running server: 60,000 calls, each starting (`running`) and ending (a
    second row of the same key), with purges keeping the last 1,000 rows. New filters
    are sized from the rows the file may hold, so the capacity stays a few times the
    window's rows, not the calls since the start."""
    keys = LedgerKeys(iter([]), 0, 0.0, first=256)
    for n in range(1, 60_001):
        key = ("", "alice", f"c{n}")
        keys.add(key, float(n))
        keys.add(key, float(n), new=False)  # the call's end replaces its row
        if n % 1000 == 0 and n > 1000:
            keys.expire(float(n - 1000), deleted=1000)
    assert keys.capacity <= 8 * 1000
    assert keys.filters <= 4
    assert ("", "alice", "c60000") in keys


def test_i12_a_store_purging_its_ledger_keeps_a_bounded_filter(tmp_path: Path) -> None:
    """The same on a real store: rows staged and committed, the ledger purged to its
    last 1,000 rows each round (the purge's deleted rows counted from SQLite). A store
    opened on the file afterwards answers the same."""
    db = tmp_path / "toolbus.db"
    store = SqliteStore(db)
    try:
        n = 0
        for _ in range(100):
            for _ in range(1000):
                n += 1
                store.stage_ledger(_row(f"c{n}", "running", float(n)))
            store.commit()
            store.purge_ledger(before=float(n - 1000))
        keys = store._keys
        assert keys is not None
        # 100,000 calls, 1,000 rows kept: filters of the first size, never more than two
        assert keys.capacity <= 2 * (1 << 16)
        assert _lookup(store, f"c{n}") == (_row(f"c{n}", "running", float(n)), 1)
        assert _lookup(store, "c1")[0] is None
    finally:
        store.close()


def test_i12_two_paths_to_one_file_are_one_store(tmp_path: Path) -> None:
    """A symbolic link to the database is the same file: its journal (and the lock that
    makes a store the file's one writer) is named after the file the link names, so a
    second store through the link is refused (it could not see what the first holds)."""
    db = tmp_path / "toolbus.db"
    first = SqliteStore(db)
    try:
        os.symlink(db, tmp_path / "alias.db")
        with pytest.raises(StoreError, match="in use by another store"):
            SqliteStore(tmp_path / "alias.db")
    finally:
        first.close()
    through_link = SqliteStore(tmp_path / "alias.db")  # alone, it opens
    through_link.close()
    assert (tmp_path / ("toolbus.db" + SUFFIX)).exists()
    assert not os.path.lexists(tmp_path / ("alias.db" + SUFFIX))


def test_i12_a_journal_beside_a_link_stops_the_store(tmp_path: Path) -> None:
    """An earlier release kept the journal beside the path it was given, a link too:
    such a journal may hold sent events the file lacks, so the store does not open
    without it (SPEC D6) and names where it must go."""
    db = tmp_path / "toolbus.db"
    SqliteStore(db).close()
    os.symlink(db, tmp_path / "alias.db")
    (tmp_path / ("alias.db" + SUFFIX)).write_bytes(encode_batch(1, [("f", "s1", "c1")]))
    with pytest.raises(StoreError, match="a journal beside the link"):
        SqliteStore(tmp_path / "alias.db")


def test_d6_another_databases_journal_is_not_one_beside_a_link(tmp_path: Path) -> None:
    """(Found in review.) `x/link/../toolbus.db` is `y/toolbus.db` when `link` names
    `y/deep`: the kernel resolves the link before the `..`, and so does the store. It is
    no link, and `x/toolbus.db-intent` belongs to another database open in its own
    store: it does not stop this one."""
    (tmp_path / "x").mkdir()
    (tmp_path / "y" / "deep").mkdir(parents=True)
    os.symlink(tmp_path / "y" / "deep", tmp_path / "x" / "link")
    other = SqliteStore(tmp_path / "x" / "toolbus.db")
    try:
        other.stage_ledger(_row("c1"))
        assert other.journal() is True  # its journal holds an entry
        SqliteStore(str(tmp_path / "x" / "link" / ".." / "toolbus.db")).close()
    finally:
        other.close()
    assert (tmp_path / "y" / "toolbus.db").exists()


def test_d6_a_journal_beside_a_link_reached_through_dotdot_is_found(tmp_path: Path) -> None:
    """(Found in review.) `x/sub/../alias.db` is `other/alias.db` when `sub` names
    `other/d`, and that is a link to `real/db.sqlite`: the journal an earlier release
    kept at `other/alias.db-intent` stops the store."""
    for folder in ("real", "other/d", "x"):
        (tmp_path / folder).mkdir(parents=True)
    real = tmp_path / "real" / "db.sqlite"
    SqliteStore(real).close()
    os.symlink(real, tmp_path / "other" / "alias.db")
    os.symlink(tmp_path / "other" / "d", tmp_path / "x" / "sub")
    database = str(tmp_path / "x" / "sub" / ".." / "alias.db")
    left = tmp_path / "other" / ("alias.db" + SUFFIX)
    left.write_bytes(encode_batch(1, [("f", "s1", "c1")]))
    with pytest.raises(StoreError, match="a journal beside the link"):
        SqliteStore(database)


def test_d6_a_device_or_an_empty_file_beside_a_link_holds_nothing(tmp_path: Path) -> None:
    """(Found in review.) No release used a journal that is not a regular file, and an
    empty one holds nothing: neither beside a link stops the store."""
    db = tmp_path / "toolbus.db"
    SqliteStore(db).close()
    os.symlink(db, tmp_path / "alias.db")
    os.symlink("/dev/null", tmp_path / ("alias.db" + SUFFIX))
    SqliteStore(tmp_path / "alias.db").close()
    os.unlink(tmp_path / ("alias.db" + SUFFIX))
    (tmp_path / ("alias.db" + SUFFIX)).write_bytes(b"")
    SqliteStore(tmp_path / "alias.db").close()
