"""Which store a server uses: one config key decides (SPEC N1)."""

from __future__ import annotations

from pathlib import Path

from gateway.store import SqliteStore, Store


def open_store(url: str | None, sqlite_path: Path) -> Store:
    """The store ``store.url`` names (SPEC N1): :class:`~gateway.store_pg.PgStore` for a
    ``postgresql://`` URL, else the embedded :class:`~gateway.store.SqliteStore` at
    ``sqlite_path``.

    Raises:
        StoreError: the store cannot be opened (unreachable, damaged, schema too new).
    """
    if url is None:
        return SqliteStore(sqlite_path)
    # Imported only when configured: psycopg adds about half a second to start-up.
    from gateway.store_pg import PgStore

    return PgStore(url)
