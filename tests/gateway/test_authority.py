"""Authority re-checked after every wait, and credentials with a lifetime (SPEC A7, S6).

Cases F17 (context removed while an approval is pending), F19 (a JWT that expires on
an open socket; a resume whose credential no longer grants the profile) and F26 (a
refusal never tells whether another user's id exists), plus the hot-reload forms of
A7/S6: a profile that loses a capability, a token removed from the token file.
Real server, real sockets; every wait is on a message or a close, never a sleep.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import yaml
from websockets.exceptions import ConnectionClosed

from gateway.auth import Identity, hash_token, version_of
from gateway.context import ToolContext
from gateway.server import Gateway
from tests.gateway import edge_tools as et
from tests.gateway import tools_for_tests as tt
from tests.gateway.thread_tools import RUNS
from tests.support import (
    JWT_SECRET,
    MS,
    WAIT,
    Peer,
    closed,
    dropped,
    make_jwt,
    park_signal,
    peer,
    resume_fields,
    running,
    settings_for,
)

TOOLS = """
tools:
  - name: proj_delete
    description: Delete the linked project.
    capability: proj
    requires_approval: true
    handler: tests.gateway.tools_for_tests:echo
    visibility:
      requires_context: [project_id]
  - name: gated
    description: Needs the user's approval.
    capability: gate
    requires_approval: true
    handler: tests.gateway.tools_for_tests:echo
  - name: wipe
    description: Dangerous and gated.
    capability: gate
    dangerous: true
    requires_approval: true
    handler: tests.gateway.tools_for_tests:echo
  - name: quick
    description: Answers at once.
    capability: proj
    handler: tests.gateway.tools_for_tests:echo
  - name: block
    description: A plain handler that holds its worker thread until released.
    capability: proj
    timeout: 0
    handler: tests.gateway.tools_for_tests:blocking
  - name: proj_plain
    description: A plain handler that needs a linked project.
    capability: proj
    handler: tests.gateway.tools_for_tests:scalar
    visibility:
      requires_context: [project_id]
  - name: hold_job
    description: A job that waits for the test to release its key.
    capability: jobs
    mode: async
    handler: tests.gateway.tools_for_tests:hold
    parameters:
      type: object
      properties: {key: {type: string}}
      required: [key]
  - name: proj_job
    description: A job that needs a linked project.
    capability: jobs
    mode: async
    handler: tests.gateway.tools_for_tests:hold
    visibility:
      requires_context: [project_id]
    parameters:
      type: object
      properties: {key: {type: string}}
      required: [key]
"""

PROFILES: dict[str, Any] = {
    "profiles": {
        "demo": {"capabilities": ["proj", "gate", "jobs"], "allow_dangerous": ["wipe"]},
        "readonly": {"capabilities": ["proj"]},
    }
}


def write_yaml(path: Path, profiles: dict[str, Any]) -> None:
    """Write a YAML file and move its mtime on, so a poll sees the change."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(yaml.safe_dump(profiles))
    stamp = max(before + 10_000_000, path.stat().st_mtime_ns)
    os.utime(path, ns=(stamp, stamp))


@asynccontextmanager
async def serve(tmp: Path, **sections: Any) -> AsyncIterator[Gateway]:
    """A gateway on this module's catalog (SPEC A7 tests); ``sections`` override settings."""
    tt.reset()
    tools, profiles = tmp / "tools.yaml", tmp / "profiles.yaml"
    tools.write_text(TOOLS)
    write_yaml(profiles, PROFILES)
    catalog = {"tools": [tools], "profiles": [profiles], **sections.pop("catalog", {})}
    settings = settings_for(tmp, catalog=catalog, **sections)
    async with running(settings) as gw:
        try:
            yield gw
        finally:
            tt.STATE.release.set()
            for event in tt.STATE.job_release.values():
                event.set()


def jwt_auth(**extra: Any) -> dict[str, Any]:
    return {"jwt_secret": JWT_SECRET, **extra}


async def gated_start(p: Peer, call_id: str, tool: str = "gated") -> str:
    """Invoke a gated tool; its approval id once ``tool_start`` arrived (SPEC A2)."""
    await p.invoke(call_id, tool, {})
    start = await p.expect("tool_start", call_id=call_id)
    approval_id: str = start["approval_id"]
    return approval_id


async def seen_or_expect(p: Peer, type_: str, **fields: Any) -> dict[str, Any]:
    """The first message of ``type_`` with ``fields``, already received or still to come
    (an ``auth.expiring`` may arrive while the test waits for something else)."""
    for message in p.seen:
        if message["type"] == type_ and all(message.get(k) == v for k, v in fields.items()):
            return message
    return await p.expect(type_, **fields)


async def allow(p: Peer, approval_id: str, request_id: str) -> dict[str, Any]:
    await p.send(
        {"type": "tool.confirm", "id": request_id, "approval_id": approval_id, "decision": "allow"}
    )
    return await p.expect("confirm.result", id=request_id)


# -- A7: every gate again after the approval wait and the queue wait -----------------------


async def test_case_f17_context_removed_while_approval_pending_denies_scope(
    tmp_path: Path,
) -> None:
    """SPEC A7, I2 (F17): project_id removed while the approval is pending; allow ->
    call.error denied_scope, the handler never ran."""
    async with serve(tmp_path) as gw, peer(gw, context={"project_id": "p1"}) as p:
        approval_id = await gated_start(p, "c1", "proj_delete")
        await p.send({"type": "context.update", "id": "u1", "context": {"project_id": None}})
        assert (await p.expect("context", id="u1"))["context"] == {}
        assert (await allow(p, approval_id, "r1"))["accepted"] is True
        resolved = await p.expect("tool.resolved", call_id="c1")
        assert (resolved["resolution"], resolved["reason"]) == ("allowed", "user")
        err = await p.terminal("c1")
        assert (err["type"], err["code"], err["tool"]) == (
            "call.error",
            "denied_scope",
            "proj_delete",
        )
        assert tt.STATE.calls == {}


async def test_a7_job_whose_context_lapsed_in_the_queue_fails_denied_scope(tmp_path: Path) -> None:
    """SPEC A7, J1: a job that waited for a slot is re-checked before its handler starts:
    job.failed with error.code denied_scope; the handler never ran."""
    async with (
        serve(tmp_path, jobs={"max_per_session": 1}) as gw,
        peer(gw, context={"project_id": "p1"}) as p,
    ):
        await p.invoke("c1", "hold_job", {"key": "a"})
        first = await p.terminal("c1")
        async with asyncio.timeout(WAIT):
            await tt.STATE.job_event(tt.STATE.job_started, "a").wait()
        await p.invoke("c2", "proj_job", {"key": "b"})
        second = await p.terminal("c2")
        assert second["type"] == "dispatched"
        await p.send({"type": "context.update", "id": "u1", "context": {"project_id": None}})
        await p.expect("context", id="u1")
        tt.STATE.job_event(tt.STATE.job_release, "a").set()
        assert (await p.expect("job.done", job_id=first["job_id"]))["ok"] is True
        failed = await p.expect("job.failed", job_id=second["job_id"])
        assert failed["error"]["code"] == "denied_scope"
        assert tt.STATE.calls == {"hold_job": 1}


async def test_a7_sync_call_waiting_for_a_worker_thread_is_rechecked(tmp_path: Path) -> None:
    """SPEC A7, S3: a plain handler that waited for a worker thread is re-checked once it
    has one: project_id removed meanwhile -> call.error denied_scope, it never ran."""
    one_thread = {"worker_threads": 1, "threads_per_session": 1, "threads_per_user": 1}
    async with (
        serve(tmp_path, calls=one_thread) as gw,
        peer(gw, context={"project_id": "p1"}) as p,
    ):
        await p.invoke("c1", "block", {})
        await tt.wait_thread_event(tt.STATE.started)
        await p.invoke("c2", "proj_plain", {})
        await p.expect("tool_start", call_id="c2")  # gates passed; it waits for the thread
        await p.send({"type": "context.update", "id": "u1", "context": {"project_id": None}})
        await p.expect("context", id="u1")
        tt.STATE.release.set()
        assert (await tt.first_terminal(p, "c1"))["type"] == "result"
        err = await tt.first_terminal(p, "c2")
        assert (err["type"], err["code"]) == ("call.error", "denied_scope")
        assert tt.STATE.calls == {"block": 1}


@pytest.mark.parametrize(
    ("tool", "demo", "code"),
    [
        ("gated", {"capabilities": ["proj", "jobs"]}, "denied_capability"),
        ("wipe", {"capabilities": ["proj", "gate", "jobs"]}, "denied_dangerous"),
    ],
    ids=["capability", "dangerous"],
)
async def test_a7_hot_reload_removes_a_grant_while_approval_pending(
    tmp_path: Path, tool: str, demo: dict[str, Any], code: str
) -> None:
    """SPEC A7, C2, C3: the profile loses the tool's capability (or its dangerous opt-in)
    by hot reload while the approval is pending; allow -> call.error with that denial,
    the handler never ran."""
    profiles = tmp_path / "profiles.yaml"
    reload = {"hot_reload": True, "reload_interval": 20 * MS}
    async with serve(tmp_path, catalog=reload) as gw, peer(gw) as p:
        approval_id = await gated_start(p, "c1", tool)
        write_yaml(profiles, {"profiles": {"demo": demo}})
        pushed = await p.expect("catalog", reason="reload")
        assert tool not in [t["name"] for t in pushed["tools"]]
        assert (await allow(p, approval_id, "r1"))["accepted"] is True
        err = await p.terminal("c1")
        assert (err["type"], err["code"]) == ("call.error", code)
        assert tt.STATE.calls == {}


# -- S6: credential lifetime on the socket -------------------------------------------------


async def test_case_f19_expiring_jwt_is_warned_then_closed_and_nothing_runs(
    tmp_path: Path,
) -> None:
    """SPEC S6 (F19a): a JWT expiring in 3-4 s: auth.expiring before exp, then close 4004
    at exp; the pending gated call never runs; the expired JWT cannot resume."""
    async with serve(tmp_path, auth=jwt_auth(expiry_warning=3.0)) as gw:
        exp = int(time.time()) + 4  # the server is up: the clock starts now
        async with peer(gw, token=make_jwt("ana", ["demo"], exp)) as p:
            await gated_start(p, "c1")
            warning = await seen_or_expect(p, "auth.expiring")
            assert warning["expires_at"] == exp
            assert 0 < warning["seconds_left"] <= 3.0
            assert time.time() < exp
            gone = await closed(p)
            assert gone.rcvd is not None
            assert (gone.rcvd.code, gone.rcvd.reason) == (4004, "credential expired")
            assert time.time() >= exp - 0.05
            with suppress(ConnectionClosed):
                await p.send({"type": "tool.confirm", "approval_id": "ap_x", "decision": "allow"})
            assert tt.STATE.calls == {}
            async with peer(gw, hello=False) as again:
                await again.send(
                    {
                        "type": "hello",
                        "token": make_jwt("ana", ["demo"], exp),
                        "profile": "demo",
                        **resume_fields(p, 0),
                    }
                )
                refused = await again.expect("error")
                assert refused["code"] == "auth_failed"
                assert (await closed(again)).rcvd.code == 4003  # type: ignore[union-attr]
            assert tt.STATE.calls == {}


async def test_s6_allow_after_the_lapse_is_denied_credential_expired(tmp_path: Path) -> None:
    """SPEC S6, A7: an allow that arrives once the credential is past its exp, before the
    close went out, ends the call credential_expired; the handler never runs."""
    exp = time.time() + 300
    async with (
        serve(tmp_path, auth=jwt_auth()) as gw,
        peer(gw, token=make_jwt("ana", ["demo"], exp)) as p,
    ):
        approval_id = await gated_start(p, "c1")
        # The server's clock jumps past exp; its close timer has not fired yet.
        gw.authority._clock = lambda: exp + 1
        assert (await allow(p, approval_id, "r1"))["accepted"] is True
        err = await p.terminal("c1")
        assert (err["type"], err["code"]) == ("call.error", "credential_expired")
        assert tt.STATE.calls == {}


async def test_s6_refresh_keeps_the_session_past_the_first_exp(tmp_path: Path) -> None:
    """SPEC S6: on auth.expiring the client sends auth.refresh; auth.refreshed names the
    new expiry, and the socket stays open and serves calls after the first exp."""
    auth = jwt_auth(expiry_warning=2.5)
    async with serve(tmp_path, auth=auth, calls={"approval_timeout": 3.5}) as gw:
        first_exp = int(time.time()) + 3  # the server is up: the clock starts now
        async with peer(gw, token=make_jwt("ana", ["demo"], first_exp)) as p:
            await gated_start(p, "c1")  # its approval times out after first_exp
            await seen_or_expect(p, "auth.expiring", expires_at=first_exp)
            later = int(time.time()) + 300
            await p.send(
                {"type": "auth.refresh", "id": "a1", "token": make_jwt("ana", ["demo"], later)}
            )
            assert await p.expect("auth.refreshed", id="a1") == {
                "type": "auth.refreshed",
                "id": "a1",
                "expires_at": later,
            }
            resolved = await p.expect("tool.resolved", call_id="c1")
            assert resolved["reason"] == "timeout"
            assert time.time() > first_exp
            await p.invoke("c2", "quick", {})
            assert (await p.terminal("c2"))["type"] == "result"
            assert tt.STATE.calls == {"quick": 1}


async def test_s6_a_refresh_past_the_announced_expiry_is_too_late(tmp_path: Path) -> None:
    """SPEC S6: at the credential's `expires_at` the socket closes 4004 unless a refresh
    came first. The server's clock passes it while the close timer (real time, 300 s)
    has not fired: a refresh now is too late. No `auth.refreshed`; the socket closes
    4004 as at the expiry. Before, the refresh was accepted and the session went on."""
    async with serve(tmp_path, auth=jwt_auth(expiry_warning=0)) as gw:
        exp = int(time.time()) + 300
        async with peer(gw, token=make_jwt("ana", ["demo"], exp)) as p:
            await p.expect("catalog")
            gw.authority._clock = lambda: exp + 1
            later = int(time.time()) + 3600
            await p.send(
                {"type": "auth.refresh", "id": "a1", "token": make_jwt("ana", ["demo"], later)}
            )
            gone = await closed(p)
            assert gone.rcvd is not None
            assert (gone.rcvd.code, gone.rcvd.reason) == (4004, "credential expired")
            assert [m for m in p.seen if m["type"] == "auth.refreshed"] == []


async def test_s6_refresh_refusals_keep_the_old_credential(tmp_path: Path) -> None:
    """SPEC S6: auth.refresh with a bad token, another principal, or no grant of the
    session's profile is refused with a typed error; the socket and session go on."""
    exp = time.time() + 300
    async with (
        serve(tmp_path, auth=jwt_auth()) as gw,
        peer(gw, token=make_jwt("ana", ["demo"], exp)) as p,
    ):
        cases = [
            ("a1", "not-a-jwt", "auth_failed"),
            ("a2", make_jwt("bea", ["demo"], exp), "principal_mismatch"),
            ("a3", make_jwt("ana", ["readonly"], exp), "profile_denied"),
        ]
        for request_id, credential, code in cases:
            await p.send({"type": "auth.refresh", "id": request_id, "token": credential})
            assert (await p.expect("error", id=request_id))["code"] == code
        assert gw.authority._credentials[p.welcome["session_id"]].identity.expires_at == exp
        await p.invoke("c1", "quick", {})
        assert (await p.terminal("c1"))["type"] == "result"


async def test_case_f19_resume_with_a_jwt_granting_no_profile_is_profile_denied(
    tmp_path: Path,
) -> None:
    """SPEC S6 (F19b): a resume with a JWT of the same user that grants no profile is
    refused profile_denied + 4003, exactly as a fresh hello with that JWT is."""
    exp = time.time() + 300
    bare = make_jwt("ana", [], exp)
    async with serve(tmp_path, auth=jwt_auth()) as gw:
        parked = park_signal(gw)
        async with peer(gw, token=make_jwt("ana", ["demo"], exp)) as p:
            await dropped(p, parked)
        answers = []
        for fields in (resume_fields(p, 0), {}):
            async with peer(gw, hello=False) as q:
                await q.send({"type": "hello", "token": bare, "profile": "demo", **fields})
                refused = await q.expect("error")
                gone = await closed(q)
                assert gone.rcvd is not None
                answers.append((refused, gone.rcvd.code))
        assert answers[0] == answers[1]
        assert answers[0][0]["code"] == "profile_denied"
        assert answers[0][1] == 4003
        assert p.welcome["session_id"] in gw.sessions.sessions


async def test_s6_token_removed_from_token_file_closes_its_sessions(tmp_path: Path) -> None:
    """SPEC S6, A7: a token removed from the token file (hot reload) closes that token's
    sockets 4005; its queued job fails credential_revoked without running; other
    sessions go on; the token cannot resume."""
    async with (
        serve(tmp_path, auth={"recheck_interval": 20 * MS}, jobs={"max_per_session": 1}) as gw,
        peer(gw, token="bob-token") as bob,
        peer(gw) as alice,
    ):
        await bob.invoke("j1", "hold_job", {"key": "a"})
        await bob.terminal("j1")
        async with asyncio.timeout(WAIT):
            await tt.STATE.job_event(tt.STATE.job_started, "a").wait()
        await bob.invoke("j2", "hold_job", {"key": "b"})
        queued = (await bob.terminal("j2"))["job_id"]
        token_file = tmp_path / "tokens.yaml"
        entries = yaml.safe_load(token_file.read_text())["tokens"]
        kept = [e for e in entries if e["sha256"] != hash_token("bob-token")]
        write_yaml(token_file, {"tokens": kept})
        gone = await closed(bob)
        assert gone.rcvd is not None
        assert (gone.rcvd.code, gone.rcvd.reason) == (4005, "credential revoked")
        task = gw.jobs.active[queued].task
        assert task is not None
        tt.STATE.job_event(tt.STATE.job_release, "a").set()
        async with asyncio.timeout(WAIT):
            await task
        row = gw.store.job(queued)
        assert row is not None
        assert (row.state, row.error) == (
            "failed",
            {"code": "credential_revoked", "message": "the session's credential was revoked"},
        )
        assert tt.STATE.calls == {"hold_job": 1}
        await alice.invoke("c1", "quick", {})
        assert (await alice.terminal("c1"))["type"] == "result"
        async with peer(gw, hello=False) as again:
            await again.send(
                {
                    "type": "hello",
                    "token": "bob-token",
                    "profile": "demo",
                    **resume_fields(bob, 0),
                }
            )
            assert (await again.expect("error"))["code"] == "auth_failed"


async def test_s6_token_that_no_longer_grants_the_profile_closes_only_that_session(
    tmp_path: Path,
) -> None:
    """SPEC S6: the token file keeps alice's token but drops its ``demo`` grant: her demo
    session is closed 4005, her readonly session on the same token goes on."""
    async with (
        serve(tmp_path, auth={"recheck_interval": 20 * MS}) as gw,
        peer(gw) as demo,
        peer(gw, profile="readonly") as readonly,
    ):
        token_file = tmp_path / "tokens.yaml"
        entries = yaml.safe_load(token_file.read_text())["tokens"]
        for entry in entries:
            if entry["sha256"] == hash_token("alice-token"):
                entry["profiles"] = ["readonly"]
        write_yaml(token_file, {"tokens": entries})
        gone = await closed(demo)
        assert gone.rcvd is not None
        assert gone.rcvd.code == 4005
        await readonly.invoke("c1", "quick", {})
        assert (await readonly.terminal("c1"))["type"] == "result"


# -- A7 (F26): refusals never reveal another session's or user's ids -----------------------


def _without(message: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k not in keys}


async def test_case_f26_foreign_ids_answer_like_made_up_ones(tmp_path: Path) -> None:
    """SPEC A7 (F26): tool.confirm, job.get, job.cancel and call.cancel for user A's ids
    answer user B exactly as for made-up ids (``unknown`` / ``unknown_job`` /
    ``unknown_call``); A's call and job are untouched."""
    async with serve(tmp_path) as gw, peer(gw) as a, peer(gw, token="bob-token") as b:
        approval_id = await gated_start(a, "c1")
        await a.invoke("c2", "hold_job", {"key": "k"})
        job_id = (await a.terminal("c2"))["job_id"]
        made_up_ap, made_up_job = "ap_" + "x" * 32, "job_" + "y" * 16

        answers = []
        for n, ap in enumerate((approval_id, made_up_ap)):
            await b.send(
                {"type": "tool.confirm", "id": f"t{n}", "approval_id": ap, "decision": "allow"}
            )
            answers.append(
                _without(await b.expect("confirm.result", id=f"t{n}"), "id", "approval_id")
            )
        assert answers == [{"type": "confirm.result", "accepted": False, "reason": "unknown"}] * 2

        for kind in ("job.get", "job.cancel"):
            errors = []
            for n, job in enumerate((job_id, made_up_job)):
                await b.send({"type": kind, "id": f"{kind}{n}", "job_id": job})
                error = await b.expect("error", id=f"{kind}{n}")
                errors.append((error["code"], error["message"].replace(job, "JOB")))
            assert errors == [("unknown_job", "no job 'JOB'")] * 2

        cancels = []
        for n, call_id in enumerate(("c1", "c-made-up")):
            await b.send({"type": "call.cancel", "id": f"x{n}", "call_id": call_id})
            error = await b.expect("error", id=f"x{n}")
            cancels.append((error["code"], error["message"].replace(call_id, "CALL")))
        assert cancels == [("unknown_call", "no running call 'CALL'")] * 2

        assert approval_id in gw.approvals.pending
        assert job_id in gw.jobs.active
        assert (await allow(a, approval_id, "r1"))["accepted"] is True
        assert (await a.terminal("c1"))["type"] == "result"


# -- A7 across a restart: a stored job that runs again is gated like any other ------------

RERUN_TOOLS = """
tools:
  - name: rerunnable
    description: Waits for the test; safe to run twice.
    capability: jobs
    mode: async
    idempotent: true
    handler: tests.gateway.test_authority:wait_forever
"""
RERUNS: list[str] = []
STARTED: list[asyncio.Event] = []


async def wait_forever(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    RERUNS.append(ctx.session_id)
    for event in STARTED:
        event.set()
    await asyncio.Event().wait()
    return {}


async def test_a7_job_run_again_after_a_restart_is_rechecked(tmp_path: Path) -> None:
    """SPEC A7, J5: the profile lost the job's capability while the server was down; the
    job a restart runs again is re-checked before its handler starts: job.failed
    denied_capability, and the handler did not run a second time."""
    tools, profiles = tmp_path / "tools.yaml", tmp_path / "profiles.yaml"
    tools.write_text(RERUN_TOOLS)
    write_yaml(profiles, {"profiles": {"demo": {"capabilities": ["jobs"]}}})
    catalog = {"tools": [tools], "profiles": [profiles], "hot_reload": False}
    settings = settings_for(tmp_path, catalog=catalog)
    RERUNS.clear()
    STARTED[:] = [asyncio.Event()]
    async with running(settings) as gw, peer(gw) as p:
        await p.invoke("a", "rerunnable", {})
        dispatched = await p.terminal("a")
        job_id = dispatched["job_id"]
        async with asyncio.timeout(WAIT):
            await STARTED[0].wait()
        assert RERUNS[:] == [p.welcome["session_id"]]
        resume = resume_fields(p, dispatched["seq"])
    write_yaml(profiles, {"profiles": {"demo": {"capabilities": []}}})
    async with running(settings) as gw, peer(gw, **resume) as q:
        assert q.welcome["resumed"] is True
        failed = await q.expect("job.failed", job_id=job_id)
        assert failed["error"]["code"] == "denied_capability"
        assert len(RERUNS) == 1


async def test_s6_sweep_reauthenticates_only_after_the_token_file_changed(tmp_path: Path) -> None:
    """SPEC S6: the credential sweep asks the authenticator again only when its version
    (the token file's mtime) moved; an unchanged file costs one stat per sweep."""
    async with serve(tmp_path, auth={"recheck_interval": 3600}) as gw, peer(gw) as p:
        seen: list[str | None] = []
        real = gw.authority._authenticator

        class Counting:
            def version(self) -> object:
                return version_of(real)

            def authenticate(self, credential: str | None) -> Identity:
                seen.append(credential)
                return real.authenticate(credential)

        gw.authority._authenticator = Counting()
        gw.authority._swept = object()
        session = gw.sessions.sessions[p.welcome["session_id"]]
        await gw.authority.sweep([session])
        await gw.authority.sweep([session])
        assert seen == ["alice-token"]
        token_file = tmp_path / "tokens.yaml"
        write_yaml(token_file, yaml.safe_load(token_file.read_text()))
        assert await gw.authority.sweep([session]) == 0
        assert seen == ["alice-token", "alice-token"]


# -- S6, A7: a token removed from the token file, the handler starts before the sweep -


async def test_a7_allow_right_after_the_token_is_revoked_does_not_run(tmp_path: Path) -> None:
    """SPEC S6, A7: bob's gated call waits for approval; bob's token is removed from the
    token file (a fresh `hello` with it is refused at once: the server sees the file).
    The allow that follows must end the call ``credential_revoked``: the A7 re-check
    "on the state at that moment". It runs the tool: the re-check only reads a flag the
    periodic sweep (``auth.recheck_interval``, 1 s by default; 30 s here to make the
    window plain) sets later."""
    et.reset()
    settings = et.settings(tmp_path, auth={"recheck_interval": 30.0})
    tokens = tmp_path / "tokens.yaml"
    async with running(settings) as gw, peer(gw, token="bob-token") as p:
        await p.invoke("c1", "gated_quick", {})
        approval_id = (await p.expect("tool_start", call_id="c1"))["approval_id"]
        kept = [e for e in yaml.safe_load(tokens.read_text())["tokens"] if e["user"] != "bob"]
        tokens.write_text(yaml.safe_dump({"tokens": kept}))
        later = time.time() + 5
        os.utime(tokens, (later, later))
        async with peer(gw, hello=False) as fresh:
            await fresh.send({"type": "hello", "token": "bob-token", "profile": "demo"})
            assert (await fresh.expect("error"))["code"] == "auth_failed"
        await p.send(
            {"type": "tool.confirm", "id": "k", "approval_id": approval_id, "decision": "allow"}
        )
        answer = await p.terminal("c1")
        assert RUNS == [], f"the tool ran on a revoked token: {answer}"
        assert answer.get("code") == "credential_revoked", answer
