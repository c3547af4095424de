"""Structured logs and the audit stream (SPEC O3, I11)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway import audit, logs
from tests.support import WAIT


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """setup() reconfigures process-wide loggers; put them back afterwards."""
    root, audit_logger = logging.getLogger(), logging.getLogger("toolbus.audit")
    saved = (root.handlers[:], root.level, audit_logger.handlers[:], audit_logger.propagate)
    yield
    root.handlers[:], _, audit_logger.handlers[:], audit_logger.propagate = saved
    root.setLevel(saved[1])


def test_json_formatter_fields_and_traceback() -> None:
    """SPEC O3: one JSON object per record with ts, level, logger, msg, extras, exc."""
    formatter = logs.JsonFormatter()
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("gateway.x").makeRecord(
            "gateway.x", logging.ERROR, __file__, 1, "failed %s", ("here",), exc_info=sys.exc_info()
        )
    record.session = "s_1"
    line = json.loads(formatter.format(record))
    assert (line["level"], line["logger"], line["msg"], line["session"]) == (
        "ERROR",
        "gateway.x",
        "failed here",
        "s_1",
    )
    assert "ValueError: boom" in line["exc"]


@pytest.mark.usefixtures("restore_logging")
def test_audit_records_go_to_their_own_file(tmp_path: Path) -> None:
    """SPEC I11/O3: audit records land in the audit file as JSON lines, not on stderr."""
    path = tmp_path / "audit" / "audit.jsonl"
    writer = logs.setup("INFO", True, path)
    assert writer is not None
    audit.record(tool="t", outcome="ok", params=audit.redact({"pw": "x", "a": 1}, ["pw"], 100))
    writer.close()
    [line] = path.read_text().splitlines()
    record = json.loads(line)
    assert record["tool"] == "t"
    assert record["outcome"] == "ok"
    assert record["params"] == {"pw": "***", "a": 1}
    assert logging.getLogger("toolbus.audit").propagate is False


@pytest.mark.usefixtures("restore_logging")
def test_plain_text_logs_without_audit_file() -> None:
    """SPEC O4: json_logs false gives plain text; without a file the audit stream is stderr."""
    assert logs.setup("WARNING", False, None) is None
    assert logging.getLogger().level == logging.WARNING
    assert not isinstance(logging.getLogger().handlers[0].formatter, logs.JsonFormatter)


@pytest.mark.usefixtures("restore_logging")
async def test_i11_audit_records_of_one_loop_turn_reach_the_file_in_order(
    tmp_path: Path,
) -> None:
    """SPEC I11: records written on the event loop go to the writer thread in batches;
    every record lands, in order: a batch handed over by its timer, and one still
    being gathered when the writer closes."""
    path = tmp_path / "audit.jsonl"
    writer = logs.setup("INFO", True, path)
    assert writer is not None
    for i in range(3):
        audit.record(tool="t", outcome=f"a{i}")
    async with asyncio.timeout(WAIT):  # the batch's timer hands it over; the writer writes
        while len(path.read_text().splitlines()) < 3:  # noqa: ASYNC110 - a file, no event
            await asyncio.sleep(logs.BatchHandler.DELAY)
    for i in range(3):
        audit.record(tool="t", outcome=f"b{i}")
    writer.close()  # within the turn: close hands the gathered batch over first
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["outcome"] for line in lines] == ["a0", "a1", "a2", "b0", "b1", "b2"]
