"""Node ids on a shared PostgreSQL store (SPEC N2, N4): one id is one live process per
store, and a store is a schema, so two stores in one database may reuse ids."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.pg_link import redact
from tests.gateway.node_tools import START, node_config, nodes
from tests.pg_support import fresh_schema, pg_url  # noqa: F401 (fixture)
from tests.support import spawn_serve


async def test_n4_a_node_id_held_by_a_live_node_is_refused_with_one_line(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N4, O5: a second process with a live node's id would be taken for it (its
    lock says the first is alive): it exits 1 naming the id and the key to change."""
    (tmp_path / "twin").mkdir()
    async with nodes(tmp_path, pg_url, "a"):
        config = node_config(tmp_path / "twin", pg_url, "a")  # a data folder of its own
        twin = await spawn_serve("--config", str(config), stderr=asyncio.subprocess.PIPE)
        async with asyncio.timeout(START):
            _, err = await twin.communicate()
    assert twin.returncode == 1
    assert err.decode().splitlines()[-1] == (
        f"toolbus: cannot start: store {redact(pg_url)}: node id 'a' is in use by a "
        f"live node (nodes.node_id must differ per process)"
    )


async def test_n2_the_same_node_ids_serve_two_stores_in_one_database_at_once(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC N2, N4: node ``a`` on one schema and node ``a`` on another schema of the same
    database are two nodes of two stores (the lock of a node id names its schema): both
    start and serve."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    with fresh_schema() as other:
        async with (
            nodes(tmp_path / "one", pg_url, "a") as (first,),
            nodes(tmp_path / "two", other, "a") as (second,),
        ):
            assert first.url != second.url
            assert first.proc.returncode is None
            assert second.proc.returncode is None
