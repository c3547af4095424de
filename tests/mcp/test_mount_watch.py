"""A mounted server's connection and tool list kept current (SPEC M2, C3): every field
toolbus derives from the listing counts as a change (``gateway/mcp/server.py``)."""

from __future__ import annotations

import dataclasses

from catalog.model import Mode, ToolDef, Visibility
from gateway.mcp.server import _listed

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
