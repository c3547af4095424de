"""Tools, a catalog and a TCP proxy for the call-ledger and handler-output tests
(SPEC I15, I16; cases F16, F21).

Handlers count each run by appending a line to a file in ``ctx.data_dir`` (the count
survives a restart of the gateway in the same folder) and block on events the test
controls, so no test sleeps to order events. :class:`TcpProxy` stands between a client
and the gateway and cuts the network path for real: it aborts both TCP connections
(RST) and refuses new ones until restored.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from gateway.context import ToolContext
from gateway.failures import ToolFailure
from protocol.errors import ErrorCode
from tests.support import WAIT, settings_for

TOOLS_YAML = """
tools:
  - name: charge
    description: Charge an amount; appends a line to charges.txt, then sleeps 2 s.
    capability: t.ledger
    handler: tests.gateway.ledger_tools:charge
    parameters:
      type: object
      properties:
        amount: {type: integer}
      required: [amount]
      additionalProperties: false
  - name: held_charge
    description: Charge an amount; appends a line, then waits for the test's release.
    capability: t.ledger
    handler: tests.gateway.ledger_tools:held_charge
    timeout: 0
    parameters:
      type: object
      properties:
        amount: {type: integer}
      additionalProperties: false
  - name: crash_charge
    description: An async def charge that appends a line, then kills its own process
      (SIGKILL) before any await, so no commit runs between its start and the crash.
    capability: t.ledger
    handler: tests.gateway.ledger_tools:crash_charge
    parameters: &crash_params
      type: object
      properties:
        amount: {type: integer}
      additionalProperties: false
  - name: crash_gated
    description: crash_charge behind the user's approval.
    capability: t.ledger
    requires_approval: true
    handler: tests.gateway.ledger_tools:crash_charge
    parameters: *crash_params
  - name: crash_gated_idempotent
    description: crash_charge behind the user's approval, declared idempotent (no ledger
      row need be durable before it; the decision still must be, SPEC A3).
    capability: t.ledger
    requires_approval: true
    idempotent: true
    handler: tests.gateway.ledger_tools:crash_charge
    parameters: *crash_params
  - name: held_async
    description: An async def charge; appends a line, then waits for the test's release.
    capability: t.ledger
    handler: tests.gateway.ledger_tools:held_async
    timeout: 0
    parameters:
      type: object
      properties:
        amount: {type: integer}
      additionalProperties: false
  - name: bad_value
    description: Return a value JSON cannot carry, chosen by kind.
    capability: t.ledger
    handler: tests.gateway.ledger_tools:bad_value
    parameters:
      type: object
      properties:
        kind: {type: string}
      required: [kind]
  - name: bad_value_async
    description: The same from an async def handler.
    capability: t.ledger
    handler: tests.gateway.ledger_tools:bad_value_async
    parameters:
      type: object
      properties:
        kind: {type: string}
      required: [kind]
  - name: raise_base
    description: Raise a BaseException subclass that is neither cancellation nor exit.
    capability: t.ledger
    handler: tests.gateway.ledger_tools:raise_base
  - name: raise_base_job
    description: A job whose plain handler raises a BaseException subclass.
    capability: t.ledger
    mode: async
    handler: tests.gateway.ledger_tools:raise_base
  - name: wide_job
    description: An async tool whose result holds 2**70, once the test releases it.
    capability: t.ledger
    mode: async
    handler: tests.gateway.ledger_tools:wide_job
  - name: good_job
    description: An async tool with a plain result, once the test releases it.
    capability: t.ledger
    mode: async
    handler: tests.gateway.ledger_tools:good_job
  - name: odd_text_job
    description: A job whose handler raises with a lone surrogate in its message (a file
      name decoded with surrogateescape).
    capability: t.ledger
    mode: async
    handler: tests.gateway.ledger_tools:odd_text_job
    parameters:
      type: object
      properties:
        typed: {type: boolean}
  - name: raise_odd_text
    description: The same from a sync call's plain handler.
    capability: t.ledger
    handler: tests.gateway.ledger_tools:raise_odd_text
  - name: gated_peek
    description: Behind the user's approval; an async def that notes how many frames
      the gateway's outbox holds for its next flush when it starts, and returns.
    capability: t.ledger
    requires_approval: true
    handler: tests.gateway.ledger_tools:gated_peek
  - name: held_job
    description: An async tool that notes how many frames the gateway's outbox holds
      when its handler starts, then waits for the test's release.
    capability: t.ledger
    mode: async
    handler: tests.gateway.ledger_tools:held_job
  - name: mark_job
    description: An async job whose coroutine handler appends its call id to
      charges.txt.
    capability: t.ledger
    mode: async
    handler: tests.gateway.ledger_tools:mark_async
  - name: mark_job_plain
    description: The same with a plain handler (a worker thread).
    capability: t.ledger
    mode: async
    handler: tests.gateway.ledger_tools:mark_plain
  - name: burst_job
    description: An async tool that, once the test releases it, notes how many frames
      the gateway's outbox holds for its next flush, and ends.
    capability: t.ledger
    mode: async
    handler: tests.gateway.ledger_tools:burst_job
"""

PROFILES_YAML = """
profiles:
  demo:
    capabilities: [t.ledger]
"""

BAD_VALUES: dict[str, Any] = {
    "wide_int": {"n": 2**70},
    "negative_wide_int": {"n": -(2**64)},
    "int_key": {1: "one"},
    "nested_int_key": {"a": {2: "two"}},
    "set": {"s": {1, 2}},
    "bytes": {"b": b"\x00"},
    "decimal": {"d": Decimal("1.5")},
    "object": {"o": object()},
    "bare_set": {3},
}
"""Handler values the codec cannot send (SPEC I16), by ``kind``."""

BAD_PROBLEMS: dict[str, str] = {
    "wide_int": "result.n: integer 1180591620717411303424 is wider than 64 bits",
    "negative_wide_int": "result.n: integer -18446744073709551616 is wider than 64 bits",
    "int_key": "result: key 1 is not a string (type int)",
    "nested_int_key": "result.a: key 2 is not a string (type int)",
    "set": "result.s: a value of type set is not JSON",
    "bytes": "result.b: a value of type bytes is not JSON",
    "decimal": "result.d: a value of type Decimal is not JSON",
    "object": "result.o: a value of type object is not JSON",
    "bare_set": "result.value: a value of type set is not JSON",
}
"""The problem each bad value is named by in its ``handler_error``."""


class Gate:
    """Events the handlers wait on, reset per test."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()
        self.jobs = asyncio.Event()
        self.outbox: Any = None
        """The gateway's outbox, for :func:`burst_job` (the test sets it)."""
        self.queued: list[int] = []
        """What each :func:`burst_job` saw queued when it woke, in wake order (and
        :func:`gated_peek` and :func:`held_job` when they started)."""
        self.expected = 0
        self.all_started = asyncio.Event()
        """Set once :attr:`expected` :func:`held_job` handlers have started."""


GATE = Gate()


def reset() -> Gate:
    global GATE
    GATE = Gate()
    return GATE


def runs(data_dir: Path, name: str = "charges.txt") -> list[str]:
    """The lines the handlers appended: one per execution."""
    path = data_dir / name
    return path.read_text().splitlines() if path.exists() else []


def _append(ctx: ToolContext, line: str) -> None:
    with (Path(ctx.data_dir) / "charges.txt").open("a") as f:
        f.write(line + "\n")


def charge(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Case F16's tool: one line per run, then 2 s of work."""
    _append(ctx, f"{ctx.call_id} {params['amount']}")
    GATE.started.set()
    time.sleep(2.0)
    GATE.finished.set()
    return {"charged": params["amount"]}


def held_charge(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    _append(ctx, f"{ctx.call_id} {params.get('amount', 1)}")
    GATE.started.set()
    GATE.release.wait(WAIT * 3)
    return {"charged": params.get("amount", 1)}


async def crash_charge(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """One line per run, then the process dies at once (a real SIGKILL, no clean-up):
    the call's rows are in the store's intent journal only (SPEC I15)."""
    _append(ctx, f"{ctx.call_id} {params.get('amount', 1)}")
    os.kill(os.getpid(), signal.SIGKILL)
    return {"charged": params.get("amount", 1)}


async def held_async(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    _append(ctx, f"{ctx.call_id} {params.get('amount', 1)}")
    await GATE.jobs.wait()
    return {"charged": params.get("amount", 1)}


def bad_value(params: dict[str, Any], ctx: ToolContext) -> Any:
    return BAD_VALUES[params["kind"]]


async def bad_value_async(params: dict[str, Any], ctx: ToolContext) -> Any:
    return BAD_VALUES[params["kind"]]


class Boom(BaseException):
    """A BaseException that is neither cancellation nor exit (SPEC I16)."""


def raise_base(params: dict[str, Any], ctx: ToolContext) -> None:
    raise Boom("out of band")


async def wide_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    await GATE.jobs.wait()
    return {"summary": "x", "n": 2**70}


async def good_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    await GATE.jobs.wait()
    return {"summary": "fine", "n": 7}


ODD_NAME = b"report-\xff.txt".decode("utf-8", "surrogateescape")
"""``'report-\\udcff.txt'``: text JSON cannot carry."""


async def odd_text_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    if params.get("typed"):
        raise ToolFailure(ErrorCode.UNAVAILABLE, f"cannot open {ODD_NAME}")
    raise FileNotFoundError(f"cannot open {ODD_NAME}")


def raise_odd_text(params: dict[str, Any], ctx: ToolContext) -> None:
    raise FileNotFoundError(f"cannot open {ODD_NAME}")


async def gated_peek(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    GATE.queued.append(GATE.outbox.queued)
    return {"ok": True}


async def mark_async(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    _append(ctx, ctx.call_id)
    return {"ok": True}


def mark_plain(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    _append(ctx, ctx.call_id)
    return {"ok": True}


async def held_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    GATE.queued.append(GATE.outbox.queued)
    if len(GATE.queued) == GATE.expected:
        GATE.all_started.set()
    await GATE.jobs.wait()
    return {"ok": True}


async def burst_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    await GATE.jobs.wait()
    GATE.queued.append(GATE.outbox.queued)
    return {"summary": "done"}


def ledger_settings(tmp: Path, **sections: Any) -> Any:
    """Settings for a gateway on this catalog (``sections`` merge over the defaults)."""
    tools, profiles = tmp / "tools.yaml", tmp / "profiles.yaml"
    tools.write_text(TOOLS_YAML)
    profiles.write_text(PROFILES_YAML)
    catalog = {"tools": [tools], "profiles": [profiles], "hot_reload": False}
    return settings_for(tmp, catalog=catalog, **sections)


def jobs_at_once(tmp: Path, jobs: int) -> Any:
    """:func:`ledger_settings` where one session may run ``jobs`` jobs at once and send
    as many invokes in one burst."""
    return ledger_settings(
        tmp,
        jobs={"max_concurrent": jobs, "max_per_session": jobs, "max_per_user": jobs},
        limits={"invoke_burst": jobs, "max_inflight_calls": jobs},
    )


def invoke_in_one_write(ws: Any, tool: str, call_ids: list[str]) -> None:
    """Send one ``invoke`` of ``tool`` per call id in a single TCP write on the client
    connection ``ws``: the server reads them all in one loop turn."""
    for call_id in call_ids:
        invoke = {"type": "invoke", "call_id": call_id, "tool": tool}
        ws.protocol.send_text(orjson.dumps(invoke))
    ws.send_data()


class TcpProxy:
    """A TCP relay on 127.0.0.1 whose path can be cut (RST both ways) and restored.

    While cut, a new connection is accepted and aborted at once, as a dead path would
    refuse it. :attr:`target` may change (a restarted gateway listens elsewhere).
    """

    def __init__(self, target: int) -> None:
        self.target = target
        self.down = False
        self.cut_before: bytes | None = None
        """When set, the path dies just before server bytes holding it would pass."""
        self.port = 0
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def cut(self) -> None:
        """The path dies: every relayed connection is reset, new ones are refused."""
        self.down = True
        for a, b in list(self._pairs):
            a.transport.abort()
            b.transport.abort()
        self._pairs.clear()

    def restore(self) -> None:
        self.down = False

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        pumps = [self._pump(reader, up_writer), self._pump(up_reader, writer, server=True)]
        for coro in pumps:
            task = asyncio.get_running_loop().create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: bool = False
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                if server and self.cut_before is not None and self.cut_before in data:
                    # Server frames are not masked (RFC 6455 section 5.1): visible here.
                    self.cut_before = None
                    self.cut()
                    return
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
