"""Before/after of server changes: copies of the tree measured side by side, interleaved.

``python -m bench.compare [--rounds 5] [--modes p1:400,p2:1,p11:300,p12:1] TREE...``

Each ``TREE`` is a copy of the project (``gateway/``, ``protocol/``, ``catalog/``,
``toolbus/``, ``bench/``), e.g. one with a change and one without. One toolbus bench
server runs per tree (``python -m bench.servers toolbus`` with the tree as working
directory, so the tree's own packages shadow the installed ones), and every round runs
each mode against each server in turn (reversed every other round), each measurement
in a fresh client process of the same tree. Modes:

- ``p1:N`` -- N sequential calls through the tree's raw bench client (after 50 warm-up
  calls); value: median RTT in us.
- ``p2:S`` -- 50 sessions of the raw client calling for S seconds; value: calls/s.
- ``p11:N``, ``p12:S`` -- the same through the tree's own Python client.

Each row also gives the server's CPU time per call (``/proc/PID/stat``, all threads) and
the client process's, in us. It prints every measurement, then the medians over rounds
and their ratio to the first tree. Nothing is written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.nodes import cpu_seconds


async def _measure(mode: str, url: str, size: float, pid: int) -> dict[str, float]:
    """One measurement from a client process whose working directory is the tree."""
    from bench import clients as c
    from bench import peers

    own = mode in ("p11", "p12")
    kind: Any = peers.ToolbusOfficial if own else c.ToolbusClient
    if mode in ("p1", "p11"):
        client = await kind.open(url)
        await c.sequential(client, 50)
        server, mine = cpu_seconds([pid]), time.process_time()
        rtts = await c.sequential(client, int(size))
        server, mine = cpu_seconds([pid]) - server, time.process_time() - mine
        await client.close()
        value, calls = statistics.median(rtts) * 1e6, size
    else:
        server, mine = cpu_seconds([pid]), time.process_time()
        done = await c.concurrent("toolbus", url, 50, size, clients={"toolbus": kind})
        server, mine = cpu_seconds([pid]) - server, time.process_time() - mine
        value, calls = done["calls"] / done["elapsed"], done["calls"]
    return {"value": value, "server_us": server / calls * 1e6, "client_us": mine / calls * 1e6}


def _start(tree: str) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    data = tempfile.mkdtemp(prefix="compare-")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.servers", "toolbus", "--data", data],
        cwd=tree,
        stdout=subprocess.PIPE,
        stderr=open(Path(data) / "stderr.log", "wb"),  # noqa: SIM115 - the server's for life
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else b""
    if not line:
        proc.kill()
        raise RuntimeError(f"{tree}: server did not start; see {data}/stderr.log")
    return proc, json.loads(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", default="p1:400,p2:1,p11:300,p12:1")
    parser.add_argument("--client", nargs=4, metavar=("MODE", "URL", "SIZE", "PID"))
    parser.add_argument("trees", nargs="*")
    args = parser.parse_args(argv)
    if args.client:
        sys.path.insert(0, os.getcwd())
        mode, url, size, pid = args.client
        print(json.dumps(asyncio.run(_measure(mode, url, float(size), int(pid)))))
        return 0
    servers = [(tree, *_start(tree)) for tree in args.trees]
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        for round_ in range(args.rounds):
            for spec in args.modes.split(","):
                mode, size = spec.split(":")
                order = list(range(len(servers)))[:: -1 if round_ % 2 else 1]
                for i in order:
                    tree, _, info = servers[i]
                    url = f"ws://127.0.0.1:{info['port']}/"
                    command = [sys.executable, "-m", "bench.compare", "--client", mode, url]
                    out = subprocess.run(
                        [*command, size, str(info["pid"])],
                        cwd=tree,
                        capture_output=True,
                        text=True,
                        timeout=600,
                        check=True,
                    )
                    value = json.loads(out.stdout.strip().splitlines()[-1])
                    results.setdefault((mode, i), []).append(value)
                    print(round_, mode, tree, {k: round(v, 1) for k, v in value.items()})
    finally:
        for _, proc, _ in servers:
            proc.terminate()
            proc.wait()
    print("\nmedians over rounds (ratio to the first tree):")
    for spec in args.modes.split(","):
        mode = spec.split(":")[0]
        first: dict[str, float] = {}
        for i, (tree, _, _) in enumerate(servers):
            rows = results[(mode, i)]
            med = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
            first = first or med
            cells = "  ".join(f"{k}={v:.1f} ({v / first[k]:.2f}x)" for k, v in med.items())
            print(f"{mode:4} {tree}  {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
