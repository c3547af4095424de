"""A mounted server's connection and tool list kept current (SPEC M2, C3): a failed
listing keeps the connection (``gateway/mcp/watch.py``), and every field toolbus derives
from the listing counts as a change (``gateway/mcp/server.py``)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR

from catalog.mcp_mounts import MountSpec
from catalog.model import Mode, ToolDef, Visibility
from gateway.mcp.server import _listed
from gateway.mcp.watch import watch
from tests.support import MS, WAIT

# -- the watch: a failed listing keeps the connection ------------------------------------


class _Client:
    protocol_version = "2025-11-25"


def _spec() -> MountSpec:
    timing = {"health_interval": 200 * MS, "backoff_initial": 5 * MS, "backoff_max": 20 * MS}
    return MountSpec(name="w", source="test", prefix="w_", capability="w", command="x", **timing)


async def _watched(failures: list[Any], lost: asyncio.Event) -> list[float]:
    """Run :func:`watch` with a ``refresh`` that raises ``failures`` in turn (an
    exception, or an exception class made then), then sets ``lost``; the loop's times
    of each listing, in seconds after the start."""
    relist = asyncio.Event()
    start = asyncio.get_running_loop().time()
    times: list[float] = []

    async def refresh(_client: Any) -> None:
        times.append(asyncio.get_running_loop().time() - start)
        if failures:
            failure = failures.pop(0)
            raise failure() if isinstance(failure, type) else failure
        lost.set()

    relist.set()
    async with asyncio.timeout(WAIT):
        await watch(_Client(), _spec(), lost, relist, refresh)  # type: ignore[arg-type]
    return times


async def test_m2_a_failed_listing_is_retried_with_backoff_on_the_same_connection() -> None:
    """SPEC M2: JSON-RPC error answers and a malformed listing keep the connection; the
    listing is tried again after backoff_initial, doubling, not after health_interval."""
    failures: list[Exception] = [MCPError(INTERNAL_ERROR, "busy"), ValueError("bad page")] * 2
    lost = asyncio.Event()
    times = await _watched(failures, lost)
    assert len(times) == 5
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap < 150 * MS for gap in gaps), gaps
    assert gaps[-1] >= 15 * MS, gaps  # 5, 10, 20, 20 ms: doubled, up to backoff_max


@pytest.mark.parametrize(
    "dead",
    [MCPError(CONNECTION_CLOSED, "Connection closed"), TimeoutError()],
    ids=["closed", "no-answer"],
)
async def test_m2_a_listing_the_transport_could_not_carry_ends_the_watch(dead: Exception) -> None:
    """SPEC M2: a listing cut off by the SDK's "connection closed", or unanswered within
    connect_timeout, is a dead server: the watch raises and the supervisor reconnects."""
    with pytest.raises(type(dead)):
        await _watched([dead], asyncio.Event())


async def test_m2_a_failed_listing_on_a_lost_connection_ends_the_watch() -> None:
    """SPEC M2: any failure of a listing once the transport is found dead reconnects."""
    lost = asyncio.Event()

    class Refused(Exception):
        def __init__(self) -> None:
            lost.set()  # the HTTP transport saw the refusal before the SDK's answer
            super().__init__("Server returned an error response")

    with pytest.raises(Refused):
        await _watched([Refused], lost)


# -- what counts as a change -------------------------------------------------------------


def test_m2_c3_every_listed_field_but_the_handler_is_a_change() -> None:
    """SPEC M1, M2, C3: a listing that changes any field toolbus derives from it
    (annotations included: idempotent, read_only, title) is republished; a new handler
    closure alone is not a change."""
    tool = ToolDef(name="w_a", description="d", parameters={"type": "object"}, capability="w",
                   mode=Mode.SYNC, func=lambda: None)  # fmt: skip
    changed = {
        bool: lambda v: not v,
        str: lambda v: f"{v}x",
        float: lambda v: (v or 0) + 1,
        dict: lambda v: {**v, "title": "x"},
        tuple: lambda v: (*v, "x"),
        Mode: lambda v: Mode.ASYNC,
        Visibility: lambda v: Visibility(sandbox_only=True),
    }
    assert _listed({"w_a": tool}) == _listed({"w_a": dataclasses.replace(tool, func=print)})
    for field in dataclasses.fields(ToolDef):
        if field.name == "func":
            continue
        value = getattr(tool, field.name)
        kind = next(k for k in changed if isinstance(value, k) or (value is None and k is str))
        if field.name in ("timeout", "promote_after"):
            kind = float
        other = dataclasses.replace(tool, **{field.name: changed[kind](value)})
        assert _listed({"w_a": other}) != _listed({"w_a": tool}), field.name
