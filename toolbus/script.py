"""Scripted conversations: a YAML file of steps run against any toolbus server (SPEC K3).

A script is a conversation over one raw WebSocket: the runner sends exactly what the
file says and matches what comes back, so it can test any server that speaks protocol
``toolbus.v1``, including with bad input. The format is documented in
``docs/scripts.md``; in short::

    name: sync invoke
    connect: {token: alice-token, profile: demo}     # optional; hello sent for you
    steps:
      - send: {type: invoke, call_id: c1, tool: convert_units,
               params: {value: 1, from_unit: km, to_unit: m}}
      - expect: {type: result, call_id: c1, result: {result: 1000.0}, seq: {capture: s}}
        timeout: 5

Step kinds (one per step): ``send``, ``send_raw``, ``send_bytes_hex``,
``send_binary_hex``, ``expect`` (options ``timeout``, ``strict``, ``forbid``),
``expect_close``, ``disconnect``, ``resume``. There is no ``sleep``: ordering comes
from expectations. Matchers inside ``expect``: a literal (equality), ``{regex: ...}``,
``{any: true}``, ``{absent: true}``, ``{contains: pattern}`` (a list element matches),
``{capture: name}`` (store the value; later ``${name}`` is replaced by it); nested
objects match as subsets, lists element by element.

Entry points: :func:`run_file` (one file, returns a :class:`ScriptReport`) and
:func:`main` for ``toolbus run FILE... --url URL [--token T]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson
import yaml
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.typing import Subprotocol

DEFAULT_TIMEOUT: Final = 5.0
"""Seconds an ``expect`` or ``expect_close`` waits unless the step says ``timeout``."""

SUBPROTOCOL: Final = Subprotocol("toolbus.v1")
KINDS: Final = (
    "send",
    "send_raw",
    "send_bytes_hex",
    "send_binary_hex",
    "expect",
    "expect_close",
    "disconnect",
    "resume",
)
OPTIONS: Final = frozenset({"timeout", "strict", "forbid", "note"})
MATCHER_KEYS: Final = frozenset({"regex", "any", "capture", "absent", "contains"})
_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_MISSING: Final = object()


class ScriptError(Exception):
    """A script file that does not follow the format (reported with file and step)."""


class StepFailed(Exception):
    """A step did not get what it expected; the message says expected vs got."""


# ---------------------------------------------------------------------------- the format


@dataclass(frozen=True, slots=True)
class Step:
    """One step: ``kind`` (see :data:`KINDS`), its ``value`` and options."""

    index: int
    kind: str
    value: Any
    timeout: float = DEFAULT_TIMEOUT
    strict: bool = False
    forbid: tuple[Any, ...] = ()
    note: str | None = None


@dataclass(frozen=True, slots=True)
class Script:
    """A parsed script file.

    Attributes:
        name: the ``name`` key (defaults to the file name).
        path: where it was read from.
        token: ``connect.token``: the credential of the automatic ``hello`` and of
            ``resume``; available to steps as ``${token}``.
        profile: ``connect.profile``.
        context: ``connect.context`` (object of strings).
        options: ``connect.options`` (e.g. ``{confirm_tool_calls: true}``).
        hello: ``connect.hello`` (default true): send ``hello`` right after connecting.
        steps: the steps in order.
    """

    name: str
    path: Path
    token: str | None
    profile: str | None
    context: dict[str, str]
    options: dict[str, Any]
    hello: bool
    steps: list[Step]


def load_script(path: Path | str) -> Script:
    """Read and check a script file.

    Raises:
        ScriptError: unreadable YAML or a step that breaks the format, naming the file
            and the step index (1-based).
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ScriptError(f"{path}: cannot read: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
        raise ScriptError(f"{path}: a script is a mapping with a 'steps' list")
    unknown = set(data) - {"name", "connect", "steps"}
    if unknown:
        raise ScriptError(f"{path}: unknown top-level keys {sorted(unknown)}")
    connect = data.get("connect") or {}
    if not isinstance(connect, dict) or set(connect) - {
        "token",
        "profile",
        "context",
        "options",
        "hello",
    }:
        raise ScriptError(f"{path}: 'connect' takes token, profile, context, options, hello")
    steps = [_parse_step(path, i, raw) for i, raw in enumerate(data["steps"], start=1)]
    return Script(
        name=str(data.get("name") or path.stem),
        path=path,
        token=connect.get("token"),
        profile=connect.get("profile"),
        context=dict(connect.get("context") or {}),
        options=dict(connect.get("options") or {}),
        hello=bool(connect.get("hello", True)),
        steps=steps,
    )


def _parse_step(path: Path, index: int, raw: Any) -> Step:
    where = f"{path}: step {index}"
    if not isinstance(raw, dict):
        raise ScriptError(f"{where}: a step is a mapping")
    kinds = [k for k in raw if k in KINDS]
    if len(kinds) != 1:
        raise ScriptError(f"{where}: exactly one of {', '.join(KINDS)} (got {sorted(raw)})")
    unknown = set(raw) - OPTIONS - set(KINDS)
    if unknown:
        raise ScriptError(f"{where}: unknown keys {sorted(unknown)} (options: {sorted(OPTIONS)})")
    kind = kinds[0]
    value = raw[kind]
    checks: dict[str, Callable[[Any], bool]] = {
        "send": lambda v: isinstance(v, dict),
        "send_raw": lambda v: isinstance(v, str),
        "send_bytes_hex": _is_hex,
        "send_binary_hex": _is_hex,
        "expect": lambda v: isinstance(v, dict),
        "expect_close": lambda v: v is True or isinstance(v, dict),
        "disconnect": lambda v: v is True,
        "resume": lambda v: v is True or isinstance(v, dict),
    }
    if not checks[kind](value):
        raise ScriptError(f"{where}: bad value for {kind!r}: {value!r}")
    forbid = raw.get("forbid") or []
    if not isinstance(forbid, list):
        raise ScriptError(f"{where}: 'forbid' is a list of patterns")
    return Step(
        index=index,
        kind=kind,
        value=value,
        timeout=float(raw.get("timeout", DEFAULT_TIMEOUT)),
        strict=bool(raw.get("strict", False)),
        forbid=tuple(forbid),
        note=raw.get("note"),
    )


def _is_hex(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------- matching


def substitute(value: Any, captures: dict[str, Any]) -> Any:
    """Replace ``${name}`` references by captured values, recursively.

    A string that is exactly one reference takes the captured value with its type
    (an integer stays an integer); a reference inside a longer string is formatted in.

    Raises:
        StepFailed: a reference to a name nothing captured.
    """
    if isinstance(value, dict):
        return {k: substitute(v, captures) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, captures) for v in value]
    if not isinstance(value, str):
        return value
    whole = _REF.fullmatch(value)
    if whole:
        return _lookup(whole.group(1), captures)
    return _REF.sub(lambda ref: str(_lookup(ref.group(1), captures)), value)


def _lookup(name: str, captures: dict[str, Any]) -> Any:
    if name not in captures:
        raise StepFailed(f"${{{name}}} was never captured (known: {sorted(captures)})")
    return captures[name]


def _is_matcher(pattern: Any) -> bool:
    return isinstance(pattern, dict) and bool(pattern) and set(pattern) <= MATCHER_KEYS


def match(pattern: Any, value: Any, captures: dict[str, Any], where: str = "") -> str | None:
    """Match ``value`` against ``pattern``; ``None`` when it matches, else why not.

    Captures found on the way are added to ``captures`` (pass a scratch dict and keep it
    only on success).
    """
    if _is_matcher(pattern):
        return _match_matcher(pattern, value, captures, where)
    if isinstance(pattern, dict):
        if not isinstance(value, dict):
            return f"{where or '/'}: expected an object, got {_short(value)}"
        for key, sub in pattern.items():
            found = value.get(key, _MISSING)
            if found is _MISSING:
                if _is_matcher(sub) and sub.get("absent") is True:
                    continue
                return f"{where}/{key}: missing"
            problem = match(sub, found, captures, f"{where}/{key}")
            if problem:
                return problem
        return None
    if isinstance(pattern, list):
        if not isinstance(value, list) or len(value) != len(pattern):
            return f"{where or '/'}: expected a list of {len(pattern)}, got {_short(value)}"
        for i, (sub, item) in enumerate(zip(pattern, value, strict=True)):
            problem = match(sub, item, captures, f"{where}/{i}")
            if problem:
                return problem
        return None
    if _equal(pattern, value):
        return None
    return f"{where or '/'}: expected {_short(pattern)}, got {_short(value)}"


def _equal(a: Any, b: Any) -> bool:
    # JSON has no int/float distinction worth failing a script on (1 == 1.0), but
    # true is not 1.
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _match_matcher(
    pattern: dict[str, Any], value: Any, captures: dict[str, Any], where: str
) -> str | None:
    at = where or "/"
    if pattern.get("absent") is True:
        return f"{at}: expected absent, got {_short(value)}"
    if "regex" in pattern and not (isinstance(value, str) and re.search(pattern["regex"], value)):
        return f"{at}: {_short(value)} does not match /{pattern['regex']}/"
    if "contains" in pattern:
        if not isinstance(value, list):
            return f"{at}: expected a list, got {_short(value)}"
        for item in value:
            scratch: dict[str, Any] = {}
            if match(pattern["contains"], item, scratch, at) is None:
                captures.update(scratch)
                break
        else:
            return f"{at}: no element matches {_short(pattern['contains'])}"
    if "capture" in pattern:
        captures[str(pattern["capture"])] = value
    return None


def _short(value: Any, limit: int = 160) -> str:
    text = orjson.dumps(value).decode() if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
        self.captures: dict[str, Any] = {"token": self.token}
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
            await self.ws.send(orjson.dumps(hello), text=True)

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
            message = orjson.loads(raw)
        except orjson.JSONDecodeError:
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
    data = orjson.dumps(message)
    await _write(conv, data, text=True)
    return f"sent {_short(message)}"


async def _send_raw(conv: Conversation, step: Step) -> str:
    text = substitute(step.value, conv.captures)
    await _write(conv, str(text).encode(), text=True)
    return f"sent raw {_short(text)}"


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
    pattern = substitute(step.value, conv.captures)
    forbid = [substitute(f, conv.captures) for f in step.forbid]
    skipped: list[str] = []
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
                    return f"got {_short(message)}{extra}{captured}"
                if step.strict:
                    raise StepFailed(
                        f"expected {_short(pattern)}; got {_short(message)} ({problem})"
                    )
                for banned in forbid:
                    if match(banned, message, {}) is None:
                        raise StepFailed(
                            f"forbidden message {_short(message)} before {_short(pattern)}"
                        )
                skipped.append(_short(message, 80))
    except TimeoutError:
        raise StepFailed(
            f"timed out after {step.timeout} s waiting for {_short(pattern)}; "
            f"got {_recent(skipped)}"
        ) from None
    except ConnectionClosed as exc:
        raise StepFailed(
            f"connection closed ({_close(exc)}) waiting for {_short(pattern)}; "
            f"got {_recent(skipped)}"
        ) from None


def _recent(skipped: list[str]) -> str:
    if not skipped:
        return "nothing"
    tail = skipped[-3:]
    more = f"{len(skipped) - len(tail)} more, then " if len(skipped) > len(tail) else ""
    return more + " | ".join(tail)


async def _expect_close(conv: Conversation, step: Step) -> str:
    want = step.value if isinstance(step.value, dict) else {}
    skipped: list[str] = []
    try:
        async with asyncio.timeout(step.timeout):
            while True:
                message = await conv.receive()
                if step.strict:
                    raise StepFailed(f"expected a close; got {_short(message)}")
                skipped.append(_short(message, 80))
    except TimeoutError:
        raise StepFailed(f"no close within {step.timeout} s; got {_recent(skipped)}") from None
    except ConnectionClosed:
        pass
    code, reason = conv.closed or (None, "")
    problem = match(
        substitute(want, conv.captures), {"code": code, "reason": reason}, conv.captures
    )
    if problem:
        raise StepFailed(f"expected close {_short(want)}; got code {code} {reason!r} ({problem})")
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


RUNNERS: Final[dict[str, Runner]] = {
    "send": _send,
    "send_raw": _send_raw,
    "send_bytes_hex": _send_bytes,
    "send_binary_hex": _send_binary,
    "expect": _expect,
    "expect_close": _expect_close,
    "disconnect": _disconnect,
    "resume": _resume,
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
        await conv.open(conv.first_hello() if script.hello else None)
    except (OSError, InvalidHandshake, ConnectionClosed) as exc:
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


def main(argv: Sequence[str] | None = None) -> int:
    """``toolbus run FILE... --url URL [--token T]``: run scripts, print each step.

    Returns:
        0 when every script passed, 1 otherwise.
    """
    parser = argparse.ArgumentParser(
        prog="toolbus run", description="Run scripted toolbus conversations (SPEC K3)."
    )
    parser.add_argument("files", nargs="+", type=Path, help="script files (YAML)")
    parser.add_argument(
        "--url", required=True, help="server WebSocket URL, e.g. ws://127.0.0.1:8765/"
    )
    parser.add_argument(
        "--token", default=None, help="credential; overrides each file's connect.token"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print only failed steps")
    args = parser.parse_args(list(argv) if argv is not None else None)
    reports = asyncio.run(run_files(args.files, args.url, args.token))
    for report in reports:
        print(report.render(verbose=not args.quiet))
    failed = sum(1 for r in reports if not r.passed)
    print(f"{len(reports) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
