"""One execution per call id, across sessions (SPEC I15, case F16).

Every test runs the real gateway on 127.0.0.1 with real clients; the network path is
cut for real by :class:`~tests.gateway.ledger_tools.TcpProxy` (RST both ways). Runs are
counted by the lines the handlers append to a file, which also survives a restart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

import toolbus
from gateway.ledger import params_hash
from gateway.server import Gateway
from gateway.store import LedgerRow, SqliteStore, StoreUnavailable
from protocol import messages as m
from protocol.errors import ErrorCode
from tests.gateway import edge_tools as et
from tests.gateway import ledger_tools as lt
from tests.gateway.thread_tools import HOG_RELEASE, HOG_STARTED, RUNS, wait_thread
from tests.pg_support import pg_url  # noqa: F401 (fixture)
from tests.support import WAIT, Clock, Peer, barrier, peer, running, script_server, settings_for
from toolbus.script import run_file

CHARGE = {"amount": 100}
OUTAGE = 4.0
"""Case F16: seconds the network path stays down (an input of the case, not a wait)."""
ROOT = Path(__file__).resolve().parents[2]
SUB = Subprotocol("toolbus.v1")


@asynccontextmanager
async def ledger_gateway(tmp: Path, **sections: Any) -> AsyncIterator[Gateway]:
    lt.reset()
    async with running(lt.ledger_settings(tmp, **sections)) as gw:
        try:
            yield gw
        finally:
            lt.GATE.release.set()
            lt.GATE.jobs.set()


@asynccontextmanager
async def proxied_bus(gw: Gateway) -> AsyncIterator[tuple[lt.TcpProxy, toolbus.Client]]:
    """A Python client (alice, profile demo, fast backoff) connected to ``gw`` through a
    :class:`~tests.gateway.ledger_tools.TcpProxy` the test can cut; the proxy is closed
    after the client."""
    proxy = await lt.TcpProxy(gw.port).start()
    backoff = toolbus.Backoff(initial=0.05, cap=0.2)
    try:
        async with toolbus.connect(
            proxy.url, token="alice-token", profile="demo", backoff=backoff
        ) as bus:
            yield proxy, bus
    finally:
        await proxy.close()


async def wait_until(condition: Any, what: str) -> None:
    """Poll a condition of the server's state (not a sleep ordering events)."""
    async with asyncio.timeout(WAIT):
        while not condition():  # noqa: ASYNC110 - server state, no event to await
            await asyncio.sleep(0.01)


async def wait_started() -> None:
    async with asyncio.timeout(WAIT):
        assert await asyncio.to_thread(lt.GATE.started.wait, WAIT)


async def test_case_f16_resend_after_failed_resume_runs_the_charge_once(tmp_path: Path) -> None:
    """Case F16 / SPEC I15, D3: the path dies while `charge` runs and stays down past the
    1 s resume window; the Python client reconnects, gets resumed: false, re-sends its
    waiting invoke, and gets the first run's result; the charge ran once."""
    async with ledger_gateway(tmp_path, sessions={"resume_window": 1.0}) as gw:
        async with proxied_bus(gw) as (proxy, bus):
            first_session = bus.session_id
            call = asyncio.ensure_future(bus.invoke("charge", CHARGE, call_id="pay-1"))
            await wait_started()
            proxy.cut()
            down_at = time.monotonic()
            # While the path is down the parked session expires and the first run
            # ends (awaited as states, not timed); the path stays down the case's 4 s.
            await wait_until(lambda: gw.sessions.get(first_session) is None, "expiry")
            async with asyncio.timeout(WAIT):
                assert await asyncio.to_thread(lt.GATE.finished.wait, WAIT)
            await asyncio.sleep(max(0.0, OUTAGE - (time.monotonic() - down_at)))
            assert not bus.connected
            proxy.restore()
            async with asyncio.timeout(WAIT):
                result = await call
            assert bus.welcome is not None
            assert bus.welcome.resumed is False
            assert bus.session_id != first_session
            assert isinstance(result, m.Result)
            assert (result.call_id, result.tool, result.result) == (
                "pay-1",
                "charge",
                {"charged": 100},
            )
        assert lt.runs(gw.settings.data_dir) == ["pay-1 100"]


async def test_i15_resend_while_running_attaches_to_the_running_call(tmp_path: Path) -> None:
    """SPEC I15: a re-send from the principal's next session while the first run is still
    going attaches to it: the one run's result reaches the new session; nothing re-runs."""
    async with ledger_gateway(tmp_path, sessions={"resume_window": 0.2}) as gw:
        async with proxied_bus(gw) as (proxy, bus):
            first_session = bus.session_id
            call = asyncio.ensure_future(bus.invoke("held_charge", CHARGE, call_id="pay-2"))
            await wait_started()
            proxy.cut()
            await wait_until(lambda: gw.sessions.get(first_session) is None, "expiry")
            proxy.restore()
            second = lambda: bus.session_id != first_session  # noqa: E731
            await wait_until(lambda: second() and bus.connected, "new session")
            live = gw.pipeline.ledger._live[("", "alice", "pay-2")]
            await wait_until(lambda: bus.session_id in live.waiters, "attached")
            assert not call.done()
            lt.GATE.release.set()
            async with asyncio.timeout(WAIT):
                result = await call
            assert isinstance(result, m.Result)
            assert result.result == {"charged": 100}
        assert lt.runs(gw.settings.data_dir) == ["pay-2 100"]


async def test_i15_other_session_of_the_principal_gets_the_recorded_outcome(
    tmp_path: Path,
) -> None:
    """SPEC I15: a finished call id re-sent from another live session of the same
    principal replays the outcome under that session's own seq; another principal (other
    user, or same user in another tenant) is a different key and runs its own call."""
    async with ledger_gateway(tmp_path) as gw:
        lt.GATE.release.set()
        async with peer(gw) as a, peer(gw) as b:
            await a.invoke("c1", "held_charge", CHARGE)
            first = await a.terminal("c1")
            await b.invoke("c1", "held_charge", CHARGE)
            again = await b.terminal("c1")
            assert first["type"] == again["type"] == "result"
            assert again["result"] == first["result"] == {"charged": 100}
            assert again["seq"] == b.welcome["last_seq"] + 2  # after b's catalog
            # B's re-send again: B's own recorded event, same bytes (SPEC I12).
            await b.invoke("c1", "held_charge", CHARGE)
            assert await b.terminal("c1") == again
        for token in ("bob-token", "alice-t2-token"):
            async with peer(gw, token=token) as other:
                await other.invoke("c1", "held_charge", CHARGE)
                assert (await other.terminal("c1"))["result"] == {"charged": 100}
        assert len(lt.runs(gw.settings.data_dir)) == 3


@pytest.mark.parametrize(
    ("tool", "params"),
    [("held_charge", {"amount": 5}), ("bad_value", {"kind": "set"}), ("held_charge", {})],
)
async def test_i15_same_call_id_other_tool_or_params_is_a_conflict(
    tmp_path: Path, tool: str, params: dict[str, Any]
) -> None:
    """SPEC I15: the principal's call id with another tool or other parameters is refused
    `call_id_conflict`, from any session, running or finished; nothing runs."""
    async with ledger_gateway(tmp_path) as gw:
        async with peer(gw) as a, peer(gw) as b:
            await a.invoke("k1", "held_charge", CHARGE, id="r1")
            await wait_started()
            await b.send(
                {"type": "invoke", "id": "r2", "call_id": "k1", "tool": tool, "params": params}
            )
            refused = await b.expect("error", id="r2")
            assert refused["code"] == ErrorCode.CALL_ID_CONFLICT
            assert refused["details"] == {"call_id": "k1"}
            lt.GATE.release.set()
            assert (await a.terminal("k1"))["result"] == {"charged": 100}
            await b.send(
                {"type": "invoke", "id": "r3", "call_id": "k1", "tool": tool, "params": params}
            )
            assert (await b.expect("error", id="r3"))["code"] == ErrorCode.CALL_ID_CONFLICT
            await b.invoke("k1", "held_charge", {"amount": 100})
            assert (await b.terminal("k1"))["result"] == {"charged": 100}
        assert lt.runs(gw.settings.data_dir) == ["k1 100"]


async def test_i12_second_inflight_use_in_one_session_is_still_refused(tmp_path: Path) -> None:
    """SPEC I12 (kept under I15): a session that already waits for a call id (its own, or
    attached) gets `duplicate_call` for a second use; one terminal arrives."""
    async with ledger_gateway(tmp_path) as gw:
        async with peer(gw) as a, peer(gw) as b:
            await a.invoke("d1", "held_charge", CHARGE)
            await wait_started()
            await a.invoke("d1", "held_charge", CHARGE, id="r1")
            assert (await a.expect("error", id="r1"))["code"] == ErrorCode.DUPLICATE_CALL
            await b.invoke("d1", "held_charge", CHARGE, id="r2")  # attaches
            live = gw.pipeline.ledger._live[("", "alice", "d1")]
            await wait_until(lambda: len(live.waiters) == 1, "attached")
            await b.invoke("d1", "held_charge", CHARGE, id="r3")
            assert (await b.expect("error", id="r3"))["code"] == ErrorCode.DUPLICATE_CALL
            lt.GATE.release.set()
            assert (await a.terminal("d1"))["result"] == {"charged": 100}
            assert (await b.terminal("d1"))["result"] == {"charged": 100}
        assert lt.runs(gw.settings.data_dir) == ["d1 100"]


# A server in its own process, so that it can be killed without any chance to clean up.
SERVER_SCRIPT = """
import asyncio, sys
from pathlib import Path
from gateway.server import Gateway
from tests.gateway.ledger_tools import ledger_settings

async def main():
    gateway = Gateway(ledger_settings(Path(sys.argv[1])))
    await gateway.start()
    print(gateway.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_i15_call_cut_off_by_a_crash_answers_cancelled_and_never_reruns(
    tmp_path: Path,
) -> None:
    """SPEC I15: a call running when the server process was SIGKILLed answers the
    restart's `cancelled` to a re-send from a new session of the next server; the tool
    does not run again (its ledger row was durable before the handler started)."""
    settings = lt.ledger_settings(tmp_path)
    async with (
        script_server(SERVER_SCRIPT, str(tmp_path)) as first,
        connect(f"ws://127.0.0.1:{first.port}/", subprotocols=[SUB]) as ws,
    ):
        a = Peer(ws)
        await a.hello()
        await a.invoke("r1", "held_charge", CHARGE)
        await a.expect("tool_start", call_id="r1")
        await wait_until(lambda: lt.runs(settings.data_dir) == ["r1 100"], "run")
        await first.crash()
    assert first.proc.returncode == -9
    lt.reset()
    async with running(settings) as gw, peer(gw) as b:
        await b.invoke("r1", "held_charge", CHARGE)
        answer = await b.terminal("r1")
        assert answer["type"] == "call.error"
        assert answer["code"] == ErrorCode.CANCELLED
        assert answer["message"] == "the server restarted while this call ran"
        await b.invoke("r1", "held_charge", {"amount": 1}, id="x")
        assert (await b.expect("error", id="x"))["code"] == ErrorCode.CALL_ID_CONFLICT
    assert lt.runs(settings.data_dir) == ["r1 100"]


async def test_i15_call_ids_leave_the_ledger_after_the_window(tmp_path: Path) -> None:
    """SPEC I15: `calls.call_id_window` bounds the key: past it the id is new again, and
    the purge deletes the row."""
    async with ledger_gateway(tmp_path, calls={"call_id_window": 60.0}) as gw:
        lt.GATE.release.set()
        async with peer(gw) as a:
            await a.invoke("w1", "held_charge", CHARGE)
            await a.terminal("w1")
        start = gw.clock
        gw.pipeline.ledger._clock = lambda: start() + 61.0
        async with peer(gw) as b:
            await b.invoke("w1", "held_charge", CHARGE)
            assert (await b.terminal("w1"))["result"] == {"charged": 100}
        assert len(lt.runs(gw.settings.data_dir)) == 2
        gw.outbox.flush()
        gw.pipeline.ledger._clock = lambda: start() + 200.0
        gw.pipeline.ledger.purge()
        assert gw.store.ledger("", "alice", "w1") is None


async def test_i15_toolbus_run_twice_against_one_server(tmp_path: Path) -> None:
    """SPEC I15, K3: call ids are keys of the user, so the walk-through script names its
    call ids with the runner's per-run `${run}`: two runs against one server both pass
    (fixed ids would get the first run's recorded outcomes the second time)."""
    async with running(settings_for(tmp_path)) as gw:
        for _ in range(2):
            report = await run_file(
                ROOT / "examples" / "walkthrough.yaml", gw.url, token="alice-token"
            )
            assert report.passed, report.render()


async def test_i15_python_client_learns_the_job_of_a_dispatch_it_never_saw(
    tmp_path: Path,
) -> None:
    """SPEC I15, D3, K1: the path dies just before `dispatched` reaches the Python client
    and the session expires; the re-sent invoke gets the recorded `dispatched` in the new
    session, and the client follows that job to its end through `job.get` (its events
    went to the lost session). The job ran once."""
    async with (
        ledger_gateway(tmp_path, sessions={"resume_window": 0.2}) as gw,
        proxied_bus(gw) as (proxy, bus),
    ):
        first_session = bus.session_id
        proxy.cut_before = b'"type":"dispatched"'
        call = asyncio.ensure_future(bus.invoke("good_job", {}, call_id="job-1"))
        await wait_until(lambda: proxy.down, "cut")
        await wait_until(lambda: gw.sessions.get(first_session) is None, "expiry")
        proxy.restore()
        async with asyncio.timeout(WAIT):
            handle = await call
        assert isinstance(handle, toolbus.JobHandle)
        assert bus.session_id != first_session
        lt.GATE.jobs.set()
        outcome = await handle.result(timeout=WAIT)
        assert (outcome.state, outcome.summary, outcome.result) == (
            m.JobState.DONE,
            "fine",
            {"n": 7},
        )
        jobs = gw.store.jobs("alice", None, None, 10)
        assert [(j.job_id, j.call_id) for j in jobs] == [(handle.job_id, "job-1")]


async def test_i15_call_id_running_in_another_process_is_awaited_not_run(
    tmp_path: Path,
) -> None:
    """SPEC I15, N3: a ledger row still `running` that this process does not run
    (another writer of the store runs it, as another node does; recovery settled this
    process's own at start): the re-send is attached, not refused, and the tool does
    not run here. Once that writer records the call's terminal event, the session gets
    it under a seq of its own; a second re-send meanwhile is `duplicate_call`."""
    async with ledger_gateway(tmp_path) as gw:
        digest = params_hash(CHARGE)
        running_row = LedgerRow(
            "", "alice", "o1", "held_charge", digest, "running", None, gw.clock()
        )
        gw.store.stage_ledger(running_row)
        gw.outbox.flush()
        async with peer(gw) as p:
            await p.invoke("o1", "held_charge", CHARGE, id="r1")
            await p.invoke("o1", "held_charge", CHARGE, id="r2")
            refused = await p.expect("error", id="r2")
            assert (refused["code"], refused["details"]) == (
                ErrorCode.DUPLICATE_CALL,
                {"call_id": "o1"},
            )
            assert [m for m in p.seen if m.get("id") == "r1"] == []
            before = max(m["seq"] for m in p.seen if "seq" in m)
            outcome = (
                b'{"type":"result","seq":9,"call_id":"o1","tool":"held_charge",'
                b'"result":{"charged":100}}'
            )
            gw.store.stage_ledger(dataclasses.replace(running_row, state="done", outcome=outcome))
            gw.outbox.flush()
            result = await p.terminal("o1")
            assert (result["type"], result["result"], result["seq"]) == (
                "result",
                {"charged": 100},
                before + 1,
            )
        assert lt.runs(gw.settings.data_dir) == []


async def test_i15_parameters_compare_as_canonical_json(tmp_path: Path) -> None:
    """SPEC I15: the same parameters in another key order are the same call (its outcome
    again); a changed value is another call (`call_id_conflict`)."""
    assert params_hash({"a": 1, "b": [1, {"x": 2, "y": 3}]}) == params_hash(
        {"b": [1, {"y": 3, "x": 2}], "a": 1}
    )
    async with ledger_gateway(tmp_path) as gw, peer(gw) as a, peer(gw) as b:
        await a.invoke("o2", "bad_value", {"kind": "set", "note": "n"})
        first = await a.terminal("o2")
        await b.invoke("o2", "bad_value", {"note": "n", "kind": "set"})
        again = await b.terminal("o2")
        assert (again["code"], again["message"]) == (first["code"], first["message"])
        await b.invoke("o2", "bad_value", {"note": "m", "kind": "set"}, id="r1")
        assert (await b.expect("error", id="r1"))["code"] == ErrorCode.CALL_ID_CONFLICT


class FailingCommits:
    """A store whose commits fail while :attr:`failing` is set (at the Store seam)."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.failing = False

    def commit(self) -> None:
        if self.failing:
            raise StoreUnavailable("test: commit refused")
        self.inner.commit()

    def journal(self) -> bool:
        """A failing store takes no journal entry either (SPEC D6): flushes commit."""
        return not self.failing and self.inner.journal()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# -- I15, N3: the same call id from the principal's session on another node ------------


async def test_i15_resend_on_another_node_while_the_call_runs_gets_its_terminal(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC I15, N3: two nodes on one PostgreSQL store. Session 1 (node A) runs `c1`;
    the principal's session 2 (node B; e.g. its resume failed and the load balancer
    picked B) re-sends `c1` unchanged. It is attached, as on one node: no refusal, and
    once `c1` ends on A, session 2 gets its one terminal event, with A's result.
    Before, B refused `duplicate_call` (which the Python client ignores:
    "the terminal event follows", docs/client.md) and nothing followed."""
    et.reset()
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
    settings = [
        et.settings(f, store={"url": pg_url}, nodes={"node_id": f"n-{f.name}"}) for f in folders
    ]
    async with (
        running(settings[0]) as a,
        running(settings[1]) as b,
        peer(a) as on_a,
        peer(b) as on_b,
    ):
        try:
            await on_a.invoke("c1", "hog", {})
            await wait_thread(HOG_STARTED)
            await on_b.invoke("c1", "hog", {})
            await barrier(on_b)
        finally:
            HOG_RELEASE.set()
        first = await on_a.terminal("c1")
        answer = await on_b.terminal("c1")
        assert (first["type"], first["result"]) == ("result", {"hog": True})
        assert (answer["type"], answer["call_id"], answer["result"]) == (
            "result",
            "c1",
            {"hog": True},
        )
        assert [m for m in on_b.seen if m["type"] == "error"] == []
        await barrier(on_b)
        assert [m["type"] for m in on_b.seen if m.get("call_id") == "c1"] == ["result"]


# -- I12, I15: a session's own record outlives the ledger's window --------------------


async def test_i15_other_tool_same_call_id_after_the_ledger_purge_is_not_the_old_result(
    tmp_path: Path,
) -> None:
    """SPEC I15, I12: `c1` ran `quick`. The gateway's clock passes
    ``calls.call_id_window`` and the ledger purges `c1`: the id is new again. The same
    session then sends `c1` for another tool (`async_quick`): it runs, as a new call.
    Before, the session's own record answered with `quick`'s old result, as if it were
    the `async_quick` call's outcome."""
    et.reset()
    clock = Clock()
    gw = Gateway(et.settings(tmp_path, calls={"call_id_window": 60.0}), clock=clock)
    await gw.start()
    try:
        async with peer(gw) as p:
            await p.invoke("c1", "quick", {})
            assert (await p.terminal("c1"))["tool"] == "quick"
            clock.ahead = 61.0
            gw.outbox.flush()
            gw.pipeline.ledger.purge()
            assert gw.store.ledger("", "alice", "c1") is None
            await p.invoke("c1", "async_quick", {})
            answer = await p.terminal("c1")
            assert (answer["type"], answer["tool"], answer["result"]) == (
                "result",
                "async_quick",
                {"ran": "c1"},
            )
            assert RUNS == ["c1", "c1"]
    finally:
        await gw.drain()


# -- I12, I15, D6: call ids with odd characters (checked: holds) -----------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_i12_call_ids_with_nul_are_keys_like_any_other(
    tmp_path: Path,
    backend: str,
    pg_url: str,  # noqa: F811
) -> None:
    """SPEC I12, I15, D6 (holds): a call id holding U+0000, and one of 128 characters
    of 4 UTF-8 bytes each, run once, a re-send from another session of the principal
    gets the recorded outcome, and the store keeps serving every session."""
    et.reset()
    store = {"url": pg_url} if backend == "postgresql" else {}
    settings = et.settings(tmp_path, store=store)
    odd = ["a\x00b", "\U0001f600" * 128]
    async with running(settings) as gw:
        async with peer(gw) as p:
            for call_id in odd:
                await p.invoke(call_id, "quick", {})
                assert (await p.terminal(call_id))["type"] == "result"
        async with peer(gw) as q:
            for call_id in odd:
                await q.invoke(call_id, "quick", {})
                assert (await q.terminal(call_id))["result"] == {"ran": call_id}
            await q.invoke("n1", "quick", {})
            assert (await q.terminal("n1"))["type"] == "result"
        assert RUNS.count(odd[0]) == 1
        assert RUNS.count(odd[1]) == 1
