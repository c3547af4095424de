"""Attacks on SPEC I16 and E2: handler outputs the team's own cases did not try.

Each tool here returns or raises something odd (a value that refers to itself, an
integer too long for ``str``, a key whose ``repr`` raises, an exception whose ``str``
raises, a message larger than a frame). Whatever it is, the call (or job) must end in
exactly one typed terminal reply that fits ``max_message_bytes``, and the server must
keep serving others (a quick call on a second session answers afterwards).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.context import ToolContext
from gateway.server import Gateway
from protocol.codec import SERVER_MAX_DEPTH, decode_server, encode_json
from protocol.errors import DecodeError
from tests.support import Peer, own_catalog, peer, running, settings_for

TOOLS = """
tools:
  - name: odd
    description: Returns or raises the odd output named by its kind.
    capability: t.basic
    handler: tests.gateway.test_attacks_outputs:odd
    parameters:
      type: object
      properties:
        kind: {type: string}
      required: [kind]
  - name: odd_job
    description: The same, as an async job.
    capability: t.basic
    mode: async
    handler: tests.gateway.test_attacks_outputs:odd_job
    parameters:
      type: object
      properties:
        kind: {type: string}
      required: [kind]
  - name: chatty_job
    description: Reports progress with a text larger than a frame, then ends.
    capability: t.basic
    mode: async
    handler: tests.gateway.test_attacks_outputs:chatty_job
  - name: quick
    description: Answers at once.
    capability: t.basic
    handler: tests.gateway.test_attacks_outputs:quick
"""
PROFILES = """
profiles:
  demo:
    capabilities: [t.basic]
"""
MAX_FRAME = 4096
"""A small ``max_message_bytes`` so a "huge" text is cheap to build."""


class BadStr(Exception):
    """An exception whose ``str`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class BadRepr:
    """An object whose ``repr`` raises."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


def _cyclic() -> dict[str, Any]:
    value: dict[str, Any] = {"a": 1}
    value["self"] = value
    return value


def _cyclic_list() -> dict[str, Any]:
    items: list[Any] = []
    items.append(items)
    return {"items": items}


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"d": value}
    return value


def _raise(exc: BaseException) -> Any:
    raise exc


OUTPUTS: dict[str, Any] = {
    "cyclic": _cyclic,
    "cyclic_list": _cyclic_list,
    "long_int": lambda: {"n": 10**5000},
    # Encodable (orjson goes to 254 levels), but deeper than a client decodes.
    "deep": lambda: _deep(100),
    "bad_repr_key": lambda: {"m": {BadRepr(): 1}},
    "bad_str": lambda: _raise(BadStr()),
    "huge_raise": lambda: _raise(ValueError("x" * (4 * MAX_FRAME))),
}


def odd(params: dict[str, Any], ctx: ToolContext) -> Any:
    return OUTPUTS[params["kind"]]()


async def odd_job(params: dict[str, Any], ctx: ToolContext) -> Any:
    return OUTPUTS[params["kind"]]()


async def chatty_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    ctx.progress(0.5, "p" * (4 * MAX_FRAME))
    return {"summary": "done"}


def quick(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"ok": True}


@asynccontextmanager
async def serve(tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = settings_for(
        tmp_path,
        catalog=own_catalog(tmp_path, TOOLS, PROFILES),
        server={"port": 0, "heartbeat_interval": 0, "max_message_bytes": MAX_FRAME},
    )
    async with running(settings) as gw:
        yield gw


async def _still_serves(gw: Gateway) -> None:
    async with peer(gw, token="bob-token") as other:
        await other.invoke("q", "quick", {})
        assert (await other.terminal("q"))["type"] == "result"


def _fits(p: Peer) -> None:
    """Every frame the server sent fits the size it announced (SPEC E2)."""
    for message in p.seen:
        assert len(encode_json(message)) <= MAX_FRAME, message["type"]


@pytest.mark.parametrize("kind", sorted(OUTPUTS))
async def test_odd_sync_output_ends_the_call_once(tmp_path: Path, kind: str) -> None:
    """SPEC I16, E2: an odd value or raise ends a sync call in one ``handler_error`` that
    fits the frame; a re-send returns that same terminal; others are still served."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "odd", {"kind": kind})
        end = await p.terminal("c1")
        assert end["type"] == "call.error"
        assert end["code"] == "handler_error"
        await p.invoke("c1", "odd", {"kind": kind})
        again = await p.terminal("c1")
        assert again == end
        _fits(p)
        await _still_serves(gw)


@pytest.mark.parametrize("kind", sorted(OUTPUTS))
async def test_odd_job_output_ends_the_job_once(tmp_path: Path, kind: str) -> None:
    """SPEC I16, E2, J4: the same outputs from an async job end it in one ``job.failed``
    ``handler_error`` that fits the frame; others are still served."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("j1", "odd_job", {"kind": kind})
        dispatched = await p.terminal("j1")
        assert dispatched["type"] == "dispatched"
        failed = await p.expect("job.failed", job_id=dispatched["job_id"])
        assert failed["error"]["code"] == "handler_error"
        _fits(p)
        await _still_serves(gw)


async def test_huge_progress_text_fits_the_frame(tmp_path: Path) -> None:
    """SPEC E2, J2: a job's progress text larger than ``max_message_bytes`` is cut so
    that its ``job.progress`` frame fits (before: a 16 KB frame under a 4 KB bound)."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("j1", "chatty_job", {})
        dispatched = await p.terminal("j1")
        job_id = dispatched["job_id"]
        progress = await p.expect("job.progress", job_id=job_id)
        assert progress["message"].startswith("ppp")
        assert progress["message"].endswith("…")
        await p.expect("job.done", job_id=job_id)
        _fits(p)


async def test_result_at_the_client_depth_limit_is_sent_and_decodes(tmp_path: Path) -> None:
    """SPEC I16: the depth bound is exact: a result nested ``SERVER_MAX_DEPTH - 1``
    levels (its frame: ``SERVER_MAX_DEPTH``) is a ``result`` the client codec accepts;
    one level more is ``handler_error`` (the parametrized ``deep`` case)."""
    OUTPUTS["at_limit"] = lambda: _deep(SERVER_MAX_DEPTH - 2)
    try:
        async with serve(tmp_path) as gw, peer(gw) as p:
            await p.invoke("c1", "odd", {"kind": "at_limit"})
            end = await p.terminal("c1")
            assert end["type"] == "result"
            assert not isinstance(decode_server(encode_json(end)), DecodeError)
    finally:
        del OUTPUTS["at_limit"]
