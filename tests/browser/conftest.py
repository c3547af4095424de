"""Fixtures of the browser tests (SPEC K2): a real server and a headless system Chromium.

Chromium comes from the system (``/usr/bin/chromium``, see ``scripts/ensure-chromium``);
Playwright never downloads a browser here. Server and Playwright share the test's event
loop.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, ConsoleMessage, Page, async_playwright

from gateway.server import Gateway
from tests.support import running, settings_for

CHROMIUM = Path(os.environ.get("TOOLBUS_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "browser"
TIMEOUT_MS = 10_000
"""Playwright's default wait for any expectation or action."""


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    """A real toolbus server on 127.0.0.1 (demo catalog, test tokens, data in tmp_path)."""
    async with running(settings_for(tmp_path)) as gw:
        yield gw


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """Headless system Chromium. Missing Chromium fails the test (it is not skipped)."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"{CHROMIUM} is missing: run scripts/ensure-chromium (as root) to install it",
            pytrace=False,
        )
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    """A fresh page; browser console errors and uncaught exceptions fail the test."""
    context = await browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(TIMEOUT_MS)
    page = await context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"uncaught: {exc}"))

    def on_console(msg: ConsoleMessage) -> None:
        # A refused reconnect attempt (server down during a drain) is expected noise.
        if msg.type == "error" and "WebSocket connection to" not in msg.text:
            problems.append(f"console.{msg.type}: {msg.text}")

    page.on("console", on_console)
    try:
        yield page
    finally:
        await context.close()
    assert not problems, problems
