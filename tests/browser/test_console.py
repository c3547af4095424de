"""The demo console and the browser client module in a real headless Chromium (SPEC K2).

Each test starts a real server (tests/support.running) on the test's event loop, loads
the console from it and drives it through Playwright's auto-waiting expectations.
Covers: S1/S2 (subprotocol, token in hello), C3 (catalog), I8 (sync result), A2-A6
(approval card, allow, tool.resolved), A1/A3 (confirm_tool_calls, "always allow"
grants listed and revoked), I9/J2/J4 (dispatched, progress, job.done),
D1-D3 (seq dedup, ack, resume after a dropped socket), S4 (drain: reconnect + 1012).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, expect

from gateway.server import Gateway
from tests.browser.conftest import ARTIFACTS
from tests.support import running, settings_for

pytestmark = pytest.mark.browser


async def _connect(
    page: Page, gateway: Gateway, profile: str = "demo", *, confirm_tool_calls: bool = False
) -> None:
    await page.goto(f"http://127.0.0.1:{gateway.port}/")
    await expect(page.get_by_test_id("conn-state")).to_have_text("closed")
    await page.get_by_test_id("token-input").fill("alice-token")
    await page.get_by_test_id("profile-input").fill(profile)
    await page.get_by_test_id("confirm-calls-input").set_checked(confirm_tool_calls)
    await page.get_by_test_id("connect-button").click()
    await expect(page.get_by_test_id("conn-state")).to_have_text("open")


async def _last_result(page: Page, tool: str, kind: str) -> dict[str, Any]:
    await expect(page.get_by_test_id("last-result-tool")).to_have_text(tool)
    await expect(page.get_by_test_id("last-result-kind")).to_have_text(kind)
    text = await page.get_by_test_id("last-result-json").text_content()
    assert text is not None
    parsed: dict[str, Any] = json.loads(text)
    return parsed


async def test_console_catalog_invoke_approval_and_job(gateway: Gateway, page: Page) -> None:
    """The whole console flow: connect, catalog, sync call, approval card, async job."""
    await _connect(page, gateway)
    await expect(page.get_by_test_id("session-info")).to_contain_text("alice@demo")

    # C3: the demo profile's catalog, rendered as a list.
    catalog = page.get_by_test_id("catalog-list")
    for name in ("convert_units", "notes_create", "notes_delete", "report", "show_map"):
        await expect(catalog.get_by_test_id(f"tool-{name}")).to_be_visible()
    await expect(catalog.get_by_test_id("tool-project_summary")).to_have_count(
        0
    )  # needs project_id

    # I8: a sync tool through the form generated from its JSON Schema.
    await page.get_by_test_id("tool-convert_units").click()
    await expect(page.get_by_test_id("invoke-tool")).to_have_text("convert_units")
    for name in ("value", "from_unit", "to_unit"):
        await expect(page.get_by_test_id(f"required-{name}")).to_be_visible()
    await expect(page.get_by_test_id("field-value")).to_have_attribute("type", "number")
    await page.get_by_test_id("field-value").fill("1")
    await page.get_by_test_id("field-from_unit").select_option(label="mi")
    await page.get_by_test_id("field-to_unit").select_option(label="km")
    await page.get_by_test_id("invoke-button").click()
    result = await _last_result(page, "convert_units", "result")
    assert result["result"] == 1.609344
    assert result == {
        "value": 1,
        "from_unit": "mi",
        "to_unit": "km",
        "result": 1.609344,
        "dimension": "length",
    }

    # A note to delete: an optional array parameter gets a JSON field.
    await page.get_by_test_id("tool-notes_create").click()
    await page.get_by_test_id("field-title").fill("from the browser")
    await page.get_by_test_id("field-body").fill("delete me")
    await page.get_by_test_id("field-tags").fill('["browser"]')
    await page.get_by_test_id("invoke-button").click()
    note = await _last_result(page, "notes_create", "result")
    assert note["title"] == "from the browser"
    assert note["tags"] == ["browser"]
    note_id = note["note_id"]

    # A2-A6: notes_delete needs approval; the card shows tool, arguments and expiry.
    await page.get_by_test_id("tool-notes_delete").click()
    await page.get_by_test_id("field-note_id").fill(str(note_id))
    await page.get_by_test_id("invoke-button").click()
    card = page.get_by_test_id("approval-card")
    await expect(card).to_have_count(1)
    await expect(card.get_by_test_id("approval-tool")).to_have_text("notes_delete")
    await expect(card.get_by_test_id("approval-params")).to_contain_text(f'"note_id": {note_id}')
    await expect(card.get_by_test_id("approval-expiry")).to_have_text(
        re.compile(r"expires in (\d+h )?\d+m \d\ds")
    )
    await expect(page.get_by_test_id("approval-count")).to_have_text("1")
    await expect(page.get_by_test_id("last-result-tool")).to_have_text(
        "notes_create"
    )  # still waiting
    await card.get_by_test_id("approval-allow").click()
    await expect(card).to_have_count(0)  # removed when tool.resolved arrives
    await expect(page.get_by_test_id("approval-count")).to_have_text("0")
    deleted = await _last_result(page, "notes_delete", "result")
    assert deleted == {"deleted": note_id}
    resolved = page.locator('[data-testid="log-entry"][data-kind="tool.resolved"]')
    await expect(resolved).to_contain_text("notes_delete: allowed (user)")

    # I9, J2, J4: an async job: dispatched, progress, then the done summary.
    await page.get_by_test_id("tool-report").click()
    await page.get_by_test_id("field-topic").fill("browsers")
    await page.get_by_test_id("field-sections").fill("3")
    await page.get_by_test_id("invoke-button").click()
    dispatched = await _last_result(page, "report", "dispatched")
    job = page.locator(f'[data-testid="job-card"][data-job-id="{dispatched["job_id"]}"]')
    await expect(job.get_by_test_id("job-tool")).to_have_text("report")
    await expect(job.get_by_test_id("job-message")).to_have_text(
        re.compile(r"section \d")
    )  # a progress event
    await expect(job.get_by_test_id("job-status")).to_have_text("done")
    await expect(job.get_by_test_id("job-summary")).to_have_text(
        "Report on browsers with 3 section(s) is ready."
    )
    assert await job.get_by_test_id("job-progress").evaluate("p => p.value") == 1
    await expect(job.get_by_test_id("job-artifact")).to_contain_text("report-browsers.md")
    await expect(page.locator('[data-testid="log-entry"][data-kind="job.done"]')).to_have_count(1)

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / "console.png"), full_page=True)


async def test_console_deny_and_refused_login(gateway: Gateway, page: Page) -> None:
    """A5: a denied call completes as a declined result; S2: a bad token ends 'closed'."""
    await _connect(page, gateway)
    await page.get_by_test_id("tool-notes_delete").click()
    await page.get_by_test_id("field-note_id").fill("424242")
    await page.get_by_test_id("invoke-button").click()
    card = page.get_by_test_id("approval-card")
    await card.get_by_test_id("approval-deny").click()
    await expect(card).to_have_count(0)
    await _last_result(page, "notes_delete", "declined")

    await page.get_by_test_id("disconnect-button").click()
    await expect(page.get_by_test_id("conn-state")).to_have_text("closed")
    await page.get_by_test_id("token-input").fill("wrong-token")
    await page.get_by_test_id("connect-button").click()
    await expect(page.get_by_test_id("conn-state")).to_have_text("closed")
    await expect(
        page.locator('[data-testid="log-entry"][data-kind="error"]').first
    ).to_contain_text("connect failed")


async def test_console_confirm_every_call_and_grants(gateway: Gateway, page: Page) -> None:
    """A1: with confirm_tool_calls an ungated tool asks first; A3: "Always allow" makes a
    grant, listed in the Grants panel, and revoking it brings the approval card back."""
    await _connect(page, gateway, confirm_tool_calls=True)
    await expect(page.get_by_test_id("confirm-calls-input")).to_be_checked()
    await expect(page.get_by_test_id("confirm-calls-input")).to_be_disabled()  # a hello option
    grants = page.get_by_test_id("grants-list").get_by_test_id("grant-item")
    await expect(page.get_by_test_id("grants-empty")).to_be_visible()
    await expect(grants).to_have_count(0)
    await expect(page.get_by_test_id("grant-count")).to_have_text("0")

    card = page.get_by_test_id("approval-card")
    results = page.locator('[data-testid="log-entry"][data-kind="result"]')
    starts = page.locator('[data-testid="log-entry"][data-kind="tool_start"]')
    gated = starts.filter(has_text="(awaiting approval)")

    # clock_now is not gated in the demo profile; confirm_tool_calls gates it.
    await page.get_by_test_id("tool-clock_now").click()
    await page.get_by_test_id("field-timezone").fill("UTC")
    await page.get_by_test_id("invoke-button").click()
    await expect(card).to_have_count(1)
    await expect(card.get_by_test_id("approval-tool")).to_have_text("clock_now")
    await expect(card.get_by_test_id("approval-params")).to_contain_text('"timezone": "UTC"')
    await card.get_by_test_id("approval-always").click()
    await expect(card).to_have_count(0)
    await _last_result(page, "clock_now", "result")
    await expect(
        page.locator('[data-testid="log-entry"][data-kind="tool.resolved"]')
    ).to_contain_text("clock_now: allowed (user, always)")
    # The grant shows up in the panel.
    await expect(grants).to_have_count(1)
    await expect(grants.get_by_test_id("grant-tool")).to_have_text("clock_now")
    await expect(grants.first).to_have_attribute("data-tool", "clock_now")
    await expect(page.get_by_test_id("grant-count")).to_have_text("1")
    await expect(page.get_by_test_id("grants-empty")).to_be_hidden()

    # Granted: the next call runs without a card (its tool_start has no approval_id).
    await page.get_by_test_id("invoke-button").click()
    await expect(results).to_have_count(2)
    await expect(starts).to_have_count(2)
    await expect(gated).to_have_count(1)
    await expect(card).to_have_count(0)
    await expect(page.get_by_test_id("approval-count")).to_have_text("0")

    # Revoke: the panel is empty again and the next call asks again.
    await grants.get_by_test_id("grant-revoke").click()
    await expect(grants).to_have_count(0)
    await expect(page.get_by_test_id("grants-empty")).to_be_visible()
    await expect(page.get_by_test_id("grant-count")).to_have_text("0")
    await expect(
        page.locator('[data-testid="log-entry"][data-kind="grants.revoke"]')
    ).to_contain_text("clock_now: revoked")
    await page.get_by_test_id("invoke-button").click()
    await expect(card).to_have_count(1)
    await expect(card.get_by_test_id("approval-tool")).to_have_text("clock_now")
    await expect(gated).to_have_count(2)
    await card.get_by_test_id("approval-allow").click()  # a plain allow makes no grant
    await expect(card).to_have_count(0)
    await expect(results).to_have_count(3)
    assert await page.evaluate("() => window.toolbusConsole.client.grants()") == []
    assert await page.evaluate("() => window.toolbusConsole.client.confirmToolCalls") is True


# A scripted check of the module alone: drop the socket while a job runs, let the job
# finish while the session is parked, resume, and count what the page saw.
RESUME_SCRIPT = (Path(__file__).parent / "resume_check.js").read_text()


async def test_module_resume_delivers_job_done_once(gateway: Gateway, page: Page) -> None:
    """D1-D3, K2: after a dropped socket the client resumes and sees job.done exactly once."""
    await page.goto(f"http://127.0.0.1:{gateway.port}/")
    out = await page.evaluate(RESUME_SCRIPT, {"url": gateway.url})

    assert out["first"]["resumed"] is False
    assert out["dispatched"]["type"] == "dispatched"
    assert out["dispatched"]["tool"] == "report"
    job_id = out["dispatched"]["job_id"]
    # Resume, twice, on the same session; no new session was created.
    assert [w["resumed"] for w in out["welcomes"]] == [False, True, True]
    assert {w["session_id"] for w in out["welcomes"]} == {out["sessionId"]}
    assert out["states"] == [
        "connecting",
        "open",
        "reconnecting",
        "open",
        "reconnecting",
        "open",
        "closed",
    ]
    # job.done arrived by replay, exactly once, even when its frame came again.
    assert out["rawDoneBeforeInjection"] == 1  # the server replayed it once
    assert out["rawDone"] == 2  # plus the injected duplicate frame...
    assert len(out["done"]) == 1  # ...which the client dropped by seq
    assert out["done"][0]["job_id"] == job_id
    assert out["done"][0]["summary"] == "Report on resume with 1 section(s) is ready."
    assert out["done"][0]["seq"] > out["seqBeforeDrop"]
    # Seqs seen are gap-free and each arrived once (D1, D3).
    # job.done was in the log before the resume: it came by replay, not live.
    assert out["welcomes"][1]["last_seq"] >= out["done"][0]["seq"]
    assert out["seqsBeforeInjection"] == list(range(1, out["afterResume"] + 1))
    # After the second resume: nothing replayed, only the queued call's tool_start + result.
    assert out["seqsAfterSecondResume"] == [out["afterResume"] + 1, out["afterResume"] + 2]
    assert out["queuedReply"]["type"] == "result"
    assert out["queuedReply"]["result"]["result"] == 212
    assert out["lastSeq"] == out["afterResume"] + 2
    # Credentials only in hello.token; resume hellos carry the session and the last seq.
    hellos = [m for m in out["sent"] if m["type"] == "hello"]
    assert [h["token"] for h in hellos] == ["alice-token"] * 3
    assert "session_id" not in hellos[0]
    assert hellos[1]["session_id"] == out["sessionId"]
    assert hellos[1]["last_seq"] == out["seqBeforeDrop"]
    assert hellos[2]["last_seq"] == out["afterResume"]
    assert "token" not in gateway.url
    # Cumulative acks, increasing, ending at the last seq.
    acks = [m["seq"] for m in out["sent"] if m["type"] == "ack"]
    assert acks
    assert acks == sorted(acks)
    assert acks[-1] == out["lastSeq"]
    # The last message is bye (close() ends the session for good).
    assert out["sent"][-1]["type"] == "bye"
    assert [j["state"] for j in out["jobs"] if j["job_id"] == job_id] == ["done"]
    assert out["finalState"] == "closed"


DRAIN_SCRIPT = (Path(__file__).parent / "drain_check.js").read_text()
DRAIN_RESUME_SCRIPT = (Path(__file__).parent / "drain_resume.js").read_text()


async def test_module_resumes_after_drain(tmp_path: Path, page: Page) -> None:
    """S4 + D3: a `reconnect` hint and a 1012 close; the client resumes on the restarted
    server (same port, same SQLite store) and can call tools again."""
    settings = settings_for(tmp_path)
    async with running(settings) as first:
        port = first.port
        await page.goto(f"http://127.0.0.1:{port}/")
        before = await page.evaluate(DRAIN_SCRIPT, {"url": first.url})
        assert before["reply"]["result"]["result"] == 273.15
    # `first` is drained now; the page keeps trying. Restart on the same port.
    async with running(settings_for(tmp_path, server={"port": port})) as second:
        assert second.port == port
        after = await page.evaluate(DRAIN_RESUME_SCRIPT)
    assert after["seen"]["hints"]
    assert after["seen"]["hints"][0]["type"] == "reconnect"
    assert after["seen"]["closes"][0]["code"] == 1012
    assert after["seen"]["closes"][0]["willReconnect"] is True
    assert after["seen"]["welcomes"][-1] == {"resumed": True, "session_id": before["sessionId"]}
    assert after["sessionId"] == before["sessionId"]
    assert after["reply"]["result"]["result"] == 1000
    assert after["reply"]["seq"] > before["lastSeq"]


RESYNC_SCRIPT = (Path(__file__).parent / "resync_check.js").read_text()


async def test_module_resyncs_when_session_expired(tmp_path: Path, page: Page) -> None:
    """D3: past the resume window the client gets a new session, starts again at seq 1
    (the new session's catalog is not dropped as a duplicate) and emits `resync`."""
    async with running(settings_for(tmp_path, sessions={"resume_window": 0.2})) as gw:
        await page.goto(f"http://127.0.0.1:{gw.port}/")
        out = await page.evaluate(RESYNC_SCRIPT, {"url": gw.url})
    welcomes = out["seen"]["welcomes"]
    assert [w["resumed"] for w in welcomes] == [False, False]
    assert welcomes[0]["session_id"] != welcomes[1]["session_id"]
    assert out["seen"]["resyncs"] == [
        {"previousSessionId": welcomes[0]["session_id"], "sessionId": welcomes[1]["session_id"]}
    ]
    assert out["seen"]["catalogs"] == [1, 1]
    assert out["reply"]["result"]["result"] == 2000
    assert out["lastSeq"] == 3
