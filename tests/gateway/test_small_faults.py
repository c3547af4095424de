"""Smaller faults of issue kind 9, each with the structural fix that rules out its kind:
background tasks are always referenced, maintenance loops survive their faults, a
malformed token file on hot reload keeps the previous one, and server frames fit the
``max_message_bytes`` the server announces (SPEC E2, C3, D2, S2, J3).
"""

from __future__ import annotations

import ast
import asyncio
import gc
import logging
import os
import shutil
import sqlite3
import sys
from collections.abc import Iterable
from pathlib import Path

import orjson
import yaml
from websockets.asyncio.client import connect

import tests.gateway.tools_for_tests as tt
from gateway.catalog_state import CatalogState
from gateway.config import DEMO_DIR
from gateway.framesize import ENVELOPE, payload_budget
from gateway.session import Session
from gateway.tasks import TaskSet
from protocol import messages as m
from protocol.codec import encode
from tests.support import MS, WAIT, peer, running, settings_for

ROOT = Path(__file__).resolve().parents[2]


def _bump(path: Path, text: str) -> None:
    """Rewrite a file with a modification time clearly after the previous one."""
    stat = path.stat()
    path.write_text(text)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


class _Records(logging.Handler):
    """Collects a logger's records and wakes waiters on each one (no polling)."""

    def __init__(self, logger: str, level: int) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []
        self._changed = asyncio.Event()
        self._logger = logging.getLogger(logger)

    def __enter__(self) -> _Records:
        self._previous = self._logger.level
        self._logger.setLevel(min(self.level, self._logger.getEffectiveLevel()))
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._previous)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self._changed.set()

    def at(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]

    async def until(self, level: int, count: int = 1) -> None:
        """Wait for ``count`` records of ``level``; fails after :data:`WAIT` seconds."""
        async with asyncio.timeout(WAIT):
            while len(self.at(level)) < count:
                self._changed.clear()
                await self._changed.wait()


# -- (a) background tasks -----------------------------------------------------------------


def _discarded_tasks(tree: ast.AST) -> Iterable[int]:
    """Lines where a ``create_task``/``ensure_future`` result is thrown away."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = node.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("create_task", "ensure_future"):
                yield node.lineno


def test_no_background_task_without_a_reference() -> None:
    """Kind 9a: no module of gateway/ (or the toolbus client) drops the task a
    create_task/ensure_future returns (the loop holds tasks weakly; such a task, e.g. a
    job.cancel reply, can vanish)."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for package in ("gateway", "toolbus")
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in _discarded_tasks(ast.parse(path.read_text(), str(path)))
    ]
    assert found == []


def test_discarded_task_detector_finds_one() -> None:
    """The detector above is not vacuous: it flags the shape the job.cancel reply had."""
    source = "import asyncio\nasyncio.get_running_loop().create_task(f())\n"
    source += "t = asyncio.ensure_future(g())\n"
    assert list(_discarded_tasks(ast.parse(source))) == [2]


async def test_task_set_keeps_task_alive_and_logs_failure() -> None:
    """Kind 9a: a spawned task runs to its end through garbage collections, and one that
    fails is logged at ERROR with its name, then dropped from the set."""
    tasks = TaskSet()
    gate, replied = asyncio.Event(), asyncio.Event()

    async def reply() -> None:
        await gate.wait()
        replied.set()

    async def broken() -> None:
        raise RuntimeError("store gone")

    with _Records("gateway.tasks", logging.ERROR) as log:
        tasks.spawn(reply(), name="job.cancel reply")  # no reference kept by the caller
        tasks.spawn(broken(), name="broken reply")
        gc.collect()
        assert len(tasks) == 2
        await log.until(logging.ERROR)
        assert len(tasks) == 1
        gc.collect()
        gate.set()
        async with asyncio.timeout(WAIT):
            await replied.wait()
        await tasks.cancel_all()
    assert len(tasks) == 0
    assert log.at(logging.ERROR) == ["background task broken reply failed"]


async def test_job_cancel_reply_arrives(tmp_path: Path) -> None:
    """SPEC J3, kind 9a: job.cancel is answered with the job's final state (the reply
    task is held by the gateway's task set until it has answered)."""
    async with tt.serve(tmp_path) as gw, peer(gw) as p:
        await p.invoke("c1", "hold_job", {"key": "cancel-me"})
        job_id = (await p.terminal("c1"))["job_id"]
        await p.send({"type": "job.cancel", "id": "k1", "job_id": job_id})
        gc.collect()
        reply = await p.expect("job", id="k1")
        assert (reply["job"]["job_id"], reply["job"]["state"]) == (job_id, "cancelled")


# -- (b) maintenance loops survive their faults -------------------------------------------


async def test_purge_loop_survives_a_failing_purge(tmp_path: Path) -> None:
    """SPEC D2, kind 9b: a purge that fails (the sessions table renamed away by another
    connection: a real SQLite error) is logged with the failure count and retried with
    backoff; once the table is back the loop says it works again."""
    settings = settings_for(tmp_path, sessions={"purge_interval": 5 * MS})
    with _Records("gateway.tasks", logging.INFO) as log:
        async with running(settings):
            other = sqlite3.connect(tmp_path / "data" / "toolbus.db", isolation_level=None)
            try:
                other.execute("ALTER TABLE sessions RENAME TO sessions_away")
                await log.until(logging.ERROR, 2)
                other.execute("ALTER TABLE sessions_away RENAME TO sessions")
                await log.until(logging.WARNING)
            finally:
                other.close()
    errors = log.at(logging.ERROR)
    assert errors[0] == f"store purge failed (1 in a row); next try in {10 * MS:.1f} s"
    assert errors[1] == f"store purge failed (2 in a row); next try in {20 * MS:.1f} s"
    first = next(r for r in log.records if r.exc_info)
    assert first.exc_info is not None
    assert "no such table: sessions" in str(first.exc_info[1])
    assert log.at(logging.WARNING) == [f"store purge works again after {len(errors)} failed rounds"]


async def test_reload_watcher_survives_a_failing_round(tmp_path: Path) -> None:
    """SPEC C3, kind 9b: a hot-reload round that raises (here the session table it
    pushes to fails) is logged with its traceback; the watcher goes on and picks up the
    next change."""
    tools = tmp_path / "tools.yaml"
    shutil.copy(DEMO_DIR / "tools.yaml", tools)
    state = CatalogState([tools], [DEMO_DIR / "profiles.yaml"])
    pushed = asyncio.Event()
    calls = 0

    def sessions() -> list[Session]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("session table unavailable")
        pushed.set()
        return []

    with _Records("gateway.tasks", logging.INFO) as log:
        watcher = asyncio.get_running_loop().create_task(state.watch(5 * MS, sessions))
        try:
            text = tools.read_text()
            _bump(tools, text.replace("Convert", "Change", 1))
            await log.until(logging.WARNING)
            _bump(tools, text)
            async with asyncio.timeout(WAIT):
                await pushed.wait()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    assert log.at(logging.ERROR) == [
        f"catalog hot reload failed (1 in a row); next try in {10 * MS:.1f} s"
    ]
    assert log.at(logging.WARNING) == ["catalog hot reload works again after 1 failed rounds"]
    assert log.records[0].exc_info is not None
    assert "Change" not in state.current.tools["convert_units"].description


async def test_reload_of_a_handler_that_exits_keeps_serving(tmp_path: Path) -> None:
    """SPEC C3, O5: a hot reload adding a tool whose handler module calls sys.exit() at
    import is a reload failure (logged, previous catalog kept); the server goes on. The
    SystemExit used to escape the watcher task and stop the whole server."""
    tools = tmp_path / "tools.yaml"
    demo = yaml.safe_load((DEMO_DIR / "tools.yaml").read_text())
    tools.write_text(yaml.safe_dump(demo))
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(3)\n")
    settings = settings_for(
        tmp_path,
        catalog={
            "tools": [tools],
            "profiles": [DEMO_DIR / "profiles.yaml"],
            "hot_reload": True,
            "reload_interval": 5 * MS,
        },
    )
    exits = {
        "name": "exits",
        "description": "x",
        "capability": "units",
        "handler": "exits_on_import:run",
        "parameters": {"type": "object"},
    }
    sys.path.insert(0, str(tmp_path))
    try:
        with _Records("gateway.catalog", logging.ERROR) as log:
            async with running(settings) as gw, peer(gw) as p:
                _bump(tools, yaml.safe_dump({**demo, "tools": [*demo["tools"], exits]}))
                await log.until(logging.ERROR)
                await p.invoke(
                    "c1", "convert_units", {"value": 1, "from_unit": "m", "to_unit": "cm"}
                )
                assert (await p.terminal("c1"))["type"] == "result"
                assert "exits" not in gw.catalog.current.tools
        assert log.at(logging.ERROR) == [
            "catalog reload failed; keeping the previous catalog: 1 catalog issue:\n"
            f"  {tools}: exits: handler: handler 'exits_on_import:run': importing "
            "'exits_on_import' failed: SystemExit: 3"
        ]
    finally:
        sys.path.remove(str(tmp_path))


# -- token file: a malformed edit keeps the previous good file ----------------------------


async def test_malformed_token_file_on_reload_keeps_previous(tmp_path: Path) -> None:
    """SPEC S2, O5: a token file edited into a malformed state is logged once at ERROR
    (file and key named) and the previous good tokens stay in force; no hello fails with
    a traceback."""
    settings = settings_for(tmp_path)
    tokens = tmp_path / "tokens.yaml"
    with _Records("gateway.auth", logging.ERROR) as log:
        async with running(settings) as gw:
            async with peer(gw) as p:
                assert p.welcome["user"] == "alice"
            _bump(tokens, "tokens:\n  - {user: mallory, profiles: [demo]}\n")
            for _ in range(2):
                async with peer(gw, token="bob-token") as p:
                    assert p.welcome["user"] == "bob"
    assert log.at(logging.ERROR) == [
        f"token file {tokens}: tokens.0.sha256: Field required; keeping the previous tokens"
    ]


# -- (d) server frames fit the announced max_message_bytes ---------------------------------

LIMIT = 65536


def _budget(call_id: str, tool: str) -> int:
    return payload_budget(LIMIT, call_id, tool)


def test_envelope_bound_holds_for_the_largest_envelopes() -> None:
    """SPEC E2: with a payload of exactly the budget, the largest tool_start (longest
    call_id of control characters, longest tool name, largest seq, an approval) and
    the largest result frame still fit; one byte more of payload would not be allowed."""
    call_id, tool = "\x01" * 128, "t" * 64
    budget = payload_budget(LIMIT, call_id, tool)
    assert budget == LIMIT - ENVELOPE - 6 * 128 - 2 - 64 - 2
    params = {"p": "x" * (budget - len(b'{"p":""}'))}
    assert len(orjson.dumps(params)) == budget
    start = m.ToolStart(
        seq=2**63 - 1,
        call_id=call_id,
        tool=tool,
        params=params,
        approval_id="ap_" + "A" * 32,
        expires_at=-1.7976931348623157e308,
    )
    result = m.Result(
        seq=2**63 - 1, call_id=call_id, tool=tool, result=params, declined=True, replaced=True
    )
    assert len(encode(start)) <= LIMIT
    assert len(encode(result)) <= LIMIT


def _invoke(call_id: str, note_bytes: int) -> bytes:
    return orjson.dumps(
        {"type": "invoke", "call_id": call_id, "tool": "echo", "params": {"note": "x" * note_bytes}}
    )


async def test_max_size_invoke_frames_fit(tmp_path: Path) -> None:
    """SPEC E2, kind 9d: with max_message_bytes announced, an invoke of exactly that size
    is refused invalid_params (maxBytes) before it runs; params at the budget get a
    tool_start that fits and, when the handler's echo would not fit, a handler_error;
    every frame the client receives fits the announced size (its max_size is set to it)."""
    async with (
        tt.serve(tmp_path, server={"max_message_bytes": LIMIT}) as gw,
        connect(gw.url, subprotocols=["toolbus.v1"], max_size=LIMIT) as ws,  # type: ignore[list-item]
    ):
        await ws.send(
            orjson.dumps({"type": "hello", "token": "alice-token", "profile": "demo"}).decode()
        )
        frames: list[bytes] = []

        async def until(kind: str, call_id: str) -> dict[str, object]:
            async with asyncio.timeout(WAIT):
                while True:
                    raw = await ws.recv(decode=False)
                    frames.append(raw)
                    frame = orjson.loads(raw)
                    if frame["type"] == kind and frame.get("call_id", call_id) == call_id:
                        return frame  # type: ignore[no-any-return]

        welcome = await until("welcome", "")
        assert welcome["limits"]["max_message_bytes"] == LIMIT  # type: ignore[index]
        # 1. An invoke of exactly LIMIT bytes: its echo could not fit.
        overhead = len(_invoke("max", 0))
        big = _invoke("max", LIMIT - overhead)
        assert len(big) == LIMIT
        await ws.send(big.decode())
        error = await until("call.error", "max")
        size = LIMIT - overhead + len(b'{"note":""}')
        assert (error["code"], error["message"]) == ("invalid_params", "1 parameter problem(s)")
        assert error["violations"] == [
            {
                "pointer": "",
                "message": f"params are {size} bytes as JSON; at most {_budget('max', 'echo')} fit",
                "keyword": "maxBytes",
            }
        ]
        assert tt.STATE.calls["echo"] == 0
        # 2. Params of exactly the budget: tool_start fits; the echoed result cannot.
        edge = _budget("edge", "echo")
        await ws.send(_invoke("edge", edge - len(b'{"note":""}')).decode())
        start = await until("tool_start", "edge")
        assert len(orjson.dumps(start["params"])) == edge
        failed = await until("call.error", "edge")
        assert failed["code"] == "handler_error"
        assert str(failed["message"]).startswith("the handler's value cannot be sent: result is ")
        assert str(failed["message"]).endswith(f" bytes as JSON; at most {edge} fit")
        # 3. Params with room for the echo: a normal result.
        await ws.send(_invoke("fits", edge - 1024).decode())
        result = await until("result", "fits")
        assert result["result"]["params"]["note"] == "x" * (edge - 1024)  # type: ignore[index]
        assert max(len(f) for f in frames) <= LIMIT
        assert tt.STATE.calls["echo"] == 2


EMPTY_BLOB = b'{"blob":""}'
BIG_TOOLS = """
tools:
  - name: big_sync
    description: Return a value of the asked size.
    capability: t
    mode: sync
    handler: f9_big:big
    parameters: {type: object, properties: {size: {type: integer}}, required: [size]}
  - name: big_job
    description: A job whose value is of the asked size.
    capability: t
    mode: async
    handler: f9_big:big
    parameters: {type: object, properties: {size: {type: integer}}, required: [size]}
"""


async def test_large_handler_values_never_exceed_the_frame_limit(tmp_path: Path) -> None:
    """SPEC E2, I16, kind 9d: a small invoke whose handler returns more than fits in one
    frame ends in handler_error (sync) or job.failed handler_error (job) naming both
    sizes; a value that fits arrives whole."""
    (tmp_path / "tools.yaml").write_text(BIG_TOOLS)
    (tmp_path / "profiles.yaml").write_text("profiles:\n  demo: {capabilities: [t]}\n")
    (tmp_path / "f9_big.py").write_text(
        'async def big(params, ctx):\n    return {"blob": "x" * params["size"]}\n'
    )
    settings = settings_for(
        tmp_path,
        server={"max_message_bytes": LIMIT},
        catalog={"tools": [tmp_path / "tools.yaml"], "profiles": [tmp_path / "profiles.yaml"]},
    )
    sys.path.insert(0, str(tmp_path))
    try:
        async with (
            running(settings) as gw,
            connect(gw.url, subprotocols=["toolbus.v1"], max_size=LIMIT) as ws,  # type: ignore[list-item]
        ):
            await ws.send(
                orjson.dumps({"type": "hello", "token": "alice-token", "profile": "demo"}).decode()
            )

            seen: list[dict[str, object]] = []

            async def until(kind: str, key: str, value: object) -> dict[str, object]:
                # The three calls run at once: their frames may come in any order, so a
                # frame read while waiting for another is kept, not dropped.
                async with asyncio.timeout(WAIT):
                    while True:
                        for frame in seen:
                            if frame["type"] == kind and frame.get(key) == value:
                                seen.remove(frame)
                                return frame
                        raw = await ws.recv(decode=False)
                        assert len(raw) <= LIMIT
                        seen.append(orjson.loads(raw))

            await until("welcome", "type", "welcome")
            for call_id, tool, size in (
                ("s1", "big_sync", LIMIT),
                ("s2", "big_sync", _budget("s2", "big_sync") - len(EMPTY_BLOB)),
                ("j1", "big_job", LIMIT),
            ):
                await ws.send(
                    orjson.dumps(
                        {
                            "type": "invoke",
                            "call_id": call_id,
                            "tool": tool,
                            "params": {"size": size},
                        }
                    ).decode()
                )
            too_big = await until("call.error", "call_id", "s1")
            assert too_big["code"] == "handler_error"
            assert too_big["message"] == (
                "the handler's value cannot be sent: result is "
                f"{LIMIT + len(EMPTY_BLOB)} bytes as JSON; at most {_budget('s1', 'big_sync')} fit"
            )
            fits = await until("result", "call_id", "s2")
            assert fits["result"] == {"blob": "x" * (_budget("s2", "big_sync") - len(EMPTY_BLOB))}
            job_id = (await until("dispatched", "call_id", "j1"))["job_id"]
            failed = await until("job.failed", "job_id", job_id)
            error = failed["error"]
            assert isinstance(error, dict)
            assert error["code"] == "handler_error"
            assert str(error["message"]).startswith(
                "the handler's value cannot be sent: job.done would be "
            )
            assert str(error["message"]).endswith(f" bytes; at most {LIMIT} fit")
    finally:
        sys.path.remove(str(tmp_path))
