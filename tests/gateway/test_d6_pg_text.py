"""Text a client or a handler chooses is kept by both stores alike (SPEC D6, N1, I9, I14,
J4, I1, N3): U+0000 in a call id that becomes a job, in a job's summary or failure
text, in an unknown tool's name, and in a call id whose ``call.cancel`` is routed to
another node. PostgreSQL ``TEXT`` cannot hold U+0000 (the SQLite store can: a value that
binds in SQLite must bind here too, D6), so those columns are UTF-8 ``BYTEA`` from schema
version 4 (``gateway/pg_schema.py``). Names that come from credentials (user, tenant,
profile; SPEC S2) are refused when they hold U+0000, on both stores alike. Each test runs
a real server on 127.0.0.1 with a real websockets client, on each store where it can."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.auth import hash_token
from gateway.config import Settings
from gateway.context import ToolContext
from gateway.server import Gateway
from gateway.tokenfile import TokenFileError, read_token_file
from tests.gateway.node_tools import nodes
from tests.pg_support import BACKENDS, pg_url  # noqa: F401 (fixture)
from tests.support import (
    JWT_SECRET,
    WAIT,
    Peer,
    make_jwt,
    own_catalog,
    peer,
    resume_fields,
    running,
    settings_for,
)

TOOLS = """
tools:
  - name: text_job
    description: An async job that answers the summary it is given, or raises the text.
    capability: t
    mode: async
    handler: tests.gateway.test_d6_pg_text:text_job
    parameters:
      type: object
      properties: {summary: {type: string}, fail: {type: string}}
      additionalProperties: false
  - name: promoted
    description: A sync call promoted to a job, answering once the test releases it.
    capability: t
    timeout: 0
    promote_after: 0.01
    handler: tests.gateway.test_d6_pg_text:promoted
    parameters: {type: object, additionalProperties: false}
  - name: quick
    description: Answers its call id at once.
    capability: t
    handler: tests.gateway.test_d6_pg_text:quick
    parameters: {type: object, additionalProperties: false}
"""
PROFILES = "profiles:\n  demo:\n    capabilities: [t]\n"

RELEASE = asyncio.Event()
"""Set by the test: :func:`promoted` answers (reset by :func:`serving`)."""
RUNS: list[str] = []
"""Call ids whose handler ran, in order."""


async def text_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    RUNS.append(ctx.call_id)
    if "fail" in params:
        raise RuntimeError(params["fail"])
    return {"summary": params.get("summary", "fine"), "call": ctx.call_id}


async def promoted(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    RUNS.append(ctx.call_id)
    await RELEASE.wait()
    return {"late": ctx.call_id}


async def quick(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    RUNS.append(ctx.call_id)
    return {"ran": ctx.call_id}


def _settings(tmp: Path, backend: str, url: str, **sections: Any) -> Settings:
    store = {"url": url} if backend == "postgresql" else {}
    return settings_for(tmp, catalog=own_catalog(tmp, TOOLS, PROFILES), store=store, **sections)


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[Gateway]:
    """A gateway on this module's catalog; its handlers' records reset."""
    global RELEASE
    RELEASE = asyncio.Event()
    RUNS.clear()
    async with running(settings) as gw:
        try:
            yield gw
        finally:
            RELEASE.set()


async def job_end(p: Peer, job_id: str) -> dict[str, Any]:
    """The one terminal job event of ``job_id`` (SPEC J4)."""
    async with asyncio.timeout(WAIT):
        while True:
            msg = await p.recv()
            if msg.get("job_id") == job_id and msg["type"] in (
                "job.done",
                "job.failed",
                "job.cancelled",
            ):
                return msg


async def first_of(p: Peer, *types: str) -> dict[str, Any]:
    """The next message of one of ``types``, to fail on an early one at once."""
    async with asyncio.timeout(WAIT):
        while True:
            msg = await p.recv()
            if msg["type"] in types:
                return msg


async def stored_jobs(settings: Settings) -> list[dict[str, Any]]:
    """``job.list`` of alice's jobs from a server started anew on the same store: what
    the store reads back, not what a running process remembers (SPEC J3, N1)."""
    async with serving(settings) as gw, peer(gw) as p:
        await p.send({"type": "job.list", "id": "l"})
        jobs: list[dict[str, Any]] = (await p.expect("jobs", id="l"))["jobs"]
        return jobs


@pytest.mark.parametrize("backend", BACKENDS)
async def test_d6_i9_an_async_call_whose_call_id_holds_nul_becomes_a_job(
    tmp_path: Path,
    backend: str,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC D6, I9, I15, J4: an async call whose ``call_id`` holds U+0000 is dispatched
    and its job ends ``job.done`` naming that call id, on both stores; a re-send gets
    the recorded ``dispatched`` without a second run, and the stored job reads back with
    its call id after a restart. On PostgreSQL before schema 4 (``jobs.call_id``
    ``TEXT``) the call ended ``handler_error`` "the call could not become a job"."""
    settings = _settings(tmp_path, backend, pg_url)
    call_id = "a\x00b"
    async with serving(settings) as gw, peer(gw) as p:
        await p.invoke(call_id, "text_job", {})
        dispatched = await p.terminal(call_id)
        assert dispatched["type"] == "dispatched", dispatched
        done = await job_end(p, dispatched["job_id"])
        assert (done["type"], done["call_id"], done["result"]) == (
            "job.done",
            call_id,
            {"call": call_id},
        )
        await p.invoke(call_id, "text_job", {})
        assert await p.terminal(call_id) == dispatched  # SPEC I12: recorded, not run
        assert RUNS.count(call_id) == len(RUNS) == 1
    (job,) = await stored_jobs(settings)
    assert (job["job_id"], job["call_id"], job["state"]) == (
        dispatched["job_id"],
        call_id,
        "done",
    )


@pytest.mark.parametrize("backend", BACKENDS)
async def test_d6_i14_a_promoted_call_whose_call_id_holds_nul_becomes_a_job(
    tmp_path: Path,
    backend: str,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC D6, I14: a sync call whose ``call_id`` holds U+0000, still running past its
    ``promote_after``, is promoted (``dispatched``, ``promoted: true``) and its result
    arrives as ``job.done``, on both stores. On PostgreSQL before schema 4 the promotion
    could not create the job row: ``call.error`` ``handler_error``, handler cancelled."""
    settings = _settings(tmp_path, backend, pg_url)
    call_id = "p\x00"
    async with serving(settings) as gw, peer(gw) as p:
        await p.invoke(call_id, "promoted", {})
        dispatched = await p.terminal(call_id)
        assert (dispatched["type"], dispatched.get("promoted")) == ("dispatched", True), dispatched
        RELEASE.set()
        done = await job_end(p, dispatched["job_id"])
        assert (done["type"], done["call_id"], done["result"]) == (
            "job.done",
            call_id,
            {"late": call_id},
        )
    (job,) = await stored_jobs(settings)
    assert (job["call_id"], job["state"]) == (call_id, "done")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_d6_j4_a_job_summary_holding_nul_is_stored_and_sent(
    tmp_path: Path,
    backend: str,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC D6, J4, J5: a handler's ``summary`` holding U+0000 ends the job ``job.done``
    with that summary, and the stored job reads it back after a restart, on both
    stores. On PostgreSQL before schema 4 (``jobs.summary`` ``TEXT``) the row could not be
    staged and the job never ended."""
    settings = _settings(tmp_path, backend, pg_url)
    summary = "x\x00y"
    async with serving(settings) as gw, peer(gw) as p:
        await p.invoke("c1", "text_job", {"summary": summary})
        dispatched = await p.terminal("c1")
        assert dispatched["type"] == "dispatched", dispatched
        done = await job_end(p, dispatched["job_id"])
        assert (done["type"], done["summary"]) == ("job.done", summary)
    (job,) = await stored_jobs(settings)
    assert (job["state"], job["summary"]) == ("done", summary)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_d6_j4_i16_a_job_that_raises_text_holding_nul_ends_failed(
    tmp_path: Path,
    backend: str,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC D6, J4, J5, I16: a job handler that raises with a message holding U+0000 ends
    ``job.failed`` with that text in its summary and error, stored, on both stores. On
    PostgreSQL before schema 4 its failed row (summary "text_job failed: ...") could not
    be staged and the job never ended."""
    settings = _settings(tmp_path, backend, pg_url)
    text = "bad\x00text"
    async with serving(settings) as gw, peer(gw) as p:
        await p.invoke("c1", "text_job", {"fail": text})
        dispatched = await p.terminal("c1")
        assert dispatched["type"] == "dispatched", dispatched
        failed = await job_end(p, dispatched["job_id"])
        assert failed["type"] == "job.failed", failed
        assert failed["error"]["code"] == "handler_error"
        assert text in failed["error"]["message"]
        assert failed["summary"] == f"text_job failed: {failed['error']['message']}"
    (job,) = await stored_jobs(settings)
    assert (job["state"], job["summary"]) == ("failed", failed["summary"])


@pytest.mark.parametrize("backend", BACKENDS)
async def test_d6_i1_an_invoke_of_a_tool_name_holding_nul_is_unknown_tool(
    tmp_path: Path,
    backend: str,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC D6, I1, I12, I15: an ``invoke`` whose tool name holds U+0000 is answered
    ``unknown_tool`` and the session keeps serving, on both stores; a re-send of its call
    id gets the same answer (the principal's ledger kept the name). On PostgreSQL before
    schema 4 (``call_ledger.tool`` ``TEXT``) the ledger row could not be staged and the
    socket closed 1011."""
    settings = _settings(tmp_path, backend, pg_url)
    async with serving(settings) as gw, peer(gw) as p:
        await p.invoke("u1", "no\x00such", {})
        unknown = await p.terminal("u1")
        assert (unknown["type"], unknown["code"], unknown["tool"]) == (
            "call.error",
            "unknown_tool",
            "no\x00such",
        )
        await p.invoke("u1", "no\x00such", {})
        assert await p.terminal("u1") == unknown
        await p.invoke("c2", "quick", {})
        assert (await p.terminal("c2"))["result"] == {"ran": "c2"}
    async with serving(settings) as gw, peer(gw) as q:
        # Another session of the principal, after a restart: the ledger's record.
        await q.invoke("u1", "no\x00such", {})
        again = await q.terminal("u1")
        assert (again["code"], again["tool"]) == ("unknown_tool", "no\x00such")
    assert not RUNS


# -- N3: several nodes (PostgreSQL only) ----------------------------------------------

SUB: Any = ["toolbus.v1"]


async def test_d6_n3_a_call_cancel_routed_to_another_node_reaches_a_call_id_holding_nul(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC D6, N3, I8: a call whose ``call_id`` holds U+0000 waits for approval on node
    A; its client resumes on node B and sends ``call.cancel``: the cancel is routed to A
    (``node_requests.target``), which ends the call (``tool.resolved`` ``cancelled``,
    ``call.error`` ``cancelled``), each once on B. Before schema 4 (``target`` ``TEXT``)
    B could not store the request and answered ``unknown_call``."""
    call_id = "c\x001"
    async with nodes(tmp_path, pg_url, "a", "b") as (a, b):
        async with connect(a.url, subprotocols=SUB) as ws_a:
            on_a = Peer(ws_a)
            await on_a.hello(options={"confirm_tool_calls": True})
            await on_a.invoke(call_id, "gated_job", {"dir": str(tmp_path)})
            start = await on_a.expect("tool_start", call_id=call_id)
        async with connect(b.url, subprotocols=SUB) as ws_b:
            on_b = Peer(ws_b)
            welcome = await on_b.hello(**resume_fields(on_a, start["seq"]))
            assert welcome["resumed"] is True
            await on_b.send({"type": "call.cancel", "id": "x", "call_id": call_id})
            resolved = await first_of(on_b, "tool.resolved", "error")
            assert resolved["type"] == "tool.resolved", resolved
            assert (resolved["approval_id"], resolved["resolution"], resolved["reason"]) == (
                start["approval_id"],
                "denied",
                "cancelled",
            )
            ended = await on_b.terminal(call_id)
            assert (ended["type"], ended["code"]) == ("call.error", "cancelled")
        assert not [msg for msg in on_b.seen if msg["type"] == "error"], on_b.seen
        assert [msg["type"] for msg in on_b.seen].count("tool.resolved") == 1


# -- S2: names from credentials ---------------------------------------------------------

NUL_CLAIMS = {
    "sub": {"sub": "a\x00b", "profiles": ["demo"]},
    "tenant": {"sub": "alice", "tenant": "t\x00", "profiles": ["demo"]},
    "profiles": {"sub": "alice", "profiles": ["demo", "p\x00q"]},
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("claim", sorted(NUL_CLAIMS))
async def test_d6_s2_a_jwt_naming_a_principal_or_profile_holding_nul_is_refused(
    tmp_path: Path,
    backend: str,
    claim: str,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC D6, S2, O5: a JWT whose ``sub``, ``tenant`` or a granted profile holds U+0000
    (they key the stored session, jobs and ledger) gets ``auth_failed`` and close 4003,
    on both stores alike; a good JWT is welcomed after it. Before, on PostgreSQL: the
    ``sub`` and the tenant were refused ``unavailable`` (close 1013, "try again later",
    for ever: the store could not be asked about the principal's sessions) and the
    profile closed the socket 1011; on SQLite all three were welcomed."""
    settings = _settings(tmp_path, backend, pg_url, auth={"jwt_secret": JWT_SECRET})
    claims = {**NUL_CLAIMS[claim], "exp": time.time() + 600}
    token = jwt.encode(claims, JWT_SECRET, "HS256")
    profile = "p\x00q" if claim == "profiles" else "demo"
    async with serving(settings) as gw:
        async with peer(gw, hello=False) as p:
            await p.send({"type": "hello", "token": token, "profile": profile})
            refused = await p.recv()
            assert (refused["type"], refused["code"]) == ("error", "auth_failed"), refused
            with pytest.raises(ConnectionClosed) as closed:
                await p.recv()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 4003
        good = make_jwt("alice", ["demo"], time.time() + 600)
        async with peer(gw, token=good) as q:
            assert q.welcome["user"] == "alice"


@pytest.mark.parametrize("key", ["user", "tenant", "profiles"])
def test_d6_s2_o5_a_token_file_naming_nul_is_refused_at_load(tmp_path: Path, key: str) -> None:
    """SPEC D6, S2, O5: a token file entry whose user, tenant or a profile holds U+0000 is
    refused when the file is read (``serve`` and ``check`` stop with this line; a hot
    reload keeps the previous tokens), naming the key. Before, it loaded, and such a
    session was welcomed on SQLite and refused ``unavailable`` (or closed 1011) on
    PostgreSQL."""
    entry: dict[str, Any] = {"sha256": hash_token("t"), "user": "u", "profiles": ["demo"]}
    entry[key] = ["demo", "p\x00q"] if key == "profiles" else "a\x00b"
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump({"tokens": [entry]}))
    with pytest.raises(TokenFileError) as info:
        read_token_file(path)
    assert str(info.value) == f"token file {path}: tokens.0.{key}: must not hold U+0000"
