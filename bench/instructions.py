"""Instructions per call, counted by valgrind's callgrind: a cost the machine's load does
not move.

``python -m bench.instructions [--calls 400] [--modes p1,p11] [--peers] [TREE ...]``

Timing on a shared 2-core machine drifts by up to 20 % between rounds of the same trees
(``docs/bench.md``), so a change worth a few per cent cannot be told from noise by
timing. Callgrind counts the instructions a process executes in user space: the same
for the same code, inputs and environment, whatever else runs on the machine. It does
not count the kernel's share (system calls, wake-ups) nor cache misses, so it measures
the Python work of a call, not its wall time; read it beside ``bench.compare``.

Every server (the floor, one toolbus server per ``TREE``, default this tree, and with
``--peers`` python-socketio) and every client runs under ``valgrind --tool=callgrind
--instr-atstart=no`` (fast until counting starts). For each system and mode, the client
opens its session(s) and makes 50 warm-up calls; then counting is switched on and
zeroed in both processes (``callgrind_control -i on``, ``-z``), the client makes the
measured calls, and both dump (``-d``). Values are instructions per call, server and
client, and their ratio to the first system of the same mode. Modes:

- ``p1``: sequential calls, the bench's raw client (the floor's echo client for the
  floor; toolbus's raw client with ``tool_start: gated``), as P1.
- ``p11``: sequential calls through each system's own Python client (toolbus's
  ``toolbus.connect``, socket.io's ``AsyncClient.call``), as P11; not the floor.
- ``p2``: 50 sessions, each making ``calls // 50`` calls (a fixed count, not a
  duration), as P2. Under callgrind every process is tens of times slower, so how many
  calls share a commit differs from a real run: compare trees with it, not with P2.

Nothing is written unless ``--keep DIR`` is given (then ``DIR`` keeps every process's
dumps, ``NAME.cg.N``, for ``callgrind_annotate``); ``valgrind`` must be on ``PATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

CALLGRIND = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-instr=no"]
SESSIONS = 50
WARM_UP = 50
START_S = 600
"""Seconds a server or client may take to get ready under callgrind."""


class Counted:
    """One process under callgrind, read through its dumps."""

    def __init__(self, command: list[str], cwd: str, tmp: Path, name: str) -> None:
        self.out = tmp / f"{name}.cg"
        files = [f"--callgrind-out-file={self.out}", f"--log-file={tmp / name}.vg"]
        self.proc = subprocess.Popen(
            [*CALLGRIND, *files, *command],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(tmp / f"{name}.err", "wb"),  # noqa: SIM115 - the process's for life
        )
        self.dumps = 0

    def line(self) -> str:
        """The process's next line on stdout (its readiness, its results)."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_S)
        text = self.proc.stdout.readline().decode() if ready else ""
        if not text:
            self.proc.kill()
            raise RuntimeError(f"{self.out.stem}: no answer; see {self.out.parent}")
        return text.strip()

    def say(self, text: str) -> None:
        stdin: IO[bytes] | None = self.proc.stdin
        assert stdin is not None
        stdin.write(text.encode() + b"\n")
        stdin.flush()

    def control(self, *args: str) -> None:
        subprocess.run(
            ["callgrind_control", *args, str(self.proc.pid)], check=True, capture_output=True
        )

    def start_counting(self) -> None:
        self.control("-i", "on")
        self.control("-z")

    def counted(self) -> int:
        """Instructions since :meth:`start_counting` (dumps, then reads the dump)."""
        self.control("-d")
        self.control("-i", "off")
        self.dumps += 1
        path = Path(f"{self.out}.{self.dumps}")
        for text in path.read_text().splitlines():
            if text.startswith("totals:"):
                return int(text.split()[1])
        raise RuntimeError(f"{path}: no totals line")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _server(kind: str, tree: str, tmp: Path, name: str) -> tuple[Counted, int]:
    data = tmp / f"{name}-data"
    data.mkdir()
    server = Counted(
        [sys.executable, "-m", "bench.servers", kind, "--data", str(data)], tree, tmp, name
    )
    return server, int(json.loads(server.line())["port"])


async def _client_run(mode: str, url: str, calls: int, own: bool, floor: bool) -> None:
    """The client side, in its own process: ready, then the measured calls on ``go``."""
    from bench import clients as c
    from bench import peers

    kind: Any = c.FloorClient if floor else c.ToolbusClient
    if own:
        kind = peers.SocketioClient if url.startswith("http") else peers.ToolbusOfficial
    count = SESSIONS if mode == "p2" else 1
    opened = [await kind.open(url) for _ in range(count)]
    for client in opened:
        await c.sequential(client, WARM_UP // count or 1)
    loop = asyncio.get_running_loop()
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    each = max(calls // count, 1)
    await asyncio.gather(*(c.sequential(client, each) for client in opened))
    print(json.dumps({"calls": each * count}), flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    for client in opened:
        await client.close()


def _measure(
    mode: str, system: str, tree: str, port: int, server: Counted, calls: int, tmp: Path
) -> dict[str, float]:
    scheme = "http" if system == "socketio" else "ws"
    url = f"{scheme}://127.0.0.1:{port}" + ("" if system == "socketio" else "/")
    flags = ["--own"] if mode == "p11" else []
    flags += ["--floor"] if system == "floor" else []
    name = f"{system}-{mode}-{os.urandom(3).hex()}"
    command = [sys.executable, "-m", "bench.instructions", "--client", mode, url, str(calls)]
    client = Counted([*command, *flags], tree, tmp, name)
    try:
        if client.line() != "ready":
            raise RuntimeError(f"{name}: client did not get ready")
        server.start_counting()
        client.start_counting()
        client.say("go")
        done = int(json.loads(client.line())["calls"])
        served, made = server.counted(), client.counted()
        client.say("exit")
    finally:
        client.stop()
    return {"server": served / done, "client": made / done}


def _systems(trees: list[str], peers: bool) -> Iterator[tuple[str, str]]:
    here = str(Path(__file__).resolve().parent.parent)
    yield "floor", here
    for tree in trees or [here]:
        yield "toolbus", tree
    if peers:
        yield "socketio", here


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    parser.add_argument("--calls", type=int, default=400, help="measured calls per mode")
    parser.add_argument("--modes", default="p1,p11")
    parser.add_argument("--peers", action="store_true", help="also python-socketio (p11)")
    parser.add_argument("--keep", metavar="DIR", help="keep the callgrind dumps in DIR")
    parser.add_argument("--client", nargs=3, metavar=("MODE", "URL", "CALLS"))
    parser.add_argument("--own", action="store_true")
    parser.add_argument("--floor", action="store_true")
    parser.add_argument("trees", nargs="*")
    args = parser.parse_args(argv)
    if args.client:
        sys.path.insert(0, os.getcwd())
        mode, url, calls = args.client
        asyncio.run(_client_run(mode, url, int(calls), args.own, args.floor))
        return 0
    if shutil.which("valgrind") is None:
        print("bench.instructions needs valgrind on PATH", file=sys.stderr)
        return 2
    modes = args.modes.split(",")
    results: list[tuple[str, str, str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="instructions-") as tmp_name:
        tmp = Path(args.keep or tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        for i, (system, tree) in enumerate(_systems(args.trees, args.peers)):
            kind = "toolbus" if system == "toolbus" else system
            server, port = _server(kind, tree, tmp, f"{system}{i}")
            try:
                for mode in modes:
                    if (system == "floor" and mode == "p11") or (
                        system == "socketio" and mode != "p11"
                    ):
                        continue
                    value = _measure(mode, system, tree, port, server, args.calls, tmp)
                    results.append((mode, system, tree, value))
                    print(mode, system, tree, {k: round(v) for k, v in value.items()})
            finally:
                server.stop()
    print("\ninstructions per call (ratio to the first system of the mode):")
    for mode in modes:
        rows = [r for r in results if r[0] == mode]
        first = rows[0][3] if rows else {}
        for _, system, tree, value in rows:
            cells = "  ".join(
                f"{k}={v / 1e3:,.0f}k ({v / first[k]:.2f}x)" for k, v in value.items()
            )
            print(f"{mode:4} {system:8} {tree}  {cells}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
