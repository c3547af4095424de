"""The worked voice example's scripts (examples/voice, SPEC V3), up to the network boundary.

mint_key.py: the client-secret request it would send to OpenAI, and how it reads the
answer, without sending anything. pipecat_agent.py: its pipeline, built by the script's
own ``build_pipeline`` with the scripted LLM in place of OpenAI Realtime and pass-through
processors in place of the sound card, runs a gated call with the console approval
against the real toolbus server.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from pipecat.frames.frames import FunctionCallResultFrame, LLMMessagesAppendFrame
from pipecat.tests.utils import run_test

import toolbus
from gateway.server import Gateway
from tests.client.pipecat_support import Calls, Gate, Probe, Say, ScriptedLLM
from tests.support import WAIT

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "voice"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"voice_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mint_key_builds_the_client_secret_request() -> None:
    """V3: the API key goes only in the Authorization header of OpenAI's client-secret
    request; the answer's ek_ value is what gets printed."""
    mint = _load("mint_key")
    request = mint.build_request("sk-test", "gpt-realtime")
    assert (request.full_url, request.get_method()) == (
        "https://api.openai.com/v1/realtime/client_secrets",
        "POST",
    )
    assert request.get_header("Authorization") == "Bearer sk-test"
    assert request.get_header("Content-type") == "application/json"
    assert json.loads(request.data) == {"session": {"type": "realtime", "model": "gpt-realtime"}}
    assert mint.secret_from(b'{"value": "ek_123", "expires_at": 1}') == "ek_123"
    with pytest.raises(ValueError, match="no ek_ client secret"):
        mint.secret_from(b'{"value": "sk-oops"}')


def test_mint_key_wants_the_key_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """V3: without OPENAI_API_KEY the script sends nothing and says where the key goes;
    there is no command-line option for the key."""
    mint = _load("mint_key")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert mint.main([]) == 2
    assert capsys.readouterr().err == (
        "set OPENAI_API_KEY in the environment (not on the command line)\n"
    )
    with pytest.raises(SystemExit):
        mint.main(["--api-key", "sk-test"])


async def test_pipecat_agent_pipeline_runs_a_gated_call(gateway: Gateway) -> None:
    """V2, V3: the example's pipeline with its console approval: the model's delete is
    asked on the console, allowed, run by toolbus, and its result reaches the model."""
    agent = _load("pipecat_agent")
    prompts: list[str] = []

    def answer(prompt: str) -> str:
        prompts.append(prompt)
        return "y"

    async with toolbus.connect(gateway.url, token="alice-token", profile="voice") as bus:
        note = await bus.invoke("notes_create", {"title": "tea", "body": "buy tea"})
        assert isinstance(note, toolbus.Result)
        note_id = note.result["note_id"]
        llm = ScriptedLLM(
            [Calls((("call_del", "notes_delete", {"note_id": note_id}),)), Say("Deleted.")]
        )
        results = Probe(FunctionCallResultFrame)
        pipeline = agent.build_pipeline(
            bus, llm, Gate(llm), results, agent.console_approval(answer)
        )
        ask = [
            LLMMessagesAppendFrame(
                messages=[{"role": "user", "content": "Delete tea."}], run_llm=True
            )
        ]
        async with asyncio.timeout(WAIT * 2):
            await run_test(pipeline, frames_to_send=ask)
        left = await bus.invoke("notes_list", {})
    assert prompts == [f"Allow notes_delete {{'note_id': {note_id}}}? [y/a/N] "]
    assert [(f.tool_call_id, f.result) for f in results.seen] == [
        ("call_del", {"deleted": note_id})
    ]
    assert llm.contexts[0][0] == {"role": "system", "content": agent.INSTRUCTIONS}
    assert llm.extra == 0
    assert isinstance(left, toolbus.Result)
    assert left.result["total"] == 0
