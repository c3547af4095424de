"""A drain sends every outcome it waited for before the ``reconnect`` hint and the 1012
close, and nothing after the hint (SPEC S4, J6, D1): the real server in a subprocess
stopped by SIGTERM, and the link's close on a real socket.

The handlers are :func:`tests.gateway.node_tools.gated`: each writes its call id to
``runs``, then waits, in its worker thread, for the test's ``go-<call_id>`` file, so
the test decides when a handler returns and no test sleeps to order events.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any

import yaml
from websockets.exceptions import ConnectionClosed

from protocol import messages as m
from protocol.codec import encode
from protocol.errors import CloseCode, ErrorCode
from tests.gateway.fair_tools import ServerProcess, server_process
from tests.gateway.node_tools import runs, until
from tests.support import (
    MS,
    WAIT,
    Peer,
    barrier,
    peer,
    peer_at,
    resume_fields,
    running,
    settings_for,
    write_token_file,
)

TOOLS = """
tools:
  - name: gated_call
    description: A plain sync handler that waits for the test's go file.
    capability: t.drain
    timeout: 0
    handler: tests.gateway.node_tools:gated
    parameters:
      type: object
      properties: {dir: {type: string}}
      required: [dir]
  - name: gated_job
    description: The same, as a job.
    capability: t.drain
    mode: async
    handler: tests.gateway.node_tools:gated
    parameters:
      type: object
      properties: {dir: {type: string}}
      required: [dir]
"""
PROFILES = "profiles:\n  demo:\n    capabilities: [t.drain]\n"


def _config(tmp: Path) -> Path:
    (tmp / "tools.yaml").write_text(TOOLS)
    (tmp / "profiles.yaml").write_text(PROFILES)
    config: dict[str, Any] = {
        "data_dir": str(tmp / "data"),
        "server": {"port": 0, "heartbeat_interval": 0, "drain_grace": WAIT},
        "auth": {"token_file": str(write_token_file(tmp))},
        "catalog": {
            "tools": [str(tmp / "tools.yaml")],
            "profiles": [str(tmp / "profiles.yaml")],
            "hot_reload": False,
        },
        "log": {"level": "INFO", "json_logs": True},
    }
    path = tmp / "toolbus.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def _refused(port: int) -> bool:
    """Whether 127.0.0.1:``port`` refuses a connection (a drain closed the port)."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


async def _draining(srv: ServerProcess) -> None:
    """SIGTERM, then wait until the server has closed its port: the drain began."""
    srv.proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(WAIT):
        # The port is the server's state; nothing else announces the drain's start.
        while not await _refused(srv.port):  # noqa: ASYNC110
            await asyncio.sleep(5 * MS)


async def _frames_to_the_close(p: Peer) -> tuple[list[str], int]:
    """Every frame type received until the close, and the close code."""
    async with asyncio.timeout(WAIT):
        while True:
            try:
                await p.recv()
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else -1
                return [m["type"] for m in p.seen], code


async def test_s4_j6_a_result_that_ends_within_the_grace_comes_before_the_hint(
    tmp_path: Path,
) -> None:
    """SPEC S4, J6, D1: SIGTERM while the plain handler of sync call `c1` waits for its
    go file; the drain has begun (the port is closed) when it is released, within the
    grace. On the socket `c1`'s `result` comes before the `reconnect` hint, which is
    the last frame, then the 1012 close. Before, the drain sent the hint as soon as the
    worker thread was free, ahead of the result, which a client that obeys the hint at
    once could miss on this socket."""
    async with server_process(_config(tmp_path)) as srv, peer_at(srv.url) as p:
        await p.invoke("c1", "gated_call", {"dir": str(tmp_path)})
        await until(lambda: runs(tmp_path) == ["c1"], "c1's handler runs")
        await _draining(srv)
        (tmp_path / "go-c1").touch()
        kinds, code = await _frames_to_the_close(p)
        async with asyncio.timeout(WAIT):
            assert await srv.proc.wait() == 0
    assert code == 1012
    assert kinds[-2:] == ["result", "reconnect"], kinds
    assert kinds.count("reconnect") == 1, kinds
    assert p.seen[-2]["call_id"] == "c1"
    assert p.seen[-2]["result"] == {"summary": "c1 done"}


async def test_s4_nothing_pushed_after_the_close_began_follows_the_hint(tmp_path: Path) -> None:
    """SPEC S4, D1: the drain queues the ``reconnect`` hint on a socket and starts its
    close (``Link.flush_and_close``); a frame pushed after that, before the close's
    coroutine first runs (an event emitted in the same loop turn), is not sent: the
    hint stays the last frame before 1012 (the event is in the log, for the next
    socket). Before, the link took frames until that coroutine's first step, so they
    went out after the hint."""
    async with running(settings_for(tmp_path)) as gw, peer(gw) as p:
        await barrier(p)
        [handler] = [h for h in gw.handlers if h.session is not None]
        hint = encode(m.Reconnect(reason="server restart", retry_after=0.0))
        handler.link.push(hint)
        closing = handler.link.flush_and_close(CloseCode.SERVICE_RESTART, "server restart")
        handler.link.push(encode(m.Error(id="late", code=ErrorCode.UNAVAILABLE, message="late")))
        await closing
        kinds, code = await _frames_to_the_close(p)
    assert code == 1012
    assert kinds[-1] == "reconnect", kinds
    assert "error" not in kinds, kinds


async def test_s4_a_close_under_way_ends_when_its_socket_goes_first(tmp_path: Path) -> None:
    """SPEC S4: the drain starts a socket's close (``Link.flush_and_close``, here with a
    grace of an hour) while the peer has stopped reading, so frames stay queued; the
    connection then ends (a client leaving at that moment): its handler detaches the
    link before the blocked writer hears of it. The close under way ends then: nothing
    queued will ever be sent. Before, it waited out its whole grace (5 s by default): at
    every drain where a client left at that moment, and in many of the test suite's
    teardowns (the suite took 34 minutes instead of 13)."""
    settings = settings_for(tmp_path, server={"max_outbound_bytes": 1 << 30})
    async with running(settings) as gw, peer(gw) as p:
        await barrier(p)
        [handler] = [h for h in gw.handlers if h.session is not None]
        p.ws.transport.pause_reading()  # the peer stops reading; the buffers fill up
        link = handler.link
        big = encode(m.Error(id="x", code=ErrorCode.UNAVAILABLE, message="x" * (1 << 18)))
        link.push_many([big] * 64)  # 16 MB: more than the socket buffers take
        link.push_many([big] * 4)  # these wait in the link's queue, behind the buffer
        assert link.queued_bytes > 0
        closing = asyncio.ensure_future(
            link.flush_and_close(CloseCode.SERVICE_RESTART, "server restart", grace=3600)
        )
        await asyncio.sleep(0)
        assert not closing.done()
        # The connection ends: its handler detaches the link (before the writer hears of
        # it), and the client's side is gone.
        link.detach()
        p.ws.transport.abort()
        async with asyncio.timeout(WAIT):
            await asyncio.gather(closing, return_exceptions=True)
        assert link.closed


D1_TOOLS = (
    TOOLS
    + """
  - name: gated_approval
    description: The plain handler behind an approval.
    capability: t.drain
    timeout: 0
    requires_approval: true
    handler: tests.gateway.node_tools:gated
    parameters:
      type: object
      properties: {dir: {type: string}}
      required: [dir]
  - name: coro_call
    description: An async def sync handler that waits for the test's go file.
    capability: t.drain
    timeout: 0
    handler: tests.gateway.test_s4_drain_order:await_go
    parameters:
      type: object
      properties: {dir: {type: string}}
      required: [dir]
  - name: coro_job
    description: The same, as a job.
    capability: t.drain
    mode: async
    handler: tests.gateway.test_s4_drain_order:await_go
    parameters:
      type: object
      properties: {dir: {type: string}}
      required: [dir]
"""
)


async def await_go(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """An ``async def`` handler: record its start, then wait for ``go-<call_id>``."""
    folder = Path(params["dir"])
    with (folder / "runs").open("a") as started:
        started.write(ctx.call_id + "\n")
    # The tool's own wait on a file another process writes: no event to await.
    while not (folder / f"go-{ctx.call_id}").exists():  # noqa: ASYNC110
        await asyncio.sleep(5 * MS)
    return {"summary": f"{ctx.call_id} done"}


async def test_s4_d1_d3_every_event_of_a_drain_is_replayed_once_in_order_after_restart(
    tmp_path: Path,
) -> None:
    """SPEC S4, D1, D3: SIGTERM while a plain sync call, a plain job, a gated call
    waiting for approval, an ``async def`` sync call and an ``async def`` job are in
    flight; the plain ones end within the grace. After the drain a restarted server
    resumes the session from ``last_seq`` 0: every event seen on the drained socket
    is replayed with the same seq and type, the replay is gap-free from 1, each seq
    once, in order, and nothing seen live is missing from it."""
    config = _config(tmp_path)
    (tmp_path / "tools.yaml").write_text(D1_TOOLS)
    folder = {"dir": str(tmp_path)}
    async with server_process(config) as srv, peer_at(srv.url) as p:
        await p.invoke("c1", "gated_call", folder)
        await p.invoke("j1", "gated_job", folder)
        await p.invoke("a1", "coro_call", folder)
        await p.invoke("k1", "coro_job", folder)
        await p.invoke("g1", "gated_approval", folder)
        await p.expect("tool_start", call_id="g1")
        await until(lambda: sorted(runs(tmp_path)) == ["a1", "c1", "j1", "k1"], "all run")
        fields = resume_fields(p, 0)
        await _draining(srv)
        (tmp_path / "go-c1").touch()
        (tmp_path / "go-j1").touch()
        kinds, code = await _frames_to_the_close(p)
        async with asyncio.timeout(WAIT):
            assert await srv.proc.wait() == 0
    assert code == 1012
    assert kinds[-1] == "reconnect", kinds
    live = {msg["seq"]: msg for msg in p.seen if "seq" in msg}
    async with server_process(config) as srv, peer_at(srv.url, **fields) as q:
        assert q.welcome["resumed"] is True, q.welcome
        replay = [msg for msg in await barrier(q) if "seq" in msg]
    seqs = [msg["seq"] for msg in replay]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    for seq, msg in live.items():
        assert seq in seqs, (seq, msg["type"], seqs)
        assert replay[seq - 1]["type"] == msg["type"], (seq, msg, replay[seq - 1])
    ended = {(msg["type"], msg.get("call_id")) for msg in replay}
    assert ("result", "c1") in ended, replay
    assert any(kind == "job.done" and call == "j1" for kind, call in ended), replay
