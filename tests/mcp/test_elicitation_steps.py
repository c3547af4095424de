"""``toolbus run``'s ``elicit`` step against a real server mounting a real MCP server
that asks its user (SPEC M3, K3).

The server mounts ``tests/mcp/elicit_server.py`` (the SDK's MCPServer over stdio) as
``asker``; the scripts are ``tests/conformance/mcp/*.yaml``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.server import Gateway
from tests.mcp.support import asker_mount, mcp_settings
from tests.support import running
from toolbus.script import ScriptError, load_script, run_file

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "tests" / "conformance" / "mcp").glob("*.yaml"))


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running(mcp_settings(tmp_path, [asker_mount()])) as gw:
        yield gw


def test_m3_elicitation_scripts_exist() -> None:
    """SPEC K3: the MCP conformance scripts are there (a missing file is a failure)."""
    assert [p.stem for p in SCRIPTS] == ["elicitation_accept", "elicitation_decline_cancel"]


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
async def test_m3_elicitation_script_steps(gateway: Gateway, path: Path) -> None:
    """SPEC M3, K3: each script's ``elicit`` steps match the question (message, schema,
    call) and answer accept with typed content, decline or cancel; the MCP server's
    result says what it got."""
    report = await run_file(path, gateway.url)
    assert report.passed, report.render()
    elicits = [s for s in report.steps if s.kind == "elicit"]
    assert elicits
    assert all("answered " in s.detail for s in elicits)


async def test_m3_elicit_step_reports_an_unexpected_result(
    gateway: Gateway, tmp_path: Path
) -> None:
    """SPEC K3: an ``elicit`` step whose ``result`` pattern does not match the server's
    ``elicit.result`` fails, naming what it expected and what came."""
    script = tmp_path / "wrong_result.yaml"
    script.write_text(
        """
name: wrong result
connect: {token: alice-token, profile: demo}
steps:
  - expect: {type: catalog, tools: {contains: {name: asker_ask}}}
    timeout: 10
  - send: {type: invoke, call_id: "w1-${run}", tool: asker_ask, params: {topic: x}}
  - elicit: {request: {call_id: "w1-${run}"}, action: decline, result: {accepted: false}}
    timeout: 10
"""
    )
    report = await run_file(script, gateway.url)
    failure = report.failure
    assert failure is not None
    assert (failure.index, failure.kind) == (3, "elicit")
    assert failure.detail.startswith('expected elicit.result {"accepted":false}; got {')
    assert '"accepted":true' in failure.detail
    assert "/accepted" in failure.detail


@pytest.mark.parametrize(
    "step",
    [
        "{elicit: {action: decline, content: {a: 1}}}",  # content only with accept
        "{elicit: {action: maybe}}",
        "{elicit: {action: accept, reply: {}}}",
        "{elicit: {action: accept, request: [1]}}",
    ],
)
def test_m3_elicit_step_format_errors(tmp_path: Path, step: str) -> None:
    """SPEC K3: a malformed ``elicit`` step is a format error naming file and step."""
    script = tmp_path / "bad.yaml"
    script.write_text(f"steps:\n  - {step}\n")
    with pytest.raises(ScriptError, match=r"bad\.yaml: step 1: bad value for 'elicit'"):
        load_script(script)
