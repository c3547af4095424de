"""``toolbus client`` as a subprocess against the real server, stdin scripted (SPEC K1, O1)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from gateway.server import Gateway
from tests.support import WAIT

ROOT = Path(__file__).resolve().parents[2]


class Console:
    """A running ``python -m toolbus.interactive`` with line-wise stdin and stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def until(self, needle: str) -> str:
        """Read stdout until a line containing ``needle``; fails after WAIT seconds."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(WAIT):
            while True:
                raw = await self.proc.stdout.readline()
                assert raw, f"console exited before {needle!r}; output: {self.lines}"
                line = raw.decode().rstrip("\n")
                self.lines.append(line)
                if needle in line:
                    return line


async def start(
    gateway: Gateway, *extra: str, token: str = "alice-token", url: str | None = None
) -> Console:
    """``toolbus client`` as a subprocess with piped stdin, stdout and stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "toolbus.interactive",
        url or gateway.url,
        "--token",
        token,
        "--profile",
        "demo",
        *extra,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )
    return Console(proc)


async def test_console_invoke_and_quit(gateway: Gateway) -> None:
    """SPEC K1: the console prints the catalog, runs invoke, prints the result, quits with 0."""
    console = await start(gateway)
    await console.until("catalog (initial")
    await console.send('invoke convert_units {"value": 2, "from_unit": "km", "to_unit": "m"}')
    line = await console.until("result convert_units")
    assert '"result":2000.0' in line
    await console.send("tools")
    await console.until("notes_delete [sync] (approval)")
    await console.send("quit")
    async with asyncio.timeout(WAIT):
        code = await console.proc.wait()
    assert code == 0


async def test_console_approval_and_job(gateway: Gateway) -> None:
    """SPEC K1, A3, J4: approval prompts show an alias; confirm answers; job pushes are printed."""
    console = await start(gateway)
    await console.until("catalog (initial")
    await console.send('invoke notes_delete {"note_id": 99}')
    await console.until("approval a1: notes_delete")
    await console.send("confirm a1 deny")
    await console.until("confirm a1: accepted")
    await console.until("result (declined) notes_delete")
    await console.send('invoke report {"topic": "console", "sections": 1}')
    await console.until("dispatched report")
    await console.until("job.done")
    await console.send("ctx project_id=p9")
    await console.until('context: {"project_id":"p9"}')
    await console.send("jobs")
    await console.until(" report done ")
    assert console.proc.stdin is not None
    console.proc.stdin.close()  # end of input quits too
    async with asyncio.timeout(WAIT):
        assert await console.proc.wait() == 0


async def test_console_refused(gateway: Gateway) -> None:
    """SPEC S2: a refused hello exits 2 with the reason on stderr."""
    proc = (await start(gateway, token="bad")).proc
    async with asyncio.timeout(WAIT):
        _, err = await proc.communicate()
    assert proc.returncode == 2
    assert b"auth_failed" in err


async def test_console_end_of_input_lets_calls_finish(gateway: Gateway) -> None:
    """SPEC K1: calls typed right before end of input still run and print (no silent drop);
    call errors show their details (I1 suggestions, I4 JSON pointers)."""
    console = await start(gateway)
    await console.until("catalog (initial")
    assert console.proc.stdin is not None
    console.proc.stdin.write(
        b'invoke convert_units {"value": 3, "from_unit": "km", "to_unit": "m"}\n'
        b"invoke convert_unit {}\n"
        b'invoke convert_units {"value": "x"}\n'
    )
    console.proc.stdin.close()
    await console.until("bye")  # the calls run concurrently: their lines come in any order
    async with asyncio.timeout(WAIT):
        assert await console.proc.wait() == 0
    out = console.lines
    assert any('"result":3000.0' in line for line in out if line.startswith("result convert_units"))
    assert "  did you mean: convert_units" in out
    assert "call.error convert_units: invalid_params: 3 parameter problem(s)" in out
    assert '  /value: "x" is not of type "number"' in out
    assert sum("catalog (initial" in line for line in out) == 1


async def test_console_bad_input_keeps_the_session(gateway: Gateway) -> None:
    """SPEC K1: a command with a missing or unknown argument prints its usage line (naming
    the accepted decisions) and the session goes on."""
    console = await start(gateway)
    await console.until("catalog (initial")
    await console.send('invoke notes_delete {"note_id": 98}')
    await console.until("approval a1: notes_delete")
    bad = {
        "confirm a1 yes": "usage: confirm ID allow|deny|always (not 'yes')",
        "confirm a1": "usage: confirm ID allow|deny|always",
        "cancel": "usage: cancel CALL_ID",
        "revoke": "usage: revoke TOOL",
        "cancel-job": "usage: cancel-job JOB_ID",
        "job": "usage: job ID",
        "jobs bogus": "usage: jobs [queued|running|done|failed|cancelled] (not 'bogus')",
        "ctx": "usage: ctx key=value [key=value ...]",
        "invoke": "usage: invoke TOOL {json}",
        "invoke convert_units {nope": "usage: invoke TOOL {json} (params are not JSON: ",
    }
    for line, usage in bad.items():
        await console.send(line)
        assert (await console.until("usage")).startswith(usage)
    await console.send("confirm a1 deny")
    await console.until("confirm a1: accepted")
    await console.until("result (declined) notes_delete")
    await console.send("quit")
    async with asyncio.timeout(WAIT):
        assert await console.proc.wait() == 0


async def test_console_http_url(gateway: Gateway) -> None:
    """SPEC K1: an http:// URL exits 2 with one line saying a ws:// URL is needed, no
    traceback."""
    url = gateway.url.replace("ws://", "http://")
    proc = (await start(gateway, url=url)).proc
    async with asyncio.timeout(WAIT):
        _, err = await proc.communicate()
    assert proc.returncode == 2
    fixed = gateway.url
    assert err.decode() == (
        f"cannot connect: {url!r} is not a WebSocket URL: toolbus needs a ws:// or wss:// "
        f"URL, e.g. {fixed}\n"
    )


async def test_console_bad_context_argument(gateway: Gateway) -> None:
    """SPEC K1, S5: a --context without '=' is a usage error (exit 2), not a traceback."""
    proc = (await start(gateway, "--context", "project")).proc
    async with asyncio.timeout(WAIT):
        _, err = await proc.communicate()
    assert proc.returncode == 2
    assert err.decode().splitlines()[-1] == (
        "toolbus client: error: argument --context: KEY=VALUE expected, got 'project'"
    )
