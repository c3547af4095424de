"""A test catalog for the pipeline, approval and job tests (SPEC I, A, J; cases F01-F11).

Handlers and hooks here count every run in :data:`STATE` and block on events the test
controls (a :class:`threading.Event` for plain handlers, which run in worker threads;
an :class:`asyncio.Event` for coroutine handlers), so no test sleeps to order events.
:func:`serve` writes the catalog into ``tmp_path``, resets :data:`STATE` and runs a
real gateway on it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.context import ToolContext
from gateway.hooks import CallInfo, Deny
from gateway.server import Gateway
from tests.support import WAIT, Peer, running, settings_for

TOOLS_YAML = """
tools:
  - name: echo
    description: Echo the arguments and the injected identity.
    capability: t.basic
    handler: tests.gateway.tools_for_tests:echo
    sensitive: [secret]
    parameters:
      type: object
      properties:
        note: {type: string}
        user: {type: string}
        deny: {type: string}
        secret: {type: string}
        big: {type: string}
        replace: {type: boolean}
      additionalProperties: false
  - name: named
    description: Needs a name.
    capability: t.basic
    handler: tests.gateway.tools_for_tests:echo
    parameters:
      type: object
      properties:
        name: {type: string}
      required: [name]
      additionalProperties: false
  - name: topic_tool
    description: Takes only a topic.
    capability: t.basic
    handler: tests.gateway.tools_for_tests:echo
    parameters:
      type: object
      properties:
        topic: {type: string}
        count: {type: integer, minimum: 1}
      required: [topic]
      additionalProperties: false
  - name: scalar
    description: Returns a bare number.
    capability: t.basic
    handler: tests.gateway.tools_for_tests:scalar
  - name: raises
    description: Always raises.
    capability: t.basic
    handler: tests.gateway.tools_for_tests:raises
  - name: slow
    description: Never finishes by itself; its timeout is short.
    capability: t.basic
    timeout: 0.05
    handler: tests.gateway.tools_for_tests:forever
  - name: blocking
    description: A plain handler that blocks its worker thread until released.
    capability: t.basic
    timeout: 0
    handler: tests.gateway.tools_for_tests:blocking
  - name: promo
    description: A slow sync call promoted to a job.
    capability: t.basic
    timeout: 0
    promote_after: 0.05
    handler: tests.gateway.tools_for_tests:blocking
  - name: gated
    description: Needs the user's approval.
    capability: t.gated
    requires_approval: true
    handler: tests.gateway.tools_for_tests:echo
    parameters:
      type: object
      properties:
        note: {type: string}
      additionalProperties: false
  - name: gated_block
    description: Needs approval, then blocks until released.
    capability: t.gated
    requires_approval: true
    timeout: 0
    handler: tests.gateway.tools_for_tests:blocking
  - name: delete_file
    description: Delete a file; dangerous and gated.
    capability: t.gated
    dangerous: true
    requires_approval: true
    handler: tests.gateway.tools_for_tests:echo
    parameters:
      type: object
      properties:
        path: {type: string}
      required: [path]
      additionalProperties: false
  - name: scoped
    description: Needs a linked project.
    capability: t.basic
    handler: tests.gateway.tools_for_tests:echo
    visibility:
      requires_context: [project_id]
  - name: ui_tool
    description: Runs in the client.
    capability: t.basic
    mode: client
  - name: hold_job
    description: An async job that waits for the test to release its key.
    capability: t.jobs
    mode: async
    dispatch_message: Working on it.
    handler: tests.gateway.tools_for_tests:hold
    parameters:
      type: object
      properties:
        key: {type: string}
        summary: {type: string}
        artifacts: {type: array, items: {type: object}}
        progress: {type: integer, minimum: 0}
      required: [key]
      additionalProperties: false
  - name: block_job
    description: An async job whose plain handler blocks a worker thread until released.
    capability: t.jobs
    mode: async
    handler: tests.gateway.tools_for_tests:blocking
guidance:
  invented_tool: There is no such tool; use echo.
"""

PROFILES_YAML = """
safe_default: [echo]
profiles:
  demo:
    capabilities: [t.basic, t.gated, t.jobs]
    allow_dangerous: [delete_file]
  readonly:
    capabilities: [t.basic]
  voice:
    capabilities: [t.basic, t.gated, t.jobs]
    allow_dangerous: [delete_file]
    auto_approve: [gated]
  legacy:
    tools: true
"""


@dataclass
class State:
    """What the handlers and hooks of this module did; reset by :func:`serve`."""

    calls: Counter[str] = field(default_factory=Counter)
    contexts: list[dict[str, Any]] = field(default_factory=list)
    hooks: list[tuple[str, str]] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    returned: threading.Event = field(default_factory=threading.Event)
    cancelled_seen: threading.Event = field(default_factory=threading.Event)
    job_started: dict[str, asyncio.Event] = field(default_factory=dict)
    job_release: dict[str, asyncio.Event] = field(default_factory=dict)

    def job_event(self, table: dict[str, asyncio.Event], key: str) -> asyncio.Event:
        if key not in table:
            table[key] = asyncio.Event()
        return table[key]


STATE = State()


def reset() -> State:
    global STATE
    STATE = State()
    return STATE


# -- handlers ---------------------------------------------------------------------------


async def echo(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    STATE.calls[ctx.tool] += 1
    seen = {
        "user": ctx.user,
        "session_id": ctx.session_id,
        "profile": ctx.profile,
        "project_id": ctx.project_id,
        "call_id": ctx.call_id,
        "tool": ctx.tool,
    }
    STATE.contexts.append(seen)
    return {"params": params, "ctx": seen}


def scalar(params: dict[str, Any], ctx: ToolContext) -> int:
    STATE.calls[ctx.tool] += 1
    return 42


def raises(params: dict[str, Any], ctx: ToolContext) -> None:
    STATE.calls[ctx.tool] += 1
    raise RuntimeError("boom")


async def forever(params: dict[str, Any], ctx: ToolContext) -> None:
    STATE.calls[ctx.tool] += 1
    await asyncio.Event().wait()


def blocking(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Blocks its worker thread until the test sets ``STATE.release``."""
    state = STATE
    state.calls[ctx.tool] += 1
    state.started.set()
    state.release.wait(WAIT)
    if ctx.cancelled.is_set():
        state.cancelled_seen.set()
    state.returned.set()
    return {"late": True, "tool": ctx.tool}


async def hold(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Reports ``progress`` steps, then waits for the test to release ``key``."""
    state = STATE
    key = params["key"]
    state.calls[ctx.tool] += 1
    steps = params.get("progress", 0)
    for step in range(1, steps + 1):
        ctx.progress(step / steps, f"step {step}")
    state.job_event(state.job_started, key).set()
    await state.job_event(state.job_release, key).wait()
    result: dict[str, Any] = {"key": key, "job_id": ctx.job_id}
    for name in ("summary", "artifacts"):
        if name in params:
            result[name] = params[name]
    return result


# -- hooks ------------------------------------------------------------------------------


def first_hook(info: CallInfo) -> None:
    STATE.hooks.append(("first", info.call_id))


async def deny_hook(info: CallInfo) -> Deny | None:
    STATE.hooks.append(("deny", info.call_id))
    if info.params.get("deny"):
        return Deny(f"policy says no: {info.params['deny']}", "policy_" + str(info.params["deny"]))
    return None


def last_hook(info: CallInfo) -> None:
    STATE.hooks.append(("last", info.call_id))


def replace_hook(info: CallInfo, result: dict[str, Any]) -> dict[str, Any] | None:
    STATE.hooks.append(("post", info.call_id))
    if info.params.get("replace"):
        return {"redacted": True}
    return None


HOOKS = {
    "pre_hooks": [
        "tests.gateway.tools_for_tests:first_hook",
        "tests.gateway.tools_for_tests:deny_hook",
        "tests.gateway.tools_for_tests:last_hook",
    ],
    "post_hooks": ["tests.gateway.tools_for_tests:replace_hook"],
}


# -- serving ----------------------------------------------------------------------------


def write_catalog(tmp: Path) -> dict[str, list[Path]]:
    """Write the test catalog into ``tmp``; returns the ``catalog`` settings section."""
    tools, profiles = tmp / "tools.yaml", tmp / "profiles.yaml"
    tools.write_text(TOOLS_YAML)
    profiles.write_text(PROFILES_YAML)
    return {"tools": [tools], "profiles": [profiles]}


@asynccontextmanager
async def serve(tmp: Path, **sections: Any) -> AsyncIterator[Gateway]:
    """A real gateway on the test catalog with the hooks of this module.

    ``sections`` are settings sections merged over the defaults here (e.g.
    ``calls={"approval_timeout": 0.3}``).
    """
    reset()
    calls = {
        **HOOKS,
        "approval_timeout": 300.0,
        "default_timeout": 5.0,
        **sections.pop("calls", {}),
    }
    settings = settings_for(tmp, catalog=write_catalog(tmp), calls=calls, **sections)
    async with running(settings) as gateway:
        try:
            yield gateway
        finally:
            STATE.release.set()
            for event in STATE.job_release.values():
                event.set()


async def wait_thread_event(event: threading.Event) -> None:
    """Wait for a :class:`threading.Event` without blocking the loop; fails after WAIT."""
    async with asyncio.timeout(WAIT):
        assert await asyncio.to_thread(event.wait, WAIT)


@contextmanager
def audit_records() -> Iterator[list[dict[str, Any]]]:
    """Collect the audit records (SPEC I11) written to ``toolbus.audit`` meanwhile."""
    records: list[dict[str, Any]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(dict(record.audit))  # type: ignore[attr-defined]

    audit = logging.getLogger("toolbus.audit")
    handler, level = Collect(), audit.level
    audit.addHandler(handler)
    audit.setLevel(logging.INFO)
    try:
        yield records
    finally:
        audit.removeHandler(handler)
        audit.setLevel(level)


TERMINALS = ("result", "dispatched", "call.error")


async def first_terminal(p: Peer, call_id: str) -> dict[str, Any]:
    """The first terminal reply of ``call_id``, already seen or still to come (SPEC I12)."""
    for message in p.seen:
        if message.get("call_id") == call_id and message["type"] in TERMINALS:
            return message
    return await p.terminal(call_id)
