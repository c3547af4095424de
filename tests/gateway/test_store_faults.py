"""Storage faults fail closed (SPEC D6): a held lock, a full disk, random commit failures.

Every test here reads each durable frame's event back from the store the moment the
client receives it (:class:`tests.gateway.store_faults.CheckedPeer`): a frame whose
event is not committed was sent, and fails the test. Afterwards every session's log is
gap-free and a resume from every ``last_seq`` replays exactly what was received.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import random
import subprocess
import sys
import time
from asyncio.subprocess import PIPE
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from websockets.exceptions import ConnectionClosed

from gateway.outbox import CommitFailures
from gateway.server import Gateway
from gateway.store import SqliteStore, Store, StoreUnavailable
from tests.gateway.store_faults import (
    LOCKER,
    CheckedPeer,
    FlakyStore,
    Stored,
    checked_peer,
    first_commit_fails,
    resumes_agree,
    stored_in,
    unhandled,
    until,
)
from tests.gateway.test_http import http_get
from tests.support import CONVERT, WAIT, resume_fields, settings_for

UNAVAILABLE_AFTER = 0.5
"""The store's configured wait in these tests (``store.unavailable_after``), seconds."""
PROMPT = 0.25
"""Longest a request may wait for its first answer while the store is down, seconds:
the event loop never waits on the store, so this is scheduling slack only."""


def _settings(tmp: Path, data_dir: Path | None = None) -> object:
    return settings_for(
        tmp,
        data_dir=data_dir or tmp / "data",
        store={"unavailable_after": UNAVAILABLE_AFTER, "retry_max": 0.05},
    )


async def _answered(p: CheckedPeer, request: dict[str, object]) -> tuple[dict[str, object], float]:
    """Send ``request`` and return its first answer (a reply or an error naming its id or
    call id) and the seconds it took."""
    started = time.monotonic()
    await p.send(request)
    key = request.get("call_id")
    async with asyncio.timeout(WAIT):
        while True:
            message = await p.recv()
            if message.get("id") == request.get("id") and "seq" not in message:
                return message, time.monotonic() - started
            if key is not None and message.get("call_id") == key:
                return message, time.monotonic() - started


async def _outage_checks(gw: Gateway, peers: list[CheckedPeer], n: int) -> None:
    """While the store cannot commit: the loop answers at once, new calls are refused
    ``unavailable`` after the configured wait, and /readyz says not ready."""
    for i, p in enumerate(peers):
        reply, took = await _answered(p, {"type": "grants.list", "id": f"g{n}{i}"})
        assert reply["type"] == "grants"
        assert took < PROMPT, f"the event loop stalled {took:.3f} s behind the store"
    if gw.outbox.unavailable:
        for i, p in enumerate(peers):
            call = {"type": "invoke", "id": f"r{n}{i}", "call_id": f"late{n}{i}"}
            reply, took = await _answered(p, {**call, "tool": "convert_units", "params": CONVERT})
            assert reply == {
                "type": "error",
                "id": f"r{n}{i}",
                "code": "unavailable",
                "message": "the store cannot commit right now; try again later",
                "details": {"call_id": f"late{n}{i}"},
            }
            assert took < PROMPT
        status, _, body = await http_get(gw, "/readyz")
        assert (status, body) == (503, b"store unavailable\n")


async def _held_calls_then_outage(gw: Gateway, a: CheckedPeer, b: CheckedPeer) -> None:
    """Both sessions invoke while commits fail: their events are held, never sent; after
    the configured wait new calls are refused. (A flush journals its events and owes
    the commit, SPEC D1; the probe makes the first commit fail now, not when it is due.)"""
    await first_commit_fails(gw, a)
    await a.invoke("a1", "convert_units", CONVERT)
    await b.invoke("b1", "convert_units", CONVERT)
    await until(lambda: gw.outbox.held == 4, "tool_start and result of both calls held")
    await _outage_checks(gw, [a, b], 0)  # replies overtake held events; none was sent
    assert a.events.keys() == b.events.keys() == {1}
    await until(lambda: gw.outbox.unavailable, "the store declared unavailable")
    await _outage_checks(gw, [a, b], 1)


async def _after_recovery(gw: Gateway, peers: list[CheckedPeer]) -> None:
    """The held outcomes arrive, service resumes by itself, every log is whole."""
    for p, call_id in zip(peers, ("a1", "b1"), strict=True):
        outcome = await p.terminal(call_id)
        assert (outcome["type"], outcome["seq"]) == ("result", 3)
    await until(lambda: not gw.outbox.unavailable, "the store available again")
    status, _, body = await http_get(gw, "/readyz")
    assert (status, body) == (200, b"ready\n")
    for p in peers:
        await p.invoke("after", "convert_units", CONVERT)
        assert (await p.terminal("after"))["seq"] == 5
    for p in peers:
        await resumes_agree(gw, p)


async def test_case_f20_locked_store_never_stalls_nor_sends_unstored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SPEC D6, case F20: another process holds ``BEGIN IMMEDIATE`` on the SQLite file
    for 7 s while two sessions invoke a quick tool. Requests are answered at once (the
    loop never waits on the lock), calls are refused ``unavailable`` after the configured
    wait, no frame leaves before its event is committed, the held outcomes arrive after
    the lock is released, and every log is gap-free and replays from any ``last_seq``."""
    caplog.set_level(logging.INFO)
    gw = Gateway(_settings(tmp_path))  # type: ignore[arg-type]
    await gw.start()
    db = tmp_path / "data" / "toolbus.db"
    stored = stored_in(db)
    locker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LOCKER, str(db), stdin=PIPE, stdout=PIPE
    )
    try:
        async with checked_peer(gw, stored) as a, checked_peer(gw, stored, token="bob-token") as b:
            await a.expect("catalog")
            await b.expect("catalog")
            assert locker.stdout is not None
            line = await locker.stdout.readline()
            assert line == b"locked\n"
            held_since = time.monotonic()
            await _held_calls_then_outage(gw, a, b)
            n = 2
            while time.monotonic() - held_since < 7.0:  # the case's 7 s, calls all along
                await _outage_checks(gw, [a, b], n)
                n += 1
            assert locker.stdin is not None
            locker.stdin.write(b"release\n")
            await locker.stdin.drain()
            await _after_recovery(gw, [a, b])
    finally:
        if locker.returncode is None:
            locker.kill()
        await locker.communicate()  # reaps it and closes its pipes
        await gw.drain()
    assert gw.metrics.registry.get_sample_value("toolbus_store_commit_failures_total")
    assert unhandled(caplog.records) == []


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` at ``where`` (tests run as root); fail if not allowed."""
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.fail(
            f"the full-disk test mounts a tmpfs and needs root (CAP_SYS_ADMIN): "
            f"mount said {done.stderr.strip() or done.returncode}"
        )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last byte; returns the filler file."""
    filler = folder / "filler"
    with filler.open("wb", buffering=0) as out:
        for chunk in (1 << 16, 1 << 12, 1):
            full: OSError | None = None
            while full is None:
                try:
                    out.write(b"\0" * chunk)
                except OSError as exc:
                    full = exc
            assert full.errno == errno.ENOSPC
    return filler


async def test_full_disk_holds_events_then_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SPEC D6: on a full disk (a small tmpfs the test mounts) commits fail; nothing
    unstored is sent, calls are refused ``unavailable`` after the configured wait, and
    once space is freed the held events are written and sent and every log is whole."""
    caplog.set_level(logging.INFO)
    with small_tmpfs(tmp_path / "disk", "4m") as disk:
        data = disk / "data"
        settings = _settings(tmp_path, data)
        # No background checkpoint: it would restart the WAL, whose reused pages take
        # writes on a full disk; growing the WAL is what fails here.
        store = SqliteStore(data / "toolbus.db", checkpoint_interval=3600)
        gw = Gateway(settings, store=store)  # type: ignore[arg-type]
        await gw.start()
        stored = stored_in(data / "toolbus.db")
        try:
            async with (
                checked_peer(gw, stored) as a,
                checked_peer(gw, stored, token="bob-token") as b,
            ):
                await a.expect("catalog")
                await b.expect("catalog")
                filler = fill(disk)
                await _held_calls_then_outage(gw, a, b)
                os.unlink(filler)
                await _after_recovery(gw, [a, b])
        finally:
            await gw.drain()
    failures = gw.metrics.registry.get_sample_value("toolbus_store_commit_failures_total")
    assert failures is not None
    assert failures > 0
    assert unhandled(caplog.records) == []
    held = [r.getMessage() for r in caplog.records if "holding its events" in r.getMessage()]
    assert held
    assert "database or disk is full" in held[0]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_commit_failures_never_contradict_a_resume(tmp_path: Path, seed: int) -> None:
    """SPEC D6 property: whatever commits fail (at random, at the ``Store`` seam), every
    frame a client gets is in the log, calls are refused or run once, and drops and
    resumes from any point deliver exactly the log, gap-free."""
    rng = random.Random(seed)
    settings = settings_for(tmp_path, store={"unavailable_after": 0.02, "retry_max": 0.01})
    inner = SqliteStore(settings.data_dir / "toolbus.db")
    flaky = FlakyStore(inner, rng, failure_rate=0.4)
    gw = Gateway(settings, store=cast(Store, flaky))
    await gw.start()
    stored = stored_in(settings.data_dir / "toolbus.db")
    try:
        async with contextlib.AsyncExitStack() as stack:
            peers = await _random_traffic(stack, gw, stored, rng)
            flaky.failure_rate = 0.0  # now read back what was delivered under failures
            await until(lambda: gw.outbox.failing_since is None, "a good commit")
            for p in peers:
                await resumes_agree(gw, p)
    finally:
        await gw.drain()
    assert flaky.failures > 0


async def _random_traffic(
    stack: contextlib.AsyncExitStack, gw: Gateway, stored: Stored, rng: random.Random
) -> list[CheckedPeer]:
    """Three sessions (two of one user) make calls and drop and resume at random."""
    peers = [
        await _session(stack, gw, stored, token)
        for token in ("alice-token", "bob-token", "alice-token")
    ]
    for step in range(40):
        i = rng.randrange(len(peers))
        p = peers[i]
        if rng.random() < 0.15:
            # Drop and resume from a random point the client has seen.
            after = rng.randint(0, max(p.events, default=0))
            peers[i] = await _resumed(stack, gw, p, after)
            continue
        await _call_until_done(p, f"c{step}")
    return peers


async def _connect(
    stack: contextlib.AsyncExitStack, gw: Gateway, stored: Stored, **hello: Any
) -> CheckedPeer:
    """Say hello until it is accepted: while commits fail, a hello is refused
    ``unavailable`` and closed 1013 (SPEC D6), and the client tries again."""
    async with asyncio.timeout(WAIT):
        while True:
            try:
                return await stack.enter_async_context(checked_peer(gw, stored, **hello))
            except ConnectionClosed as exc:
                refused = exc
            assert refused.rcvd is not None, repr(refused)
            assert refused.rcvd.code == 1013, repr(refused)


async def _session(
    stack: contextlib.AsyncExitStack, gw: Gateway, stored: Stored, token: str
) -> CheckedPeer:
    p = await _connect(stack, gw, stored, token=token)
    await p.expect("catalog")
    return p


async def _resumed(
    stack: contextlib.AsyncExitStack, gw: Gateway, p: CheckedPeer, after: int
) -> CheckedPeer:
    """Drop ``p`` and resume its session from ``after``; what the first socket got and
    the replay re-sends must agree (CheckedPeer compares every seq)."""
    await p.ws.close()
    again = await _connect(stack, gw, p.stored, **p.hello_fields, **resume_fields(p, after))
    assert again.welcome["resumed"] is True
    again.events = {seq: event for seq, event in p.events.items() if seq <= after}
    known = dict(p.events)
    await again.send({"type": "grants.list", "id": "sync"})
    await again.expect("grants", id="sync")
    for seq, event in again.events.items():
        assert known.get(seq, event) == event
    return again


async def _call_until_done(p: CheckedPeer, call_id: str) -> None:
    """Invoke until the call is accepted (refusals ``unavailable`` are retried with the
    same call id) and its one terminal event arrived."""
    request: dict[str, object] = {
        "type": "invoke",
        "id": call_id,
        "call_id": call_id,
        "tool": "convert_units",
        "params": CONVERT,
    }
    async with asyncio.timeout(WAIT):
        message, _ = await _answered(p, request)
        while message["type"] == "error":
            assert message["code"] == "unavailable"
            message, _ = await _answered(p, request)
        if message["type"] == "tool_start":
            message = await p.terminal(call_id)
        assert message["type"] == "result"


def test_d6_a_long_run_of_failed_commits_keeps_its_retry_pause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SPEC D6: the pause before the next commit attempt doubles from 5 ms up to
    ``store.retry_max`` and stays there however long the store is down: the 1,025th
    attempt of a run raised OverflowError (0.005 * 2**1024 is no float), about 9 minutes
    into an outage at the default 0.5 s, and the retry timer was never armed again. The
    run is logged when it starts, when the store turns unavailable, and when it ends."""
    failures = CommitFailures(unavailable_after=1.0, retry_max=0.5, on_failure=None)
    exc = StoreUnavailable("store x: database is locked")
    start = time.monotonic() - 3600.0
    with caplog.at_level(logging.WARNING, logger="gateway.outbox"):
        pauses = [failures.failed(exc, start + n) for n in range(2000)]
        assert failures.unavailable
        failures.recovered(start + 2000.0, 7)
    assert pauses[:3] == [0.005, 0.01, 0.02]
    assert pauses[7:] == [0.5] * 1993
    assert (failures.since, failures.attempts, failures.unavailable) == (None, 0, False)
    assert [r.getMessage() for r in caplog.records] == [
        "store commit failed, holding its events and retrying: store x: database is locked",
        "store unavailable for 1.000 s, refusing new calls: store x: database is locked",
        "store commits again after 2000.000 s; 7 held events sent",
    ]
