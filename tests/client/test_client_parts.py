"""The client is a composition of parts (issue 9): each part works from what it is given."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest

from protocol import messages as m
from toolbus.client import Client
from toolbus.client_approvals import Approvals
from toolbus.client_calls import Calls
from toolbus.client_inbound import Inbound
from toolbus.client_jobs import KEEP_OUTCOMES, Jobs
from toolbus.client_link import Link
from toolbus.handles import Backoff, JobOutcome

TOOLBUS = Path(__file__).resolve().parents[2] / "toolbus"


def test_no_stub_is_left_in_the_client() -> None:
    """Issue 9: no toolbus module raises NotImplementedError (a layer's stub)."""
    stubs = []
    for path in sorted(TOOLBUS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and "NotImplementedError" in ast.unparse(node):
                stubs.append(f"{path.name}:{node.lineno}")
    assert stubs == []


def test_handles_do_not_know_the_client() -> None:
    """SPEC K1: handles and requests act through the part that made them, so
    toolbus/handles.py imports no client module."""
    tree = ast.parse((TOOLBUS / "handles.py").read_text(encoding="utf-8"))
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not {name for name in imported if name.startswith("toolbus.client")}


def test_parts_are_held_not_inherited() -> None:
    """Issue 9: the parts are attributes of a Client, not its bases."""
    assert not {Calls, Jobs, Approvals, Inbound, Link} & set(Client.__mro__)


def test_every_server_message_has_a_handler() -> None:
    """SPEC K1: the inbound table covers every server message class but ``welcome``,
    which only the handshake reads; a new server message fails here until handled."""
    assert set(m.SERVER_TYPES) - set(Inbound.HANDLERS) == {m.Welcome}


async def _never(job_id: str) -> m.JobInfo:
    raise AssertionError(f"job.get {job_id} not expected")


async def _never_cancel(job_id: str, _limit: float | None) -> m.JobInfo:
    raise AssertionError(f"job.cancel {job_id} not expected")


def _outcome(job_id: str) -> JobOutcome:
    return JobOutcome(job_id=job_id, tool="t", state=m.JobState.DONE, summary="ok")


async def test_jobs_part_resolves_a_late_handle_from_a_kept_outcome() -> None:
    """SPEC I12: a recorded ``dispatched`` arriving after its job ended gets a resolved
    handle; only the last KEEP_OUTCOMES outcomes are kept."""
    tasks: list[Any] = []
    jobs = Jobs(_never, _never_cancel, tasks.append, Backoff(), lambda: True)
    for n in range(KEEP_OUTCOMES + 1):
        jobs.ended(_outcome(f"j{n}"))
    late = jobs.dispatched(m.Dispatched(call_id="c", job_id="j1", tool="t", message="m"))
    assert late.done()
    assert (await asyncio.wait_for(late.result(), 1)).job_id == "j1"
    evicted = jobs.dispatched(m.Dispatched(call_id="c0", job_id="j0", tool="t", message="m"))
    assert not evicted.done()
    assert tasks == []


def test_k1_invoke_frame_is_the_bytes_encode_writes() -> None:
    """SPEC K1, E1 (issue 13): the calls part writes an ``invoke`` from its fields, not
    through ``model_dump``; every shape gives the bytes ``protocol.codec.encode`` gives,
    and a ``params`` value the JSON encoder refuses as it is (a model) goes through it."""
    from protocol.codec import encode
    from toolbus.client_calls import frame_of

    shapes = [
        m.Invoke(call_id="c1", tool="noop"),
        m.Invoke(call_id="c1", tool="noop", params={}),
        m.Invoke(
            id="r7",
            call_id="c-ü",
            tool="t",
            params={"a": None, "b": [1, 2.5, "x", {"c": None}], "é": True},
            catalog_version="v1",
        ),
        m.Invoke(call_id="c2", tool="t", params={"model": m.Ack(seq=3), "t": (1, 2)}),
    ]
    for message in shapes:
        assert frame_of(message) == encode(message)
    assert frame_of(shapes[3]) == (
        b'{"type":"invoke","call_id":"c2","tool":"t","params":{"model":{"type":"ack","seq":3},'
        b'"t":[1,2]}}'
    )
    ack = m.Ack(seq=5)
    assert frame_of(ack) == encode(ack) == b'{"type":"ack","seq":5}'


def test_i15_default_call_ids_are_unique_and_sort_in_the_order_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SPEC I12, I15: the client's default ids sort in the order of the clock they were
    made by (the server's call-id indexes then grow at their end, issue 13) and never
    repeat, also when many are made within one clock tick or the clock steps back."""
    from toolbus import client

    ticks = iter([5, 5, 6, 2**40, 2**40 + 1] + [3] * 1_000)
    monkeypatch.setattr(client.time, "time_ns", lambda: next(ticks))
    ids = [client.new_call_id() for _ in range(1_005)]
    assert len(set(ids)) == len(ids)  # the random part: also within one tick, or back
    assert ids[1:5] == sorted(ids[1:5])  # a later clock sorts later (ids[0]: the same tick)
    assert ids[5] < ids[4]  # a clock that stepped back sorts back; still unique
    assert all(len(i) == 35 and i.startswith("c-") for i in ids)
    assert ids[2][:19] == "c-0000000000000006-"
