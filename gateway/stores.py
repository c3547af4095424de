"""Which store a server uses: one config key decides (SPEC N1)."""

from __future__ import annotations

from pathlib import Path

from gateway.store import SqliteStore, Store


def open_store(url: str | None, sqlite_path: Path, ledger_window: float | None = None) -> Store:
    """The store ``store.url`` names (SPEC N1): :class:`~gateway.store_pg.PgStore` for a
    ``postgresql://`` URL, else the embedded :class:`~gateway.store.SqliteStore` at
    ``sqlite_path`` (``ledger_window``: ``calls.call_id_window`` in seconds, for its
    intent journal's replay).

    Raises:
        StoreError: the store cannot be opened (unreachable, damaged, schema too new,
            a SQLite file another store writes).
    """
    if url is None:
        return SqliteStore(sqlite_path, ledger_window=ledger_window)
    # Imported only when configured: psycopg adds about half a second to start-up.
    from gateway.store_pg import PgStore

    return PgStore(url)
