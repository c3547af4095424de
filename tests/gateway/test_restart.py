"""A server restart, graceful (drain) and by crash (SIGKILL), resumed on the same data_dir
(SPEC D3, J5, S4, A4, I12)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gateway.config import DEMO_DIR, Settings
from gateway.demo import handlers
from gateway.server import Gateway
from tests.gateway.tools_for_tests import audit_records
from tests.pg_support import store_backend  # noqa: F401 (fixture: SQLite, PostgreSQL)
from tests.support import (
    CONVERT,
    WAIT,
    Peer,
    peer,
    peer_at,
    running,
    script_server,
    settings_for,
)

UNSTARTED = "the server restarted before this call started; it did not run"
"""The wire text of a call a crash cut off before its handler started (SPEC J6)."""

# ``report`` is idempotent, so SPEC J5 lets a restart run it again; this twin is not, so a
# restart must report it failed.
ONCE_TOOL = """
tools:
  - name: report_once
    description: Like report, but not idempotent.
    capability: reports
    mode: async
    handler: gateway.demo.handlers:report
    dispatch_message: Writing it now.
    parameters:
      type: object
      properties:
        topic: {type: string, minLength: 1}
        sections: {type: integer, minimum: 1, maximum: 10}
      required: [topic]
      additionalProperties: false
"""


def restart_settings(tmp: Path) -> Settings:
    """The demo catalog plus ``report_once``, data in ``tmp``: the same for both servers."""
    extra = tmp / "once.yaml"
    extra.write_text(ONCE_TOOL)
    return settings_for(tmp, catalog={"tools": [DEMO_DIR / "tools.yaml", extra]})


# A server in its own process, so that it can be killed without any chance to clean up.
SERVER_SCRIPT = """
import asyncio, sys
from pathlib import Path
from gateway.demo import handlers
from gateway.server import Gateway
from tests.gateway.test_restart import restart_settings

handlers.REPORT_SECTION_SECONDS = 3600.0  # the job is still running when the process dies

async def main() -> None:
    gateway = Gateway(restart_settings(Path(sys.argv[1])))
    await gateway.start()
    print(gateway.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def before_restart(p: Peer) -> dict[str, Any]:
    """Open work of every kind: a finished call (acked), a running job, a pending approval."""
    await p.invoke("c1", "convert_units", CONVERT)
    done = await p.terminal("c1")
    await p.send({"type": "ack", "seq": done["seq"]})
    await p.invoke("job", "report_once", {"topic": "restarts", "sections": 1})
    dispatched = await p.terminal("job")
    await p.invoke("gated", "notes_delete", {"note_id": 1})
    start = await p.expect("tool_start", call_id="gated")
    assert start["approval_id"]
    return {
        "done": done,
        "job_id": dispatched["job_id"],
        "approval_id": start["approval_id"],
        "last_seq": start["seq"],
    }


async def after_restart(gw: Gateway, p: Peer, state: dict[str, Any], drained: bool = False) -> None:
    """Resume on the restarted server and check what SPEC D3, J5, A4 and I12 promise.

    ``drained``: the first server drained (SPEC S4, A4): it handed the call waiting for
    approval to the next start (gateway.handoff), so that approval is still pending
    under its id and the user decides it now. After a crash it resolved
    ``disconnected`` and its call ended ``unavailable``, saying it did not run (J6)."""
    fields = {
        "session_id": p.welcome["session_id"],
        "resume_token": p.welcome["resume_token"],
        "last_seq": state["last_seq"],
    }
    async with peer(gw, **fields) as again:
        assert again.welcome["resumed"] is True
        await again.send({"type": "job.get", "id": "jg", "job_id": state["job_id"]})
        job = (await again.expect("job", id="jg"))["job"]
        if drained:
            await again.send(
                {
                    "type": "tool.confirm",
                    "id": "no",
                    "approval_id": state["approval_id"],
                    "decision": "deny",
                }
            )
            assert (await again.expect("confirm.result", id="no"))["accepted"] is True
            await again.terminal("gated")
        events = [m for m in again.seen if "seq" in m]
        # Nothing lost, nothing twice, in order, continuing the old numbering.
        seqs = [m["seq"] for m in events]
        assert seqs == list(range(state["last_seq"] + 1, seqs[-1] + 1))
        assert not [seq for seq, n in Counter(seqs).items() if n > 1]
        by_type = {m["type"]: m for m in events}
        ended = "result" if drained else "call.error"
        assert set(by_type) == {"job.failed", "tool.resolved", ended}, events
        failed = by_type["job.failed"]
        assert failed["job_id"] == state["job_id"]
        assert failed["call_id"] == "job"
        assert failed["error"]["code"] == "interrupted"
        resolved = by_type["tool.resolved"]
        assert (resolved["call_id"], resolved["approval_id"], resolved["tool"]) == (
            "gated",
            state["approval_id"],
            "notes_delete",
        )
        reason = "user" if drained else "disconnected"
        assert (resolved["resolution"], resolved["reason"]) == ("denied", reason)
        terminal = by_type[ended]
        if drained:
            assert (terminal["call_id"], terminal["result"]["declined"]) == ("gated", True)
        else:
            # SPEC J6: it waited for its approval, so its handler never started.
            assert (
                terminal["call_id"],
                terminal["tool"],
                terminal["code"],
                terminal["message"],
            ) == ("gated", "notes_delete", "unavailable", UNSTARTED)
        assert (job["state"], job["error"]["code"]) == ("failed", "interrupted")
        # SPEC I12 across the restart: the finished call answers its recorded outcome.
        await again.invoke("c1", "convert_units", CONVERT)
        assert await again.terminal("c1") == state["done"]
        # The settled approval can no longer be used.
        await again.send(
            {
                "type": "tool.confirm",
                "id": "k",
                "approval_id": state["approval_id"],
                "decision": "allow",
            }
        )
        assert (await again.expect("confirm.result", id="k"))["accepted"] is False
        await again.invoke("gated", "notes_delete", {"note_id": 1})
        assert await again.terminal("gated") == terminal


@pytest.mark.usefixtures("store_backend")
async def test_restart_after_drain_resumes_without_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RESTART / SPEC S4, D3, J5, A4: drain, a new server on the same data_dir, resume: no
    event lost or doubled; the running job failed "interrupted"; the pending approval is
    pending again under its id (handed to the next start) and the user decides it."""
    monkeypatch.setattr(handlers, "REPORT_SECTION_SECONDS", 3600.0)
    settings = restart_settings(tmp_path)
    first = Gateway(settings)
    await first.start()
    async with peer(first) as p:
        state = await before_restart(p)
        p.ws.transport.abort()
        await first.drain()
    with audit_records() as records:
        async with running(settings) as second:
            await after_restart(second, p, state, drained=True)
            # SPEC I11, O2: the adopted call's time counts from its adoption on this
            # server (it was measured against the wall clock, about -1.8e12 ms).
            spent = second.metrics.registry.get_sample_value(
                "toolbus_invoke_seconds_sum", {"mode": "sync"}
            )
            assert spent is not None
            assert 0 <= spent < WAIT
    gated = [r for r in records if r["call_id"] == "gated"]
    assert [(r["outcome"], r["tool"]) for r in gated] == [("rejected_by_user", "notes_delete")]
    assert 0 <= gated[0]["duration_ms"] < WAIT * 1000


@pytest.mark.usefixtures("store_backend")
async def test_restart_after_crash_resumes_without_loss(tmp_path: Path) -> None:
    """RESTART / SPEC D3, J5: the server process is SIGKILLed; a new server on the same
    data_dir resumes the session: the same guarantees as after a drain."""
    async with (
        script_server(SERVER_SCRIPT, str(tmp_path)) as first,
        peer_at(f"ws://127.0.0.1:{first.port}/") as p,
    ):
        state = await before_restart(p)
        await first.crash()
    assert first.proc.returncode == -9
    with audit_records() as records:
        async with running(restart_settings(tmp_path)) as second:
            await after_restart(second, p, state)
    # SPEC I11: the killed process never wrote the record of the call it held pending
    # approval; the restart that ends it does, once (the re-send answers its record).
    gated = [r for r in records if r["call_id"] == "gated"]
    assert [(r["tool"], r["outcome"], r["code"], r["duration_ms"]) for r in gated] == [
        ("notes_delete", "unavailable", "unavailable", None)
    ]
    assert (gated[0]["session"], gated[0]["user"], gated[0]["profile"]) == (
        p.welcome["session_id"],
        "alice",
        "demo",
    )
    approval = gated[0]["approval"]
    assert (approval["approval_id"], approval["resolution"], approval["reason"]) == (
        state["approval_id"],
        "denied",
        "disconnected",
    )
