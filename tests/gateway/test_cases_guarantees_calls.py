"""Any handler output ends the call (SPEC I16, case F21), and a property test of one
execution per call id through drops, expiries and restarts (SPEC I15).

Real gateway on 127.0.0.1, real websockets clients; handlers wait on events the test
sets, and count their runs in a file.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from gateway.server import Gateway
from protocol.errors import ErrorCode
from tests.gateway import ledger_tools as lt
from tests.gateway.test_call_ledger import ledger_gateway, wait_until
from tests.support import Peer, peer

PREFIX = "the handler's value cannot be sent: "


@pytest.mark.parametrize("tool", ["bad_value", "bad_value_async"])
@pytest.mark.parametrize("kind", sorted(lt.BAD_VALUES))
async def test_i16_unsendable_sync_result_ends_in_one_handler_error(
    tmp_path: Path, tool: str, kind: str
) -> None:
    """SPEC I16: a value JSON cannot carry (wide int, non-string key, set, bytes, Decimal,
    object) ends the call in one `call.error handler_error` naming the problem; a re-send
    returns that same frame; the session goes on."""
    async with ledger_gateway(tmp_path) as gw, peer(gw) as p:
        await p.invoke("v1", tool, {"kind": kind})
        err = await p.terminal("v1")
        assert (err["type"], err["code"]) == ("call.error", ErrorCode.HANDLER_ERROR)
        assert err["message"] == PREFIX + lt.BAD_PROBLEMS[kind]
        await p.invoke("v1", tool, {"kind": kind})
        assert await p.terminal("v1") == err
        await p.invoke("v2", "held_charge", {}, id="next")
        lt.GATE.release.set()
        assert (await p.terminal("v2"))["result"] == {"charged": 1}
        terminals = [x for x in p.seen if x.get("call_id") == "v1" and x["type"] != "tool_start"]
        assert terminals == [err, err]


async def test_i16_base_exception_ends_the_call_handler_error(tmp_path: Path) -> None:
    """SPEC I16: a BaseException subclass other than cancellation and exit, raised by a
    plain handler, ends the call `handler_error`; the server keeps serving."""
    async with ledger_gateway(tmp_path) as gw, peer(gw) as p:
        await p.invoke("b1", "raise_base")
        err = await p.terminal("b1")
        assert (err["code"], err["message"]) == (ErrorCode.HANDLER_ERROR, "Boom: out of band")
        await p.invoke("b1", "raise_base")
        assert await p.terminal("b1") == err


async def test_i16_base_exception_in_a_job_ends_it_failed(tmp_path: Path) -> None:
    """SPEC I16, J4: the same raise from a job's threaded handler ends the job in one
    `job.failed handler_error`."""
    async with ledger_gateway(tmp_path) as gw, peer(gw) as p:
        await p.invoke("j1", "raise_base_job")
        job_id = (await p.terminal("j1"))["job_id"]
        failed = await p.expect("job.failed", job_id=job_id)
        assert failed["error"] == {"code": "handler_error", "message": "Boom: out of band"}
        stored = gw.store.job(job_id)
        assert stored is not None
        assert stored.state == "failed"


async def test_i16_a_job_whose_error_text_json_cannot_carry_still_ends(tmp_path: Path) -> None:
    """SPEC I16, J4, J5 (found in review): a job's handler raises with a lone surrogate
    in its message (a file name decoded with `surrogateescape`). The job ends in one
    `job.failed handler_error` with the surrogate escaped, its row says failed; it used
    to stay `running` for ever (the message could not be encoded). A sync call's
    `call.error` carries the same escaped text, and so does a job's typed failure
    (`ToolFailure`, SPEC M2) with its own code."""
    escaped = "FileNotFoundError: cannot open report-\\udcff.txt"
    async with ledger_gateway(tmp_path) as gw, peer(gw) as p:
        await p.invoke("j1", "odd_text_job")
        job_id = (await p.terminal("j1"))["job_id"]
        failed = await p.expect("job.failed", job_id=job_id)
        assert failed["error"] == {"code": "handler_error", "message": escaped}
        stored = gw.store.job(job_id)
        assert stored is not None
        assert (stored.state, stored.error) == ("failed", failed["error"])
        await p.invoke("s1", "raise_odd_text")
        err = await p.terminal("s1")
        assert (err["code"], err["message"]) == (ErrorCode.HANDLER_ERROR, escaped)
        await p.invoke("j2", "odd_text_job", {"typed": True})
        job_id = (await p.terminal("j2"))["job_id"]
        failed = await p.expect("job.failed", job_id=job_id)
        text = "cannot open report-\\udcff.txt"
        assert failed["error"] == {"code": ErrorCode.UNAVAILABLE, "message": text}


async def test_case_f21_unsendable_results_end_once_and_others_are_delivered(
    tmp_path: Path,
) -> None:
    """Case F21 / SPEC I16, D6: a plain tool returns {"n": 2**70} -> one `call.error
    handler_error`; an async tool returns {"summary": "x", "n": 2**70} while another
    user's job finishes in the same loop turn (one commit) -> one `job.failed` naming the
    problem, and the other user's `job.done` is stored and delivered. Re-sending either
    invoke returns its same terminal reply."""
    async with (
        ledger_gateway(tmp_path) as gw,
        peer(gw) as alice,
        peer(gw, token="bob-token") as bob,
    ):
        await alice.invoke("s1", "bad_value", {"kind": "wide_int"})
        sync_err = await alice.terminal("s1")
        assert (sync_err["type"], sync_err["code"]) == ("call.error", ErrorCode.HANDLER_ERROR)
        assert sync_err["message"] == PREFIX + lt.BAD_PROBLEMS["wide_int"]

        await alice.invoke("a1", "wide_job")
        dispatched = await alice.terminal("a1")
        await bob.invoke("g1", "good_job")
        bob_dispatched = await bob.terminal("g1")
        # Both handlers wait on one event: they return in the same loop turn, so their
        # terminal events share one commit.
        lt.GATE.jobs.set()
        failed = await alice.expect("job.failed", job_id=dispatched["job_id"])
        assert failed["error"] == {
            "code": "handler_error",
            "message": PREFIX + "result.n: integer 1180591620717411303424 is wider than 64 bits",
        }
        done = await bob.expect("job.done", job_id=bob_dispatched["job_id"])
        assert (done["summary"], done["result"]) == ("fine", {"n": 7})
        stored = gw.store.job(bob_dispatched["job_id"])
        assert stored is not None
        assert (stored.state, stored.result) == ("done", {"n": 7})
        mine = gw.store.job(dispatched["job_id"])
        assert mine is not None
        assert (mine.state, mine.result, mine.error) == ("failed", None, failed["error"])

        await alice.invoke("s1", "bad_value", {"kind": "wide_int"})
        assert await alice.terminal("s1") == sync_err
        await alice.invoke("a1", "wide_job")
        assert await alice.terminal("a1") == dispatched
        events = [x for x in alice.seen if x.get("job_id") == dispatched["job_id"]]
        assert [x["type"] for x in events] == ["dispatched", "job.failed", "dispatched"]
        # From another session of the principal: the same outcome, its own seq (SPEC I15).
        async with peer(gw) as again:
            await again.invoke("s1", "bad_value", {"kind": "wide_int"})
            other = await again.terminal("s1")
            assert {k: v for k, v in other.items() if k != "seq"} == {
                k: v for k, v in sync_err.items() if k != "seq"
            }


# -- SPEC I15 property: never twice -------------------------------------------------------

CALL_IDS = ("p0", "p1", "p2")
OPS = ("send", "send", "drop", "expire", "restart", "release")


class Driver:
    """One principal's client through random drops, expiries and restarts (SPEC I15)."""

    def __init__(self, tmp: Path, rng: random.Random) -> None:
        self.settings = lt.ledger_settings(tmp, sessions={"resume_window": 0.2})
        self.rng = rng
        self.gw: Gateway | None = None
        self.conn: Any = None
        self.peer: Peer | None = None
        self.resume: dict[str, Any] = {}

    async def start(self) -> None:
        self.gw = Gateway(self.settings)
        await self.gw.start()

    async def stop(self) -> None:
        await self.disconnect()
        if self.gw is not None:
            await self.gw.drain()
            self.gw = None

    async def connect(self) -> Peer:
        if self.peer is not None:
            return self.peer
        assert self.gw is not None
        self.conn = peer(self.gw, **self.resume)
        p = await self.conn.__aenter__()
        welcome = p.welcome
        self.resume = {
            "session_id": welcome["session_id"],
            "resume_token": welcome["resume_token"],
            "last_seq": welcome["last_seq"],
        }
        self.peer = p
        return p

    async def disconnect(self) -> None:
        if self.peer is not None:
            self.peer.ws.transport.abort()
            await self.conn.__aexit__(None, None, None)
            self.peer = None

    async def step(self, op: str) -> None:
        assert self.gw is not None
        if op == "send":
            p = await self.connect()
            call_id = self.rng.choice(CALL_IDS)
            await p.invoke(call_id, "held_async", {"amount": CALL_IDS.index(call_id)})
        elif op == "drop":
            await self.disconnect()
        elif op == "expire":
            await self.disconnect()
            session_id = self.resume.get("session_id")
            gw = self.gw
            await wait_until(lambda: gw.sessions.get(session_id) is None, "expiry")
        elif op == "restart":
            await self.stop()
            await self.start()
        else:
            lt.GATE.jobs.set()


@pytest.mark.parametrize("seed", range(8))
async def test_i15_property_drops_expiries_restarts_never_run_a_call_twice(
    tmp_path: Path, seed: int
) -> None:
    """SPEC I15: any interleaving of re-sends, dropped sockets, expired sessions and
    server restarts runs each call id at most once; a final re-send from a new session
    gets one terminal reply per call id that ran (its result, or the restart's
    `cancelled`)."""
    rng = random.Random(seed)
    lt.reset()
    driver = Driver(tmp_path, rng)
    await driver.start()
    try:
        for op in [rng.choice(OPS) for _ in range(10)]:
            await driver.step(op)
        lt.GATE.jobs.set()
        await driver.disconnect()
        driver.resume = {}
        p = await driver.connect()
        runs = lt.runs(driver.settings.data_dir)
        counts = {call_id: sum(r.startswith(call_id + " ") for r in runs) for call_id in CALL_IDS}
        assert max(counts.values()) <= 1, (seed, runs)
        for call_id in CALL_IDS:
            params = {"amount": CALL_IDS.index(call_id)}
            await p.invoke(call_id, "held_async", params)
            answer = await p.terminal(call_id)
            if answer["type"] == "result":
                assert answer["result"] == {"charged": params["amount"]}
            else:
                assert (answer["type"], answer["code"]) == ("call.error", ErrorCode.CANCELLED)
        await driver.disconnect()
    finally:
        await driver.stop()
    runs = lt.runs(driver.settings.data_dir)
    assert sorted(runs) == sorted(set(runs)), (seed, runs)
    assert {r.split()[0] for r in runs} == set(CALL_IDS)
