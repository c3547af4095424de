"""The invoke rate of a session bounds every ``invoke`` (SPEC E2), whatever the answer:
a new call, an attach to another session's running call (I15), a duplicate, a conflict,
a re-send of a finished call (I12) or a call of a tool outside the catalog (C3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support import CONVERT, Peer, peer, running, settings_for

NOTE = {"title": "payroll", "body": "salaries 2027"}


async def _answer(p: Peer, request_id: str) -> str:
    """The answer to the ``invoke`` with ``id`` ``request_id``: an ``error`` reply's code,
    else the type of the first event naming its call (``tool_start`` excepted)."""
    while True:
        msg = await p.recv()
        if msg.get("id") == request_id and msg["type"] == "error":
            return str(msg["code"])
        if msg.get("call_id") == request_id and msg["type"] in ("result", "call.error"):
            return str(msg.get("code", msg["type"]))


async def test_e2_every_kind_of_invoke_takes_a_token(tmp_path: Path) -> None:
    """SPEC E2: ``invoke_burst`` 5 and a rate of ~0. Alice's session A holds ``n1``
    pending approval; her session B sends, as its first five invokes, an attach to
    ``n1``, the same again (``duplicate_call``), ``n1`` with other params
    (``call_id_conflict``), a new call ``x1`` (a result) and, once it finished, its
    re-send (the recorded result): each took a token, so the sixth, a new call, is
    refused ``rate_limited``."""
    limits = {"invoke_rate": 0.001, "invoke_burst": 5}
    settings = settings_for(tmp_path, limits=limits)
    async with (
        running(settings) as gw,
        peer(gw, options={"confirm_tool_calls": True}) as a,
        peer(gw) as b,
    ):
        await a.invoke("n1", "notes_create", NOTE)
        await a.expect("tool_start", call_id="n1")
        sent: list[tuple[str, str, dict[str, Any]]] = [
            ("n1", "notes_create", NOTE),
            ("n1", "notes_create", NOTE),
            ("n1", "notes_create", {**NOTE, "body": "other"}),
            ("x1", "convert_units", CONVERT),
        ]
        for index, (call_id, tool, params) in enumerate(sent):
            await b.invoke(call_id, tool, params, id=f"r{index}")
        answers = [await _answer(b, "r1"), await _answer(b, "r2"), await _answer(b, "x1")]
        await b.invoke("x1", "convert_units", CONVERT, id="r4")  # x1 has finished
        answers.append(await _answer(b, "x1"))
        await b.invoke("x2", "convert_units", CONVERT, id="r5")
        answers.append(await _answer(b, "r5"))
        assert answers == [
            "duplicate_call",
            "call_id_conflict",
            "result",
            "result",
            "rate_limited",
        ]


async def test_e2_calls_of_a_tool_outside_the_catalog_are_rate_limited(tmp_path: Path) -> None:
    """SPEC E2, C3: a ``readonly`` session's calls of ``notes_create`` (absent from its
    catalog, ``unknown_tool``) take tokens like any invoke: past ``invoke_burst`` 2 they
    are refused ``rate_limited``."""
    settings = settings_for(tmp_path, limits={"invoke_rate": 0.001, "invoke_burst": 2})
    async with running(settings) as gw, peer(gw, profile="readonly") as p:
        for index in range(4):
            await p.invoke(f"u{index}", "notes_create", NOTE)
        answers: dict[str, str] = {}
        while len(answers) < 4:  # a refusal is sent at once, a call's end after
            msg = await p.recv()
            call_id = (msg.get("details") or {}).get("call_id") or msg.get("call_id")
            if msg["type"] in ("error", "call.error") and call_id:
                answers[call_id] = msg["code"]
        assert [answers[f"u{index}"] for index in range(4)] == [
            "unknown_tool",
            "unknown_tool",
            "rate_limited",
            "rate_limited",
        ]
