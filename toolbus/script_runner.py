"""The runner of scripted conversations: one raw WebSocket, one step at a time (SPEC K3).

:class:`Conversation` holds a run's live state (socket, captures, the last welcome's
ids, the highest seq seen); :data:`RUNNERS` maps each step kind to the coroutine that
runs it; :func:`run_script`, :func:`run_file` and :func:`run_files` run scripts and
return :class:`ScriptReport` s of :class:`StepResult` s, stopping at the first failed
step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.typing import Subprotocol

from protocol.codec import decode_json, encode_json
from toolbus.client_link import require_ws_url
from toolbus.errors import ConnectFailed
from toolbus.script_format import Script, ScriptError, Step, load_script
from toolbus.script_match import StepFailed, match, short, substitute

SUBPROTOCOL: Final = Subprotocol("toolbus.v1")


# ---------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class StepResult:
    """How one step went: ``ok``, and a line saying what was done or expected vs got."""

    index: int
    kind: str
    ok: bool
    detail: str


@dataclass(slots=True)
class ScriptReport:
    """The outcome of one script file.

    Attributes:
        name: the script's name.
        path: its file.
        steps: one result per step run; the run stops at the first failure.
        total: the number of steps in the script.
        error: a failure outside any step (unreadable file, cannot connect), else ``None``.
    """

    name: str
    path: Path
    steps: list[StepResult] = field(default_factory=list)
    total: int = 0
    error: str | None = None

    @property
    def passed(self) -> bool:
        """All steps ran and passed."""
        return (
            self.error is None and len(self.steps) == self.total and all(s.ok for s in self.steps)
        )

    @property
    def failure(self) -> StepResult | None:
        """The first failed step, if any."""
        return next((s for s in self.steps if not s.ok), None)

    def render(self, verbose: bool = True) -> str:
        """Human-readable lines: a PASS/FAIL header, then one line per step."""
        status = "PASS" if self.passed else "FAIL"
        lines = [f"{status} {self.path}: {self.name} ({len(self.steps)}/{self.total} steps)"]
        if self.error:
            lines.append(f"  error: {self.error}")
        for step in self.steps:
            if verbose or not step.ok:
                mark = "ok  " if step.ok else "FAIL"
                lines.append(f"  {mark} step {step.index} {step.kind}: {step.detail}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------- running


class Conversation:
    """The live state of one script run: socket, captures, last welcome, seq seen."""

    def __init__(self, script: Script, url: str, token: str | None) -> None:
        self.script = script
        self.url = url
        self.token = token if token is not None else script.token
        # ``${run}``: unique per run, for call ids. A call id is a key of the user for the
        # server's call_id_window (SPEC I15): a script run twice against one server
        # with fixed ids would get the first run's recorded outcomes.
        self.captures: dict[str, Any] = {"token": self.token, "run": secrets.token_hex(4)}
        self.ws: ClientConnection | None = None
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.last_seq = 0
        self.closed: tuple[int | None, str] | None = None

    async def open(self, hello: dict[str, Any] | None) -> None:
        """Open a socket (and send ``hello`` when given)."""
        self.closed = None
        self.ws = await ws_connect(
            self.url, subprotocols=[SUBPROTOCOL], max_size=None, compression=None
        )
        if hello is not None:
            await self.ws.send(encode_json(hello), text=True)

    def first_hello(self) -> dict[str, Any]:
        hello: dict[str, Any] = {"type": "hello"}
        if self.token is not None:
            hello["token"] = self.token
        if self.script.profile is not None:
            hello["profile"] = self.script.profile
        if self.script.context:
            hello["context"] = self.script.context
        if self.script.options:
            hello["options"] = self.script.options
        return hello

    async def close(self) -> None:
        """End the run: a session still open is ended with ``bye`` so that it does not
        stay parked for the resume window, counting against the user's session limit
        (SPEC E2). A script whose last step was ``disconnect`` leaves its session parked."""
        if self.ws is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    if self.session_id is not None:
                        await self.ws.send('{"type":"bye"}')
                    await self.ws.close()

    async def receive(self) -> Any:
        """One message (parsed JSON, or the raw text when it is not JSON).

        Raises:
            ConnectionClosed: the socket closed; :attr:`closed` says how.
        """
        assert self.ws is not None
        try:
            raw = await self.ws.recv()
        except ConnectionClosed as exc:
            frame = exc.rcvd
            self.closed = (None, "") if frame is None else (frame.code, frame.reason)
            raise
        try:
            message = decode_json(raw)
        except ValueError:  # orjson.JSONDecodeError
            return raw
        self._observe(message)
        return message

    def _observe(self, message: Any) -> None:
        """Remember what ``resume`` needs: the welcome's ids and the highest seq seen."""
        if not isinstance(message, dict):
            return
        if message.get("type") == "welcome":
            self.session_id = message.get("session_id")
            self.resume_token = message.get("resume_token")
            self.captures.setdefault("session_id", self.session_id)
            self.captures["session_id"] = self.session_id
            self.captures["resume_token"] = self.resume_token
            if not message.get("resumed"):
                self.last_seq = 0
        seq = message.get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool):
            self.last_seq = max(self.last_seq, seq)

    def require_ws(self) -> ClientConnection:
        if self.ws is None:
            raise StepFailed("no connection")
        return self.ws


Runner = Callable[[Conversation, Step], Coroutine[Any, Any, str]]


async def _send(conv: Conversation, step: Step) -> str:
    message = substitute(step.value, conv.captures)
    data = encode_json(message)
    await _write(conv, data, text=True)
    return f"sent {short(message)}"


async def _send_raw(conv: Conversation, step: Step) -> str:
    text = substitute(step.value, conv.captures)
    await _write(conv, str(text).encode(), text=True)
    return f"sent raw {short(text)}"


async def _send_bytes(conv: Conversation, step: Step) -> str:
    data = bytes.fromhex(step.value)
    await _write(conv, data, text=True)
    return f"sent {len(data)} bytes in a text frame"


async def _send_binary(conv: Conversation, step: Step) -> str:
    data = bytes.fromhex(step.value)
    await _write(conv, data, text=False)
    return f"sent {len(data)} bytes in a binary frame"


async def _write(conv: Conversation, data: bytes, *, text: bool) -> None:
    ws = conv.require_ws()
    try:
        await ws.send(data, text=text)
    except ConnectionClosed as exc:
        raise StepFailed(f"cannot send: connection closed ({_close(exc)})") from exc


def _close(exc: ConnectionClosed) -> str:
    frame = exc.rcvd
    return "no close frame" if frame is None else f"code {frame.code} {frame.reason!r}"


async def _expect(conv: Conversation, step: Step) -> str:
    _, detail = await _receive_match(conv, step)
    return detail


async def _receive_match(conv: Conversation, step: Step) -> tuple[Any, str]:
    """Receive until a message matches ``step.value`` (with the step's options); the
    message and the report line. Raises :class:`StepFailed`."""
    pattern = substitute(step.value, conv.captures)
    forbid = [substitute(f, conv.captures) for f in step.forbid]
    skipped: list[Missed] = []
    try:
        async with asyncio.timeout(step.timeout):
            while True:
                message = await conv.receive()
                scratch: dict[str, Any] = {}
                problem = match(pattern, message, scratch)
                if problem is None:
                    conv.captures.update(scratch)
                    extra = f" (skipped {len(skipped)})" if skipped else ""
                    captured = f"; captured {sorted(scratch)}" if scratch else ""
                    return message, f"got {short(message)}{extra}{captured}"
                if step.strict:
                    raise StepFailed(f"expected {short(pattern)}: {problem}; got {short(message)}")
                for banned in forbid:
                    if match(banned, message, {}) is None:
                        raise StepFailed(
                            f"forbidden message {short(message)} before {short(pattern)}"
                        )
                skipped.append(Missed.of(message, problem))
    except TimeoutError:
        raise StepFailed(
            f"timed out after {step.timeout} s waiting for {short(pattern)}; got {_recent(skipped)}"
        ) from None
    except ConnectionClosed as exc:
        raise StepFailed(
            f"connection closed ({_close(exc)}) waiting for {short(pattern)}; "
            f"got {_recent(skipped)}"
        ) from None


@dataclass(frozen=True, slots=True)
class Missed:
    """A message an ``expect`` skipped, as its report shows it.

    Attributes:
        text: the message's type and the field that did not match (path, expected and
            got), e.g. ``result (/result/result: expected 42, got 1000.0)``; a message of
            another type is shown by its type alone, one without a type as cut JSON.
        near: the message had the expected type, so its mismatch is the one to read.
    """

    text: str
    near: bool

    @classmethod
    def of(cls, message: Any, problem: str) -> Missed:
        kind = message.get("type") if isinstance(message, dict) else None
        if not isinstance(kind, str):
            return cls(short(message), near=False)
        if problem.startswith("/type:"):
            return cls(kind, near=False)
        return cls(f"{kind} ({problem})", near=True)


def _recent(skipped: list[Missed]) -> str:
    """The last three skipped messages, and the last one of the expected type when it is
    older (its mismatching field is what the reader needs)."""
    if not skipped:
        return "nothing"
    tail = skipped[-3:]
    nearest = next((s for s in reversed(skipped[:-3]) if s.near), None)
    first = f"{nearest.text}, " if nearest is not None else ""
    more = len(skipped) - len(tail) - (nearest is not None)
    then = f"{more} more, then " if more else ""
    return first + then + " | ".join(s.text for s in tail)


async def _expect_close(conv: Conversation, step: Step) -> str:
    want = step.value if isinstance(step.value, dict) else {}
    skipped: list[Missed] = []
    try:
        async with asyncio.timeout(step.timeout):
            while True:
                message = await conv.receive()
                if step.strict:
                    raise StepFailed(f"expected a close; got {short(message)}")
                skipped.append(Missed(short(message), near=False))
    except TimeoutError:
        raise StepFailed(f"no close within {step.timeout} s; got {_recent(skipped)}") from None
    except ConnectionClosed:
        pass
    code, reason = conv.closed or (None, "")
    problem = match(
        substitute(want, conv.captures), {"code": code, "reason": reason}, conv.captures
    )
    if problem:
        raise StepFailed(f"expected close {short(want)}; got code {code} {reason!r} ({problem})")
    return f"closed with code {code} {reason!r}"


async def _disconnect(conv: Conversation, step: Step) -> str:
    ws = conv.require_ws()
    ws.transport.abort()  # a dropped network, not a polite close
    with contextlib.suppress(Exception):
        async with asyncio.timeout(step.timeout):
            await ws.wait_closed()
    conv.ws = None
    return f"dropped the connection (last seq seen {conv.last_seq})"


async def _resume(conv: Conversation, step: Step) -> str:
    if conv.ws is not None:
        await _disconnect(conv, step)
    if conv.session_id is None or conv.resume_token is None:
        raise StepFailed("resume before any welcome was received")
    overrides = substitute(step.value, conv.captures) if isinstance(step.value, dict) else {}
    hello = {
        **conv.first_hello(),
        "session_id": conv.session_id,
        "resume_token": conv.resume_token,
        "last_seq": conv.last_seq,
        **overrides,
    }
    hello.pop("context", None)
    try:
        async with asyncio.timeout(step.timeout):
            await conv.open(hello)
    except (OSError, InvalidHandshake, TimeoutError) as exc:
        raise StepFailed(f"cannot reconnect: {exc}") from exc
    return f"reconnected with session_id, resume_token, last_seq={hello['last_seq']}"


async def _elicit(conv: Conversation, step: Step) -> str:
    """Answer an elicitation (SPEC M3): receive the ``elicit.request`` matching
    ``request`` (with the step's ``timeout``, ``strict`` and ``forbid``), capture its
    ``elicitation_id``, send ``elicit.answer`` with ``action`` (and ``content``), then
    receive its ``elicit.result`` and match ``result`` (default ``{accepted: true}``)."""
    spec = step.value
    pattern = {**spec.get("request", {}), "type": "elicit.request"}
    request, asked = await _receive_match(conv, dataclasses.replace(step, value=pattern))
    conv.captures["elicitation_id"] = request.get("elicitation_id")
    answer: dict[str, Any] = {
        "type": "elicit.answer",
        "id": f"elicit-{step.index}-{conv.captures['run']}",
        "elicitation_id": request.get("elicitation_id"),
        "action": spec["action"],
    }
    if "content" in spec:
        answer["content"] = substitute(spec["content"], conv.captures)
    await _write(conv, encode_json(answer), text=True)
    reply = {"type": "elicit.result", "id": answer["id"]}
    got, _ = await _receive_match(
        conv, dataclasses.replace(step, value=reply, strict=False, forbid=())
    )
    want = substitute(spec.get("result", {"accepted": True}), conv.captures)
    problem = match(want, got, conv.captures)
    if problem is not None:
        raise StepFailed(f"expected elicit.result {short(want)}; got {short(got)} ({problem})")
    return f"{asked}; answered {spec['action']}; got {short(got)}"


RUNNERS: Final[dict[str, Runner]] = {
    "send": _send,
    "send_raw": _send_raw,
    "send_bytes_hex": _send_bytes,
    "send_binary_hex": _send_binary,
    "expect": _expect,
    "expect_close": _expect_close,
    "disconnect": _disconnect,
    "resume": _resume,
    "elicit": _elicit,
}
"""Step kind -> coroutine running it (one table, SPEC K3)."""


async def run_script(script: Script, url: str, token: str | None = None) -> ScriptReport:
    """Run a parsed script against the server at ``url``.

    Args:
        script: from :func:`load_script`.
        url: the server's WebSocket URL.
        token: overrides ``connect.token`` (and ``${token}``) when given.

    Returns:
        The report; the run stops at the first failed step.
    """
    report = ScriptReport(script.name, script.path, total=len(script.steps))
    conv = Conversation(script, url, token)
    try:
        require_ws_url(url)
    except ConnectFailed as exc:
        report.error = str(exc)
        return report
    try:
        await conv.open(conv.first_hello() if script.hello else None)
    except (OSError, InvalidHandshake, InvalidURI, ConnectionClosed) as exc:
        report.error = f"cannot connect to {url}: {exc}"
        return report
    try:
        for step in script.steps:
            try:
                detail = await RUNNERS[step.kind](conv, step)
            except StepFailed as exc:
                report.steps.append(StepResult(step.index, step.kind, False, str(exc)))
                break
            report.steps.append(StepResult(step.index, step.kind, True, detail))
    finally:
        await conv.close()
    return report


async def run_file(path: Path | str, url: str, token: str | None = None) -> ScriptReport:
    """Load and run one script file (SPEC K3); a malformed file is a failed report."""
    try:
        script = load_script(path)
    except ScriptError as exc:
        return ScriptReport(Path(path).stem, Path(path), error=str(exc))
    return await run_script(script, url, token)


async def run_files(
    paths: Sequence[Path | str], url: str, token: str | None = None
) -> list[ScriptReport]:
    """Run files one after the other (each on its own connection)."""
    return [await run_file(path, url, token) for path in paths]
