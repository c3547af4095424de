"""The README's scripted walk-through runs green against the real server (SPEC K3, O1)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from gateway.demo import handlers
from gateway.server import Gateway
from tests.support import MS, WAIT
from toolbus.script import run_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def test_walkthrough_script(gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """README walk-through: examples/walkthrough.yaml passes every step."""
    monkeypatch.setattr(handlers, "REPORT_SECTION_SECONDS", MS)
    report = await run_file(EXAMPLES / "walkthrough.yaml", gateway.url, token="alice-token")
    assert report.passed, report.render()
    assert [step.ok for step in report.steps] == [True] * 22


README = Path(__file__).resolve().parents[2] / "README.md"


def _plain_python_snippet() -> str:
    """The README's "plain Python, with nothing but websockets" program (the text
    between ``python -c '`` and its closing quote)."""
    text = README.read_text()
    start = text.index("python -c '\n") + len("python -c '\n")
    return text[start : text.index("asyncio.run(main())'", start) + len("asyncio.run(main())")]


async def test_readme_plain_python_snippet_runs_twice(gateway: Gateway, tmp_path: Path) -> None:
    """SPEC S1, I8, I15: the README's plain-websockets program, against the real server
    (its URL put in for the README's), prints the welcome, the catalog, `tool_start` and
    the `result`, and runs again unchanged: each run sends a call id of its own (a
    call id it reused with other parameters would be refused `call_id_conflict`)."""
    program = _plain_python_snippet().replace("ws://127.0.0.1:8765/", gateway.url)
    (tmp_path / "toolbus-data").mkdir()
    (tmp_path / "toolbus-data" / "dev-token").write_text("alice-token\n")
    for _ in range(2):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", program, cwd=tmp_path, stdout=asyncio.subprocess.PIPE
        )
        async with asyncio.timeout(WAIT):
            out, _ = await proc.communicate()
        assert proc.returncode == 0
        lines = out.decode().splitlines()
        assert [line.split("'type': '")[1].split("'")[0] for line in lines[2:]] == [
            "tool_start",
            "result",
        ], lines
        assert '"type":"welcome"' in lines[0]
        assert "'result': 1.609344" in lines[3]
