"""``toolbus client URL --token T --profile P``: an interactive console (SPEC K1, O1).

It connects with the client library, prints pushes as they arrive (catalog summary,
``tool_start``, approvals, results, job events) and reads commands from stdin on a
thread, so typing never blocks the event loop:

    tools                          list the catalog
    invoke TOOL {json}             call a tool (runs in the background)
    confirm ID allow|deny|always   answer an approval (ID: the short alias or the full id)
    approvals                      list pending approvals
    jobs [STATE]                   list your jobs
    job ID                         show one job
    cancel CALL_ID                 cancel a running or approval-pending call
    cancel-job JOB_ID              cancel a job
    grants / revoke TOOL           "always allow" grants
    ctx key=value [key=...]        update the context ('key=' removes the key)
    help                           this text
    quit                           end the session and exit (also on end of input);
                                   calls still running get --wait seconds to finish
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from pydantic import BaseModel

from protocol import messages as m
from protocol.codec import decode_json, encode_json
from toolbus.client import Client
from toolbus.errors import InvalidParams, ToolbusClientError, UnknownTool
from toolbus.handles import JobHandle

HELP: Final = (
    __doc__.split("thread, so typing never blocks the event loop:", 1)[1] if __doc__ else ""
)
DECISIONS: Final = {
    "allow": m.Decision.ALLOW,
    "deny": m.Decision.DENY,
    "always": m.Decision.ALLOW_ALWAYS,
}
USAGE: Final = {
    "invoke": "invoke TOOL {json}",
    "confirm": f"confirm ID {'|'.join(DECISIONS)}",
    "jobs": f"jobs [{'|'.join(m.JobState)}]",
    "job": "job ID",
    "cancel": "cancel CALL_ID",
    "cancel-job": "cancel-job JOB_ID",
    "revoke": "revoke TOOL",
    "ctx": "ctx key=value [key=value ...]",
}
"""Command -> its usage line, printed for a bad argument (the session goes on)."""


class Usage(ValueError):
    """A command line with missing, extra or unknown arguments."""


def _args(args: list[str], name: str, least: int, most: int) -> list[str]:
    """``args`` when there are ``least`` to ``most`` of them, else :class:`Usage`."""
    if not least <= len(args) <= most:
        raise Usage(USAGE[name])
    return args


def _json(value: Any, limit: int = 400) -> str:
    text = encode_json(value).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def say(text: str) -> None:
    """Print one line now (stdout may be a pipe: flush every line)."""
    print(text, flush=True)


class Console:
    """The command loop and the push printer around one :class:`Client`."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.started = False
        """Pushes are printed once the "connected" line is out."""
        self.aliases: dict[str, str] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.commands: dict[str, Callable[[list[str]], Awaitable[None]]] = {
            "tools": self.tools,
            "invoke": self.invoke,
            "confirm": self.confirm,
            "approvals": self.approvals,
            "jobs": self.jobs,
            "job": self.job,
            "cancel": self.cancel,
            "cancel-job": self.cancel_job,
            "grants": self.grants,
            "revoke": self.revoke,
            "ctx": self.ctx,
            "help": self.help,
        }

    # -- pushes ------------------------------------------------------------------------

    def on_message(self, message: BaseModel) -> None:
        """Print a push the moment it is processed (results are printed by their call)."""
        printer = self.PUSHES.get(type(message))
        if printer is not None:
            printer(self, message)

    def _catalog(self, msg: m.Catalog) -> None:
        names = ", ".join(t.name for t in msg.tools)
        say(f"catalog ({msg.reason.value}, {len(msg.tools)} tools, version {msg.version}): {names}")

    def _tool_start(self, msg: m.ToolStart) -> None:
        if msg.approval_id is None:
            say(f"tool_start {msg.tool} [{msg.call_id}] {_json(msg.params)}")
            return
        alias = f"a{len(self.aliases) + 1}"
        self.aliases[alias] = msg.approval_id
        say(f"approval {alias}: {msg.tool} [{msg.call_id}] {_json(msg.params)}")
        say(f"  answer with: confirm {alias} allow|deny|always")

    def _resolved(self, msg: m.ToolResolved) -> None:
        alias = next((a for a, full in self.aliases.items() if full == msg.approval_id), "?")
        say(f"approval {alias} {msg.resolution.value} ({msg.reason.value}) for {msg.tool}")

    def _job_event(self, msg: m.JobProgress | m.JobDone | m.JobFailed | m.JobCancelled) -> None:
        if isinstance(msg, m.JobProgress):
            say(f"job.progress {msg.job_id} {msg.progress} {msg.message or ''}".rstrip())
        elif isinstance(msg, m.JobDone):
            say(f"job.done {msg.job_id} {msg.tool}: {msg.summary} {_json(msg.result)}")
        elif isinstance(msg, m.JobFailed):
            say(f"job.failed {msg.job_id} {msg.tool}: {msg.error.code}: {msg.error.message}")
        else:
            say(f"job.cancelled {msg.job_id} {msg.tool}: {msg.summary}")

    def _expiring(self, msg: m.AuthExpiring) -> None:
        """SPEC S6: the credential lapses soon; this console cannot mint a new one."""
        left = f"{msg.seconds_left:.0f}"
        say(f"auth.expiring: the credential expires in {left} s; reconnect with a new token")

    PUSHES: Final[dict[type[BaseModel], Callable[[Console, Any], None]]] = {
        m.Catalog: _catalog,
        m.ToolStart: _tool_start,
        m.ToolResolved: _resolved,
        m.JobProgress: _job_event,
        m.JobDone: _job_event,
        m.JobFailed: _job_event,
        m.JobCancelled: _job_event,
        m.AuthExpiring: _expiring,
    }

    # -- commands ----------------------------------------------------------------------

    async def run_line(self, line: str) -> bool:
        """Run one command line; ``False`` means quit."""
        words = line.strip().split(maxsplit=1)
        if not words:
            return True
        name, rest = words[0], (words[1] if len(words) > 1 else "")
        if name in ("quit", "exit"):
            return False
        command = self.commands.get(name)
        if command is None:
            say(f"unknown command {name!r}; try 'help'")
            return True
        try:
            args = [rest] if name == "invoke" else shlex.split(rest)
            await command(args)
        except ToolbusClientError as exc:
            say(f"error: {type(exc).__name__}: {exc}")
        except Usage as exc:
            say(f"usage: {exc}")
        except ValueError as exc:  # shlex: an open quote
            say(f"usage error: {exc}")
        return True

    async def tools(self, args: list[str]) -> None:
        for tool in self.client.catalog:
            flags = " (approval)" if tool.requires_approval else ""
            say(f"  {tool.name} [{tool.mode}]{flags}: {tool.description}")

    async def invoke(self, args: list[str]) -> None:
        tool, _, raw = args[0].strip().partition(" ")
        if not tool:
            raise Usage(USAGE["invoke"])
        try:
            params = decode_json(raw) if raw.strip() else {}
        except ValueError as exc:  # orjson.JSONDecodeError
            raise Usage(f"{USAGE['invoke']} (params are not JSON: {exc})") from None
        if not isinstance(params, dict):
            raise Usage(f"{USAGE['invoke']} (params must be a JSON object)")
        task = asyncio.create_task(self._call(tool, params))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _call(self, tool: str, params: dict[str, Any]) -> None:
        try:
            out = await self.client.invoke(tool, params)
        except UnknownTool as exc:
            say(f"call.error {tool}: unknown_tool: {exc}")
            if exc.suggestions:
                say(f"  did you mean: {', '.join(exc.suggestions)}")
            if exc.guidance:
                say(f"  {exc.guidance}")
            return
        except InvalidParams as exc:
            say(f"call.error {tool}: invalid_params: {exc.message}")
            for violation in exc.violations:
                say(f"  {violation.pointer or '/'}: {violation.message}")
            return
        except ToolbusClientError as exc:
            say(f"call.error {tool}: {exc.code or type(exc).__name__}: {exc}")
            return
        if isinstance(out, JobHandle):
            say(f"dispatched {tool} [{out.call_id}] job {out.job_id}: {out.message}")
        else:
            label = "result (declined)" if out.declined else "result"
            say(f"{label} {tool} [{out.call_id}]: {_json(out.result)}")

    async def confirm(self, args: list[str]) -> None:
        ident, word = _args(args, "confirm", 2, 2)
        decision = DECISIONS.get(word)
        if decision is None:
            raise Usage(f"{USAGE['confirm']} (not {word!r})")
        approval_id = self.aliases.get(ident, ident)
        reply = await self.client.confirm(approval_id, decision)
        reason = f" ({reply.reason.value})" if reply.reason else ""
        say(f"confirm {ident}: {'accepted' if reply.accepted else 'not accepted'}{reason}")

    async def approvals(self, args: list[str]) -> None:
        pending = self.client.pending_approvals
        if not pending:
            say("no pending approvals")
        for req in pending:
            alias = next((a for a, full in self.aliases.items() if full == req.approval_id), "?")
            say(f"  {alias} {req.tool} [{req.call_id}] {_json(req.params)}")

    async def jobs(self, args: list[str]) -> None:
        state = _args(args, "jobs", 0, 1)[0] if args else None
        if state is not None and state not in set(m.JobState):
            raise Usage(f"{USAGE['jobs']} (not {state!r})")
        jobs = await self.client.jobs(state)
        if not jobs:
            say("no jobs")
        for job in jobs:
            say(f"  {job.job_id} {job.tool} {job.state.value} {job.summary or ''}".rstrip())

    async def job(self, args: list[str]) -> None:
        (job_id,) = _args(args, "job", 1, 1)
        say(_json((await self.client.job(job_id)).model_dump(exclude_none=True), limit=2000))

    async def cancel(self, args: list[str]) -> None:
        (call_id,) = _args(args, "cancel", 1, 1)
        await self.client.cancel(call_id)
        say(f"cancel {call_id}: sent")

    async def cancel_job(self, args: list[str]) -> None:
        (job_id,) = _args(args, "cancel-job", 1, 1)
        job = await self.client.cancel_job(job_id)
        say(f"cancel-job {job.job_id}: requested")

    async def grants(self, args: list[str]) -> None:
        say(f"grants: {', '.join(await self.client.grants()) or '(none)'}")

    async def revoke(self, args: list[str]) -> None:
        (tool,) = _args(args, "revoke", 1, 1)
        say(f"grants: {', '.join(await self.client.revoke(tool)) or '(none)'}")

    async def ctx(self, args: list[str]) -> None:
        changes: dict[str, str | None] = {}
        for pair in _args(args, "ctx", 1, max(1, len(args))):
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise Usage(USAGE["ctx"])
            changes[key] = value or None
        say(f"context: {_json(await self.client.update_context(changes))}")

    async def help(self, args: list[str]) -> None:
        say(HELP.rstrip())

    async def settle(self, wait: float) -> None:
        """Give calls still running up to ``wait`` seconds to answer, then cancel them."""
        if self.tasks:
            pending = len(self.client.pending_approvals)
            waiting = f", {pending} awaiting approval" if pending else ""
            say(f"waiting up to {wait:g} s for {len(self.tasks)} running call(s){waiting}")
            await asyncio.wait(set(self.tasks), timeout=wait)
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(set(self.tasks))


def _stdin_lines(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[str | None]) -> None:
    """Read stdin on a thread; hand each line to the loop (``None`` at end of input)."""
    for line in sys.stdin:
        loop.call_soon_threadsafe(queue.put_nowait, line)
    loop.call_soon_threadsafe(queue.put_nowait, None)


async def run(args: argparse.Namespace) -> int:
    """Connect, then run commands until ``quit`` or end of input."""
    context = dict(pair.split("=", 1) for pair in args.context)
    console: Console | None = None

    def printer(message: BaseModel) -> None:
        if console is not None and console.started:
            console.on_message(message)

    client = Client(
        args.url,
        token=args.token,
        profile=args.profile,
        context=context,
        confirm_tool_calls=args.confirm_tool_calls,
        on_message=printer,
    )
    console = Console(client)
    try:
        await client.open()
    except ToolbusClientError as exc:
        print(f"cannot connect: {exc}", file=sys.stderr, flush=True)
        return 2
    assert client.welcome is not None
    say(
        f"connected: session {client.welcome.session_id}, user {client.welcome.user}, "
        f"profile {client.welcome.profile}"
    )
    console._catalog(
        m.Catalog(
            seq=1,
            version=client.catalog_version or "",
            reason=m.CatalogReason.INITIAL,
            tools=client.catalog,
        )
    )
    console.started = True
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    threading.Thread(
        target=_stdin_lines, args=(asyncio.get_running_loop(), queue), daemon=True
    ).start()
    try:
        while not client.closed:
            line = await queue.get()
            if line is None or not await console.run_line(line):
                break
    finally:
        await console.settle(args.wait)
        await client.close()
    say("bye")
    return 0


def _pair(text: str) -> str:
    """An argparse type: ``KEY=VALUE`` with a non-empty key, as ``--context`` takes."""
    if not text.partition("=")[0] or "=" not in text:
        raise argparse.ArgumentTypeError(f"KEY=VALUE expected, got {text!r}")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """``toolbus client URL --token T --profile P``; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="toolbus client",
        description="Interactive toolbus client. Commands, one per line on stdin:",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=10.0,
        help="seconds calls still running get at quit or end of input (default 10)",
    )
    parser.add_argument("url", help="server WebSocket URL, e.g. ws://127.0.0.1:8765/")
    parser.add_argument("--token", default=None, help="credential sent in hello")
    parser.add_argument("--profile", default=None, help="profile to take")
    parser.add_argument(
        "--context",
        action="append",
        type=_pair,
        default=[],
        metavar="KEY=VALUE",
        help="session context entry (repeatable)",
    )
    parser.add_argument(
        "--confirm-tool-calls",
        action="store_true",
        help="ask for your approval of every call, not only of those that need it (SPEC A1)",
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    return asyncio.run(run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
