"""The invocation pipeline over real sockets (SPEC I1-I14; cases F08, F09)."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any

import tests.gateway.tools_for_tests as tt
from catalog.model import Profile
from gateway.ledger import params_hash
from gateway.pipeline import Call
from gateway.server import Gateway
from protocol import messages as m
from protocol.outcomes import CallOutcome
from tests.gateway.tools_for_tests import audit_records, serve, wait_thread_event
from tests.support import Peer, peer


def for_call(p: Peer, call_id: str) -> list[dict[str, Any]]:
    """Every message seen so far that belongs to ``call_id``."""
    return [msg for msg in p.seen if msg.get("call_id") == call_id]


# -- I1 unknown tool ----------------------------------------------------------------------


async def test_i1_unknown_tool_gets_suggestions(gateway: Gateway) -> None:
    """SPEC I1: a near-miss name is unknown_tool with "did you mean" suggestions."""
    async with peer(gateway) as p:
        await p.invoke("c1", "convert_unit", {"value": 1})
        err = await p.terminal("c1")
        assert err == {
            "type": "call.error",
            "seq": 2,
            "call_id": "c1",
            "tool": "convert_unit",
            "code": "unknown_tool",
            "message": "no tool named 'convert_unit'",
            "suggestions": ["convert_units"],
        }


async def test_i1_invented_name_gets_configured_guidance(gateway: Gateway) -> None:
    """SPEC I1: a name models tend to invent gets the catalog's guidance text."""
    async with peer(gateway) as p:
        await p.invoke("c1", "get_weather", {"city": "Paris"})
        err = await p.terminal("c1")
        assert err["code"] == "unknown_tool"
        assert err["guidance"] == gateway.catalog.current.guidance["get_weather"]
        assert err["guidance"].startswith("There is no weather service here.")
        assert err["suggestions"] == []


async def test_i1_tool_outside_session_catalog_fails_like_unknown(gateway: Gateway) -> None:
    """SPEC I1, C3: notes_delete for readonly and project_summary without a project are unknown."""
    async with peer(gateway, profile="readonly") as p:
        await p.invoke("c1", "notes_delete", {"note_id": 1})
        err = await p.terminal("c1")
        assert err == {
            "type": "call.error",
            "seq": 2,
            "call_id": "c1",
            "tool": "notes_delete",
            "code": "unknown_tool",
            "message": "no tool named 'notes_delete'",
            "suggestions": ["notes_list"],  # only visible names; the hidden tool is never revealed
        }
    async with peer(gateway) as p:
        # A new call id: "c1" of this user is a key of the first call (SPEC I15).
        await p.invoke("c2", "project_summary", {})
        err = await p.terminal("c2")
        assert err == {
            "type": "call.error",
            "seq": 2,
            "call_id": "c2",
            "tool": "project_summary",
            "code": "unknown_tool",
            "message": "no tool named 'project_summary'",
            "suggestions": [],
        }
        assert "tool_start" not in [msg["type"] for msg in p.seen]


# -- I2 gates re-checked at execution ---------------------------------------------------


async def test_i2_gates_rechecked_at_execution(tmp_path: Path) -> None:
    """SPEC I2: a tool still in the session's catalog snapshot is refused when a gate now fails."""
    async with serve(tmp_path) as gw, peer(gw, context={"project_id": "p1"}) as p:
        catalog = await p.expect("catalog")
        assert {"scoped", "gated", "delete_file"} <= {t["name"] for t in catalog["tools"]}
        session = gw.sessions.get(p.welcome["session_id"])
        assert session is not None
        session.context.pop("project_id")  # changed without a re-push
        await p.invoke("c1", "scoped", {})
        err = await p.terminal("c1")
        assert (err["code"], err["message"]) == (
            "denied_scope",
            "scoped is not available: denied_scope",
        )

        session.profile = Profile("narrow", capabilities=frozenset({"t.basic"}))
        await p.invoke("c2", "gated", {})
        assert (await p.terminal("c2"))["code"] == "denied_capability"

        session.profile = Profile("no_opt_in", capabilities=frozenset({"t.gated"}))
        await p.invoke("c3", "delete_file", {"path": "a"})
        assert (await p.terminal("c3"))["code"] == "denied_dangerous"
        assert tt.STATE.calls == {}
        assert tt.STATE.hooks == []
        assert [m["type"] for m in p.seen if "seq" in m] == ["catalog"] + ["call.error"] * 3


async def test_i2_hot_reload_without_push_is_still_gated(tmp_path: Path) -> None:
    """SPEC I2: after a reload drops allow_dangerous, a stale snapshot cannot call the tool."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.expect("catalog")
        session = gw.sessions.get(p.welcome["session_id"])
        assert session is not None
        assert "delete_file" in session.catalog_names
        profiles = tmp_path / "profiles.yaml"
        profiles.write_text(
            tt.PROFILES_YAML.replace(
                "    allow_dangerous: [delete_file]\n  readonly", "  readonly", 1
            )
        )
        stat = profiles.stat()
        os.utime(profiles, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        assert gw.catalog.reload()
        gw.catalog.refresh_profile(session)  # the re-push has not happened yet
        await p.invoke("c1", "delete_file", {"path": "a"})
        err = await p.terminal("c1")
        assert (err["code"], err["seq"]) == ("denied_dangerous", 2)
        assert tt.STATE.calls["delete_file"] == 0


# -- I3, I4 ------------------------------------------------------------------------------


async def test_i3_client_tool_is_wrong_route(gateway: Gateway) -> None:
    """SPEC I3: show_map (mode client) invoked on the server is wrong_route."""
    async with peer(gateway) as p:
        await p.invoke("c1", "show_map", {"lat": 1, "lon": 2})
        err = await p.terminal("c1")
        assert err == {
            "type": "call.error",
            "seq": 2,
            "call_id": "c1",
            "tool": "show_map",
            "code": "wrong_route",
            "message": "show_map runs in the client, not on the server",
        }


async def test_case_f08_unknown_argument_and_missing_required(tmp_path: Path) -> None:
    """Case F08 / SPEC I4: {"path": "x"} for a topic-only tool names path and the missing topic."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "topic_tool", {"path": "x"})
        err = await p.terminal("c1")
        assert err["code"] == "invalid_params"
        assert err["message"] == "2 parameter problem(s)"
        violations = sorted(err["violations"], key=lambda v: v["keyword"])
        assert [(v["pointer"], v["keyword"]) for v in violations] == [
            ("", "additionalProperties"),
            ("", "required"),
        ]
        assert (
            violations[0]["message"]
            == "Additional properties are not allowed ('path' was unexpected)"
        )
        assert violations[1]["message"] == '"topic" is a required property'
        assert tt.STATE.calls == {}
        assert tt.STATE.hooks == []


async def test_i4_violation_pointer_into_nested_value(tmp_path: Path) -> None:
    """SPEC I4: each violation carries the JSON pointer of the bad value."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "topic_tool", {"topic": 5, "count": 0})
        err = await p.terminal("c1")
        pointers = sorted((v["pointer"], v["keyword"]) for v in err["violations"])
        assert pointers == [("/count", "minimum"), ("/topic", "type")]
        assert tt.STATE.calls == {}


async def test_case_f09_empty_and_omitted_params_are_validated(tmp_path: Path) -> None:
    """Case F09 / SPEC I4: {} and omitted params are invalid_params; no hook and no handler run."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "named", {})
        await p.invoke("c2", "named")
        for call_id in ("c1", "c2"):
            err = await p.terminal(call_id)
            assert err["code"] == "invalid_params"
            assert [(v["pointer"], v["keyword"]) for v in err["violations"]] == [("", "required")]
            assert err["violations"][0]["message"] == '"name" is a required property'
        assert tt.STATE.calls == {}
        assert tt.STATE.hooks == []
        await p.invoke("c3", "named", {"name": "ok"})
        assert (await p.terminal("c3"))["type"] == "result"
        assert tt.STATE.calls == {"named": 1}


# -- I5, I6 ------------------------------------------------------------------------------


async def test_i5_identity_comes_from_the_server_not_the_arguments(tmp_path: Path) -> None:
    """SPEC I5: ctx carries session, user, profile, project; a "user" argument changes nothing."""
    async with serve(tmp_path) as gw, peer(gw, context={"project_id": "p9"}) as p:
        await p.invoke("c1", "echo", {"user": "mallory"})
        result = await p.terminal("c1")
        expected = {
            "user": "alice",
            "session_id": p.welcome["session_id"],
            "profile": "demo",
            "project_id": "p9",
            "call_id": "c1",
            "tool": "echo",
        }
        assert result["result"] == {"params": {"user": "mallory"}, "ctx": expected}
        assert tt.STATE.contexts == [expected]


async def test_i6_pre_hooks_in_order_first_deny_ends_the_call(tmp_path: Path) -> None:
    """SPEC I6: hooks run in registration order; the first deny ends with denied_by_hook."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "echo", {})
        assert (await p.terminal("c1"))["type"] == "result"
        assert tt.STATE.hooks == [("first", "c1"), ("deny", "c1"), ("last", "c1"), ("post", "c1")]
        tt.STATE.hooks.clear()
        await p.invoke("c2", "echo", {"deny": "x"})
        err = await p.terminal("c2")
        assert err == {
            "type": "call.error",
            "seq": err["seq"],
            "call_id": "c2",
            "tool": "echo",
            "code": "denied_by_hook",
            "message": "policy says no: x",
            "reason_code": "policy_x",
        }
        assert tt.STATE.hooks == [("first", "c2"), ("deny", "c2")]
        assert tt.STATE.calls == {"echo": 1}
        assert [m["type"] for m in for_call(p, "c2")] == ["call.error"]


# -- I8 execute --------------------------------------------------------------------------


async def test_i8_sync_result_and_non_object_is_wrapped(tmp_path: Path) -> None:
    """SPEC I8: tool_start then result; a bare value comes back as {"value": ...}."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "scalar")
        result = await p.terminal("c1")
        assert result == {
            "type": "result",
            "seq": 3,
            "call_id": "c1",
            "tool": "scalar",
            "result": {"value": 42},
            "declined": False,
            "replaced": False,
        }
        assert [m["type"] for m in for_call(p, "c1")] == ["tool_start", "result"]


async def test_i8_handler_error_and_server_keeps_serving(tmp_path: Path) -> None:
    """SPEC I8: a raising handler is handler_error; the same session keeps working."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "raises")
        err = await p.terminal("c1")
        assert (err["code"], err["message"]) == ("handler_error", "RuntimeError: boom")
        await p.invoke("c2", "scalar")
        assert (await p.terminal("c2"))["result"] == {"value": 42}


async def test_i8_run_timeout(tmp_path: Path) -> None:
    """SPEC I8: a tool running past its own timeout ends with timeout."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "slow")
        err = await p.terminal("c1")
        assert (err["code"], err["message"]) == ("timeout", "slow did not finish within 0.05 s")
        assert tt.STATE.calls == {"slow": 1}


async def test_i8_cancel_running_thread_call_drops_late_result(tmp_path: Path) -> None:
    """SPEC I8: call.cancel ends a running call cancelled; the thread's late return is dropped."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "blocking")
        await p.expect("tool_start", call_id="c1")
        await wait_thread_event(tt.STATE.started)
        await p.send({"type": "call.cancel", "call_id": "c1"})
        err = await p.terminal("c1")
        assert (err["code"], err["message"]) == ("cancelled", "the call was cancelled")
        tt.STATE.release.set()
        await wait_thread_event(tt.STATE.returned)
        assert tt.STATE.cancelled_seen.is_set()  # ctx.cancelled told the thread
        await p.invoke("c2", "scalar")
        await p.terminal("c2")
        assert [m["type"] for m in for_call(p, "c1")] == ["tool_start", "call.error"]
        await p.send({"type": "call.cancel", "id": "r1", "call_id": "c1"})
        error = await p.expect("error", id="r1")
        assert error["code"] == "unknown_call"


# -- I9, I10 -----------------------------------------------------------------------------


async def test_i9_async_tool_is_dispatched_with_job_id(tmp_path: Path) -> None:
    """SPEC I9: an async tool answers dispatched with a job_id and its dispatch message."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "hold_job", {"key": "k"})
        reply = await p.terminal("c1")
        assert reply["type"] == "dispatched"
        assert reply["message"] == "Working on it."
        assert re.fullmatch(r"job_[A-Za-z0-9_-]{16}", reply["job_id"])
        assert reply.get("promoted", False) is False
        tt.STATE.job_event(tt.STATE.job_release, "k").set()
        done = await p.expect("job.done", job_id=reply["job_id"])
        assert done["call_id"] == "c1"
        assert done["result"]["key"] == "k"


async def test_i10_post_hook_replaces_result(tmp_path: Path) -> None:
    """SPEC I10: a post hook's replacement goes out with replaced: true; a kept result does not."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "echo", {"replace": True})
        result = await p.terminal("c1")
        assert (result["result"], result["replaced"]) == ({"redacted": True}, True)
        await p.invoke("c2", "echo", {})
        result = await p.terminal("c2")
        assert result["replaced"] is False
        assert result["result"]["params"] == {}


# -- I11 audit ---------------------------------------------------------------------------


async def test_i11_one_audit_record_per_call_masked_and_truncated(tmp_path: Path) -> None:
    """SPEC I11: one record per call with its fields; sensitive masked; params truncated."""
    with audit_records() as records:
        async with serve(tmp_path, calls={"audit_param_bytes": 64}) as gw, peer(gw) as p:
            await p.invoke("c1", "echo", {"note": "hi", "secret": "hunter2"})
            await p.terminal("c1")
            await p.invoke("c2", "echo", {"secret": "hunter2", "big": "x" * 500})
            await p.terminal("c2")
            await p.invoke("c3", "nope", {"secret": "hunter2"})
            await p.terminal("c3")
    assert [(r["call_id"], r["outcome"]) for r in records] == [
        ("c1", "ok"),
        ("c2", "ok"),
        ("c3", "unknown_tool"),
    ]
    first = records[0]
    assert set(first) == {
        "tool",
        "outcome",
        "profile",
        "user",
        "session",
        "call_id",
        "duration_ms",
        "params",
        "approval",
        "job_id",
        "code",
    }
    assert (first["tool"], first["profile"], first["user"]) == ("echo", "demo", "alice")
    assert first["session"] == p.welcome["session_id"]
    assert first["params"] == {"note": "hi", "secret": "***"}
    assert first["duration_ms"] >= 0
    assert first["approval"] is None
    assert first["code"] is None
    truncated = records[1]["params"]
    assert isinstance(truncated, str)
    assert truncated == '{"secret":"***","big":"' + "x" * 41 + "..."
    assert records[2]["params"] == {
        "secret": "hunter2"
    }  # an unknown tool declares nothing sensitive
    assert records[2]["code"] == "unknown_tool"
    assert all("hunter2" not in str(r["params"]) for r in records[:2])


# -- I12 exactly one terminal, idempotency -----------------------------------------------


async def test_i12_resent_invoke_returns_recorded_outcome(tmp_path: Path) -> None:
    """SPEC I12, I15: the same call_id again gets the recorded terminal (same seq); one
    run. With other parameters or another tool it is refused call_id_conflict."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "echo", {"note": "once"})
        first = await p.terminal("c1")
        await p.invoke("c1", "echo", {"note": "once"})
        again = await p.terminal("c1")
        assert again == first
        assert tt.STATE.calls == {"echo": 1}
        await p.invoke("c1", "echo", {"note": "twice"}, id="r2")
        assert (await p.expect("error", id="r2"))["code"] == "call_id_conflict"
        await p.invoke("c1", "nope", id="r3")
        assert (await p.expect("error", id="r3"))["code"] == "call_id_conflict"
        await p.invoke("c1", "echo", {"note": "once"})
        assert await p.terminal("c1") == first
        assert tt.STATE.calls == {"echo": 1}
        assert [m["type"] for m in for_call(p, "c1")] == [
            "tool_start",
            "result",
            "result",
            "result",
        ]


async def test_i12_second_inflight_use_is_refused(tmp_path: Path) -> None:
    """SPEC I12: a call_id still in flight is refused duplicate_call; one terminal in all."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "blocking")
        await wait_thread_event(tt.STATE.started)
        await p.invoke("c1", "blocking", id="r2")
        error = await p.expect("error", id="r2")
        assert error == {
            "type": "error",
            "id": "r2",
            "code": "duplicate_call",
            "message": "this call_id is still running",
            "details": {"call_id": "c1"},
        }
        tt.STATE.release.set()
        result = await p.terminal("c1")
        assert result["result"] == {"late": True, "tool": "blocking"}
        assert tt.STATE.calls == {"blocking": 1}
        assert [m["type"] for m in for_call(p, "c1")] == ["tool_start", "result"]


# -- I13, I14 ----------------------------------------------------------------------------


async def test_i13_stale_catalog_is_refused_and_catalog_pushed(tmp_path: Path) -> None:
    """SPEC I13: an old catalog_version is stale_catalog, then the current catalog is pushed."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        catalog = await p.expect("catalog")
        await p.invoke("c1", "echo", {}, catalog_version="0000000000000000")
        err = await p.terminal("c1")
        assert err == {
            "type": "call.error",
            "seq": 2,
            "call_id": "c1",
            "tool": "echo",
            "code": "stale_catalog",
            "message": "the catalog changed; use the new one",
            "catalog_version": catalog["version"],
        }
        pushed = await p.expect("catalog")
        assert (pushed["seq"], pushed["reason"], pushed["version"]) == (
            3,
            "stale",
            catalog["version"],
        )
        assert tt.STATE.calls == {}
        await p.invoke("c2", "echo", {}, catalog_version=catalog["version"])
        assert (await p.terminal("c2"))["type"] == "result"


async def test_i14_slow_sync_call_is_promoted_to_a_job(tmp_path: Path) -> None:
    """SPEC I14: past promote_after the client hears dispatched (promoted) and later job.done."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "promo")
        reply = await p.terminal("c1")
        assert reply["type"] == "dispatched"
        assert reply["promoted"] is True
        assert reply["message"] == "promo is taking a while; I'll report back when it's done."
        job_id = reply["job_id"]
        await p.send({"type": "job.get", "id": "g1", "job_id": job_id})
        assert (await p.expect("job", id="g1"))["job"]["state"] == "running"
        tt.STATE.release.set()
        done = await p.expect("job.done", job_id=job_id)
        assert (done["call_id"], done["tool"], done["summary"]) == ("c1", "promo", "promo finished")
        assert done["result"] == {"late": True, "tool": "promo"}
        assert tt.STATE.calls == {"promo": 1}
        assert [m["type"] for m in for_call(p, "c1")] == ["tool_start", "dispatched", "job.done"]


async def test_i12_concurrent_calls_each_get_one_terminal(tmp_path: Path) -> None:
    """SPEC I12: 20 calls sent in one burst end with exactly one terminal each."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        await asyncio.gather(*(p.invoke(f"c{i}", "echo", {"note": str(i)}) for i in range(20)))
        terminals: list[dict[str, Any]] = []
        while len(terminals) < 20:
            message = await p.recv()
            if message["type"] in ("result", "dispatched", "call.error"):
                terminals.append(message)
        assert sorted(m["call_id"] for m in terminals) == sorted(f"c{i}" for i in range(20))
        seqs = [m["seq"] for m in p.seen if "seq" in m]
        assert seqs == list(range(1, 42))


async def test_i12_resend_before_the_terminal_is_committed(tmp_path: Path) -> None:
    """SPEC I12: a re-send in the tick the call finished still gets the outcome. The
    call is opened in the ledger as admission opens every call (SPEC I15: a session's
    record of a call id whose ledger key is gone is past the window, new again)."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        session = gw.sessions.get(p.welcome["session_id"])
        assert session is not None
        call = Call(session, "c1", "echo", {}, time.perf_counter())
        gw.pipeline.ledger.open(session, "c1", "echo", params_hash({}))
        gw.pipeline.end.finish(call, CallOutcome.OK, m.Result, result={"x": 1})
        gw.pipeline.accept(session, m.Invoke(call_id="c1", tool="echo"))  # no await in between
        first = await p.terminal("c1")
        assert await p.terminal("c1") == first
        assert first["result"] == {"x": 1}
        assert tt.STATE.calls == {}


async def test_i8_cancel_in_the_tick_of_the_invoke_still_ends_the_call(tmp_path: Path) -> None:
    """SPEC I8, I16, case F33: a call cancelled before its task took a first step (an
    ``invoke`` and its ``call.cancel`` in one batch of frames) still ends with exactly
    one ``cancelled`` terminal, and its per-session state and ledger entry are freed."""
    async with serve(tmp_path) as gw, peer(gw) as p:
        session = gw.sessions.get(p.welcome["session_id"])
        assert session is not None
        gw.pipeline.accept(session, m.Invoke(call_id="c1", tool="echo"))
        assert gw.pipeline.cancel(session, "c1")  # no await in between
        err = await p.terminal("c1")
        assert (err["code"], err["message"]) == ("cancelled", "the call was cancelled")
        await p.invoke("c2", "echo", {"note": "x"})
        await p.terminal("c2")
        assert [msg["type"] for msg in for_call(p, "c1")] == ["call.error"]
        assert session.inflight == {}
        assert gw.pipeline.tracked_calls() == 0
        assert gw.pipeline.ledger._live == {}
