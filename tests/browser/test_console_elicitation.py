"""Elicitation in the demo console, in a real headless Chromium (SPEC M3, K2).

A real server mounts real MCP servers that ask their user during a call:
``tests/mcp/elicit_server.py`` (the SDK's MCPServer, stdio) and the MCP project's
reference server "everything" (``trigger-elicitation-request``, the richest form the
MCP spec allows). The console shows each question as a form built from the requested
schema and sends the typed answer; the MCP server's result says what it got.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Locator, Page, expect

from gateway.server import Gateway
from tests.browser.conftest import ARTIFACTS
from tests.mcp.support import asker_mount, everything_entry, mcp_settings
from tests.support import running

pytestmark = pytest.mark.browser

QUESTION = "Who is asking, and how should we reply?"


@pytest.fixture
async def asker(tmp_path: Path) -> AsyncIterator[Gateway]:
    """A real server whose ``demo`` profile has ``asker_ask`` (tests/mcp/elicit_server.py)."""
    async with running(mcp_settings(tmp_path, [asker_mount()])) as gw:
        yield gw


async def _connect_and_pick(page: Page, gateway: Gateway, tool: str) -> None:
    await page.goto(f"http://127.0.0.1:{gateway.port}/")
    await page.get_by_test_id("token-input").fill("alice-token")
    await page.get_by_test_id("profile-input").fill("demo")
    await page.get_by_test_id("connect-button").click()
    await expect(page.get_by_test_id("conn-state")).to_have_text("open")
    await page.get_by_test_id(f"tool-{tool}").click()  # waits for the pushed catalog (M2)


async def _ask(page: Page, topic: str) -> Locator:
    """Invoke ``asker_ask`` from the generated form; the question's card."""
    await page.get_by_test_id("field-topic").fill(topic)
    await page.get_by_test_id("invoke-button").click()
    card = page.get_by_test_id("elicitation-card")
    await expect(card).to_have_count(1)
    await expect(card.get_by_test_id("elicitation-message")).to_have_text(f"{QUESTION} ({topic})")
    return card


async def _result_text(page: Page, tool: str) -> str:
    await expect(page.get_by_test_id("last-result-tool")).to_have_text(tool)
    await expect(page.get_by_test_id("last-result-kind")).to_have_text("result")
    body = await page.get_by_test_id("last-result-json").text_content()
    assert body is not None
    text: str = json.loads(body)["text"]
    return text


async def test_m3_elicitation_browser_form_accept_decline_cancel(
    asker: Gateway, page: Page
) -> None:
    """SPEC M3, K2: the question is a card with a form built from the requested schema
    (text, email, integer and number with their bounds, checkbox, enum select, required
    marks, defaults filled); a value out of bounds is refused in the page and nothing is
    sent; **Send** answers accept with typed content; **Decline** and **Cancel** answer
    those actions. Each card leaves once answered."""
    await _connect_and_pick(page, asker, "asker_ask")
    card = await _ask(page, "lunch")
    await expect(page.get_by_test_id("elicitation-count")).to_have_text("1")
    await expect(card.get_by_test_id("elicitation-tool")).to_have_text("asker_ask")
    await expect(card.get_by_test_id("elicitation-expiry")).to_contain_text("expires in")
    for name in ("name", "email", "age"):
        await expect(card.get_by_test_id(f"elicit-required-{name}")).to_be_visible()
    await expect(card.get_by_test_id("elicit-required-score")).to_have_count(0)
    field = card.get_by_test_id
    await expect(field("elicit-field-email")).to_have_attribute("type", "email")
    await expect(field("elicit-field-age")).to_have_attribute("type", "number")
    await expect(field("elicit-field-age")).to_have_attribute("max", "150")
    await expect(field("elicit-field-score")).to_have_value("0.5")  # the schema's default
    await expect(field("elicit-field-subscribe")).not_to_be_checked()
    await expect(field("elicit-field-color").locator("option:checked")).to_have_text("green")

    await field("elicit-field-name").fill("Ada")
    await field("elicit-field-email").fill("ada@example.org")
    await field("elicit-field-age").fill("200")
    await field("elicitation-accept").click()
    await expect(field("elicitation-note")).to_have_text("Age: at most 150")
    await expect(card).to_have_count(1)  # nothing sent: the form is still open
    await field("elicit-field-age").fill("36")
    await field("elicit-field-score").fill("0.75")
    await field("elicit-field-subscribe").check()
    await field("elicit-field-color").select_option(label="blue")
    await field("elicitation-accept").click()
    await expect(card).to_have_count(0)
    await expect(page.get_by_test_id("elicitation-count")).to_have_text("0")
    got = await _result_text(page, "asker_ask")
    assert got == (
        'accept {"age": 36, "color": "blue", "email": "ada@example.org", "name": "Ada", '
        '"score": 0.75, "subscribe": true}'
    )
    answers = page.locator('[data-testid="log-entry"][data-kind="elicit.answer"]')
    await expect(answers.first).to_contain_text("asker_ask: accept")

    card = await _ask(page, "dinner")
    await card.get_by_test_id("elicitation-decline").click()
    await expect(card).to_have_count(0)
    assert await _result_text_after(page, "decline") == "decline"

    card = await _ask(page, "tea")
    await card.get_by_test_id("elicitation-cancel").click()
    await expect(card).to_have_count(0)
    assert await _result_text_after(page, "cancel") == "cancel"


async def _result_text_after(page: Page, text: str) -> str:
    """The last result's text once it is ``text`` (the previous call's result is shown
    until the new one arrives)."""
    await expect(page.get_by_test_id("last-result-json")).to_contain_text(f'"text": "{text}"')
    return await _result_text(page, "asker_ask")


async def test_m3_elicitation_browser_everything_server(tmp_path: Path, page: Page) -> None:
    """SPEC M3, K2: the reference server's ``trigger-elicitation-request`` form (string
    formats, integer and number ranges, untitled, titled and legacy enums, multi-select
    arrays) is rendered and answered from the console; the server echoes the typed
    content it received."""
    mount = {
        "name": "ev",
        "command": "node",
        "args": [str(everything_entry()), "stdio"],
        "include": ["trigger-elicitation-request"],
    }
    async with running(mcp_settings(tmp_path, [mount])) as gateway:
        await _connect_and_pick(page, gateway, "ev_trigger-elicitation-request")
        await page.get_by_test_id("invoke-button").click()
        card = page.get_by_test_id("elicitation-card")
        await expect(card.get_by_test_id("elicitation-message")).to_have_text(
            "Please provide inputs for the following fields:"
        )
        field = card.get_by_test_id
        await expect(field("elicit-required-name")).to_be_visible()
        await expect(field("elicit-field-birthdate")).to_have_attribute("type", "date")
        await expect(field("elicit-field-homepage")).to_have_attribute("type", "url")
        await expect(field("elicit-field-integer")).to_have_value("42")
        await expect(
            field("elicit-field-untitledMultipleSelectEnum").get_by_label("Guitar")
        ).to_be_checked()
        await field("elicit-field-name").fill("Ada Lovelace")
        await field("elicit-field-check").check()
        await field("elicit-field-email").fill("ada@example.org")
        await field("elicit-field-birthdate").fill("1815-12-10")
        await field("elicit-field-integer").fill("7")
        await field("elicit-field-titledSingleSelectEnum").select_option(label="Wonder Woman")
        await field("elicit-field-legacyTitledEnum").select_option(label="Birds")
        await field("elicit-field-untitledMultipleSelectEnum").get_by_label("Piano").check()
        await field("elicit-field-titledMultipleSelectEnum").get_by_label("Trout").check()
        await card.screenshot(path=str(_artifact("console-elicitation.png")))
        await field("elicitation-accept").click()
        await expect(card).to_have_count(0)
        await expect(page.get_by_test_id("last-result-kind")).to_have_text("result")
        body = await page.get_by_test_id("last-result-json").text_content()
        assert body is not None
        text = json.loads(body)["text"]
        assert text.startswith("✅ User provided the requested information!")
        raw = json.loads(text.split("Raw result: ", 1)[1])
    expected: dict[str, Any] = {
        "name": "Ada Lovelace",
        "check": True,
        "firstLine": "It was a dark and stormy night.",
        "email": "ada@example.org",
        "birthdate": "1815-12-10",
        "integer": 7,
        "number": 3.14,
        "untitledSingleSelectEnum": "Monica",
        "untitledMultipleSelectEnum": ["Guitar", "Piano"],
        "titledSingleSelectEnum": "hero-3",
        "titledMultipleSelectEnum": ["fish-1", "fish-3"],
        "legacyTitledEnum": "pet-3",
    }
    assert raw == {"action": "accept", "content": expected}


def _artifact(name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / name


async def test_m3_elicitation_browser_unanswered_question_leaves_with_its_call(
    tmp_path: Path, page: Page
) -> None:
    """SPEC M3, K2: a question nobody answers before ``expires_at``
    (``calls.approval_timeout``) is answered ``cancel`` by the server; the call ends
    and its card leaves the console."""
    settings = mcp_settings(tmp_path, [asker_mount()], calls={"approval_timeout": 2.0})
    async with running(settings) as gateway:
        await _connect_and_pick(page, gateway, "asker_ask")
        card = await _ask(page, "later")
        await expect(card).to_have_count(0)
        assert await _result_text_after(page, "cancel") == "cancel"
        await expect(page.get_by_test_id("elicitation-count")).to_have_text("0")
