"""Questions asked of an MCP host at ``/mcp`` (SPEC M3, M4, A4): a mounted MCP server's
question during the host's call, and an approval whose answer fails. The real gateway on
127.0.0.1, ``tests/mcp/elicit_server.py`` mounted as ``asker``, the SDK's own client."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import mcp_types as types
import pytest
from mcp import Client

from tests.gateway.tools_for_tests import audit_records
from tests.mcp.support import asker_mount, mcp_settings
from tests.mcp.test_serve import _waiting, mcp_client
from tests.support import WAIT, running, settings_for

ADA = {"name": "Ada", "email": "ada@example.org", "age": 36}


def _answer(result: types.CallToolResult) -> str:
    """The text ``asker_ask`` answered with: what its question got back."""
    assert isinstance(result.structured_content, dict), result
    return str(result.structured_content["text"])


async def _mounted(host: Client) -> None:
    """Until the host lists ``asker_ask`` (the mount connects after the gateway starts)."""
    async with asyncio.timeout(WAIT):
        for _ in itertools.count():
            if "asker_ask" in {t.name for t in (await host.list_tools()).tools}:
                return
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("action", ["accept", "decline"])
async def test_m3_m4_a_mounted_question_reaches_the_host_and_its_answer_goes_back(
    tmp_path: Any, mode: str, action: str
) -> None:
    """SPEC M3, M4: the host is asked the mounted server's own question and form, and its
    answer (``accept`` with content, ``decline``) is what the server gets."""
    asked: list[tuple[str, dict[str, Any]]] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        asked.append((params.message, params.requested_schema))
        if action == "accept":
            return types.ElicitResult(action="accept", content=dict(ADA))
        return types.ElicitResult(action="decline")

    settings = mcp_settings(tmp_path, [asker_mount()], calls={"approval_timeout": 30})
    async with (
        running(settings) as gw,
        mcp_client(gw, "alice-token", "demo", elicitation_callback=elicit, mode=mode) as host,
    ):
        await _mounted(host)
        answer = await asyncio.wait_for(host.call_tool("asker_ask", {"topic": "tea"}), WAIT)
        left = _waiting(gw)
        pending = len(gw.parts.elicitations._pending)
    [(message, schema)] = asked
    assert message.endswith("(tea)")
    assert set(schema["properties"]) >= set(ADA)
    assert _answer(answer).startswith(action), _answer(answer)
    if action == "accept":
        assert '"name": "Ada"' in _answer(answer)
    assert (left, pending) == ((0, 0), 0)


async def test_m3_m4_a_host_without_elicitation_answers_a_mounted_question_decline(
    tmp_path: Any,
) -> None:
    """SPEC M3, M4, A4 (never silent): a host that declared no elicitation cannot be asked;
    the mounted server gets ``decline`` at once, not after ``approval_timeout``."""
    settings = mcp_settings(tmp_path, [asker_mount()], calls={"approval_timeout": 30})
    async with running(settings) as gw, mcp_client(gw, "alice-token", "demo") as host:
        await _mounted(host)
        started = time.monotonic()
        answer = await asyncio.wait_for(host.call_tool("asker_ask", {"topic": "tea"}), WAIT)
        took = time.monotonic() - started
        left = _waiting(gw)
    assert _answer(answer) == "decline"
    assert took < WAIT / 2, took
    assert left == (0, 0)


async def test_m3_m4_a_failed_answer_to_a_mounted_question_is_cancel(tmp_path: Any) -> None:
    """SPEC M3, A4: the host answers the mounted server's question with a JSON-RPC error;
    the server gets ``cancel`` at once and the call ends."""

    async def broken(context: Any, params: types.ElicitRequestParams) -> types.ErrorData:
        return types.ErrorData(code=types.INTERNAL_ERROR, message="form UI crashed")

    settings = mcp_settings(tmp_path, [asker_mount()], calls={"approval_timeout": 30})
    async with (
        running(settings) as gw,
        mcp_client(gw, "alice-token", "demo", elicitation_callback=broken, mode="legacy") as host,
    ):
        await _mounted(host)
        answer = await asyncio.wait_for(host.call_tool("asker_ask", {"topic": "tea"}), WAIT)
        left = _waiting(gw)
    assert _answer(answer) == "cancel"
    assert left == (0, 0)


async def test_m4_a4_a_failed_approval_answer_is_denied_by_the_server(tmp_path: Any) -> None:
    """SPEC M4, A4, A5, I11: the host answers the approval with a JSON-RPC error; the call
    is denied by the server (``disconnected``, audited ``by`` ``server``), ends with the
    declined result, and holds no slot."""

    async def broken(context: Any, params: types.ElicitRequestParams) -> types.ErrorData:
        return types.ErrorData(code=types.INTERNAL_ERROR, message="approval UI crashed")

    with audit_records() as records:
        async with (
            running(settings_for(tmp_path)) as gw,
            mcp_client(gw, "bob-token", elicitation_callback=broken, mode="legacy") as host,
        ):
            denied = await asyncio.wait_for(host.call_tool("notes_delete", {"note_id": 1}), WAIT)
            left = (_waiting(gw), gw.pipeline.in_flight(), len(gw.parts.approvals.pending))
    assert denied.structured_content is not None
    assert denied.structured_content["declined"] is True
    assert left == ((0, 0), [], 0)
    (record,) = records
    approval = record["approval"]
    assert (approval["resolution"], approval["reason"], approval["by"]) == (
        "denied",
        "disconnected",
        "server",
    )
