"""One session's bad value never poisons another's commit (SPEC D6; case F21, the other
user's part).

Values are encoded and checked when they are staged, so a commit writes only what is
known to bind: the store refuses a bad value to its one caller (``BadValue``) and the
events and rows of every other session in the same commit are written and sent.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway.context import ToolContext
from gateway.store import BadValue, JobRow, SqliteStore
from tests.gateway.store_faults import checked_peer, stored_in
from tests.support import WAIT, running, settings_for

TOOLS = """
tools:
  - name: bad_job
    description: A job whose result holds an integer wider than 64 bits.
    capability: jobs
    mode: async
    handler: tests.gateway.test_store_poison:bad_job
  - name: good_job
    description: A job with a plain result.
    capability: jobs
    mode: async
    handler: tests.gateway.test_store_poison:good_job
"""
PROFILES = """
profiles:
  demo:
    capabilities: [jobs]
"""

GATE: dict[str, asyncio.Event] = {}
"""Both handlers wait on the same event, so they finish in the same loop turn."""


async def bad_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    await GATE["go"].wait()
    return {"summary": "x", "n": 2**70}


async def good_job(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    await GATE["go"].wait()
    return {"summary": "fine", "n": 1}


async def test_case_f21_other_users_job_done_is_stored_and_sent(tmp_path: Path) -> None:
    """SPEC D6, I16, case F21: alice's job returns ``2**70`` while bob's job finishes in
    the same instant. Alice's ends in one ``job.failed``; bob's ``job.done`` is committed
    (checked the moment it arrives) and delivered: it did not share alice's fate."""
    (tmp_path / "tools.yaml").write_text(TOOLS)
    (tmp_path / "profiles.yaml").write_text(PROFILES)
    catalog = {"tools": [tmp_path / "tools.yaml"], "profiles": [tmp_path / "profiles.yaml"]}
    settings = settings_for(tmp_path, catalog={**catalog, "hot_reload": False})
    GATE["go"] = asyncio.Event()
    async with running(settings) as gw:
        stored = stored_in(settings.data_dir / "toolbus.db")
        async with (
            checked_peer(gw, stored) as alice,
            checked_peer(gw, stored, token="bob-token") as bob,
        ):
            await alice.invoke("a", "bad_job", {})
            await bob.invoke("b", "good_job", {})
            await alice.expect("dispatched", call_id="a")
            await bob.expect("dispatched", call_id="b")
            GATE["go"].set()
            async with asyncio.timeout(WAIT):
                failed = await alice.expect("job.failed", call_id="a")
                done = await bob.expect("job.done", call_id="b")
            assert failed["error"]["code"] == "handler_error"
            assert "wider than 64 bits" in failed["error"]["message"]
            assert (done["summary"], done["result"]) == ("fine", {"n": 1})
            row = gw.store.job(done["job_id"])
            assert row is not None
            assert row.state == "done"


def _job(job_id: str, result: dict[str, Any] | None, summary: str = "s") -> JobRow:
    return JobRow(
        job_id,
        "t",
        "done",
        "s1",
        "u",
        None,
        "p",
        None,
        {},
        {},
        1.0,
        1.0,
        2.0,
        summary,
        [],
        result,
        None,
    )


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            _job("j_bad", {"n": 2**70}),
            "value cannot be stored as JSON: Integer exceeds 64-bit range",
        ),
        (_job("j_bad", {}, summary="\ud800"), "job j_bad: text is not valid Unicode"),
    ],
)
def test_bad_value_is_refused_at_staging_and_others_commit(
    tmp_path: Path, row: JobRow, message: str
) -> None:
    """SPEC D6: a value that cannot be stored raises ``BadValue`` when staged and
    stages nothing; another session's event and job in the same batch commit."""
    store = SqliteStore(tmp_path / "db.sqlite", checkpoint_interval=3600)
    try:
        store.stage_event("s2", 1, b'{"type":"catalog","seq":1}')
        with pytest.raises(BadValue) as raised:
            store.stage_job(row)
        assert str(raised.value).startswith(message)
        store.stage_job(_job("j_good", {"n": 1}))
        store.commit()
        assert store.events_after("s2", 0) == [(1, b'{"type":"catalog","seq":1}')]
        assert store.job("j_bad") is None
        good = store.job("j_good")
        assert good is not None
        assert good.result == {"n": 1}
    finally:
        store.close()
