"""The README's scripted walk-through runs green against the real server (SPEC K3, O1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.demo import handlers
from gateway.server import Gateway
from tests.support import MS
from toolbus.script import run_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def test_walkthrough_script(gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """README walk-through: examples/walkthrough.yaml passes every step."""
    monkeypatch.setattr(handlers, "REPORT_SECTION_SECONDS", MS)
    report = await run_file(EXAMPLES / "walkthrough.yaml", gateway.url, token="alice-token")
    assert report.passed, report.render()
    assert [step.ok for step in report.steps] == [True] * 22
