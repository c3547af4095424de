"""A sync call's value is encoded once on its way out, and nothing a user sees changes
(SPEC I8, I11, I16, D1; issue 13).

``CallEnd`` encodes a plain object value once and splices the bytes into the ``result``
frame; anything else takes the model's path. These pin the cases a review found where
the two could differ: a dataclass (pydantic dumps its declared fields, orjson its
attributes) and a handler that changes its own params (the audit record is cut to
``calls.audit_param_bytes`` whatever size the params had at admission).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gateway.context import ToolContext
from tests.gateway.tools_for_tests import audit_records
from tests.support import own_catalog, peer, running, settings_for

TOOLS = """
tools:
  - name: with_dataclass
    description: Returns a dataclass inside its result.
    capability: t.basic
    handler: tests.gateway.test_i16_result_encoded_once:with_dataclass
  - name: plain
    description: Returns a plain object.
    capability: t.basic
    handler: tests.gateway.test_i16_result_encoded_once:plain
  - name: grows_params
    description: Adds a key to its own params.
    capability: t.basic
    handler: tests.gateway.test_i16_result_encoded_once:grows_params
    parameters:
      type: object
      properties:
        note: {type: string}
"""
PROFILES = """
profiles:
  demo:
    capabilities: [t.basic]
"""


@dataclasses.dataclass
class Item:
    name: str = "n"
    _etag: str = "e1"
    derived: int = dataclasses.field(default=3, init=False)

    def __post_init__(self) -> None:
        self.cache = "internal"


async def with_dataclass(params: dict[str, Any], ctx: ToolContext) -> Any:
    return {"item": Item(), "items": [Item(name="m")]}


async def plain(params: dict[str, Any], ctx: ToolContext) -> Any:
    return {"text": 'a "{[null]}" b', "n": [1, 2.5, None, True], "deep": {"x": {"y": []}}}


async def grows_params(params: dict[str, Any], ctx: ToolContext) -> Any:
    params["blob"] = "x" * 500
    return {"ok": True}


async def test_i16_a_dataclass_in_a_result_is_sent_by_its_declared_fields(tmp_path: Path) -> None:
    """SPEC I16, D1: a dataclass inside a value is sent as pydantic dumps it, by its
    declared fields (``_etag`` and ``derived`` included), never by its attributes (the
    ``cache`` set in ``__post_init__`` stays out). A plain value's frame is unchanged."""
    settings = settings_for(tmp_path, catalog=own_catalog(tmp_path, TOOLS, PROFILES))
    async with running(settings) as gw, peer(gw) as p:
        await p.invoke("c1", "with_dataclass", {})
        frame = await p.terminal("c1")
        await p.invoke("c2", "plain", {})
        plain_frame = await p.terminal("c2")
    declared = {"name": "n", "_etag": "e1", "derived": 3}
    assert frame["type"] == "result"
    assert frame["result"] == {"item": declared, "items": [{**declared, "name": "m"}]}
    assert plain_frame["result"] == {
        "text": 'a "{[null]}" b',
        "n": [1, 2.5, None, True],
        "deep": {"x": {"y": []}},
    }
    assert (plain_frame["declined"], plain_frame["replaced"]) == (False, False)


async def test_i11_a_handler_that_grows_its_params_gets_an_audit_record_cut_to_the_limit(
    tmp_path: Path,
) -> None:
    """SPEC I11: the audit record's params are cut to ``calls.audit_param_bytes`` as they
    are when the call ends, even when the handler made them larger after admission."""
    settings = settings_for(
        tmp_path,
        catalog=own_catalog(tmp_path, TOOLS, PROFILES),
        calls={"audit_param_bytes": 64},
    )
    with audit_records() as records:
        async with running(settings) as gw, peer(gw) as p:
            await p.invoke("c1", "grows_params", {"note": "hi"})
            assert (await p.terminal("c1"))["result"] == {"ok": True}
    (record,) = [r for r in records if r["call_id"] == "c1"]
    assert record["params"] == '{"note":"hi","blob":"' + "x" * 43 + "..."
