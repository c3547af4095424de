"""Structured logs and the audit stream (SPEC O3, I11)."""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import sys
import threading
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
    audit.write(dict(tool="t", outcome="ok", params=audit.redact({"pw": "x", "a": 1}, ["pw"], 100)))
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
        audit.write(dict(tool="t", outcome=f"a{i}"))
    async with asyncio.timeout(WAIT):  # the batch's timer hands it over; the writer writes
        while len(path.read_text().splitlines()) < 3:  # noqa: ASYNC110 - a file, no event
            await asyncio.sleep(logs.BatchHandler.DELAY)
    for i in range(3):
        audit.write(dict(tool="t", outcome=f"b{i}"))
    writer.close()  # within the turn: close hands the gathered batch over first
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["outcome"] for line in lines] == ["a0", "a1", "a2", "b0", "b1", "b2"]


@pytest.mark.usefixtures("restore_logging")
def test_i11_direct_and_logging_paths_write_the_same_line(tmp_path: Path) -> None:
    """SPEC I11: a record written through ``audit.write`` (no LogRecord, the hot path)
    and one that came through the ``toolbus.audit`` logger give lines of one shape:
    ``ts`` first, then the fields."""
    path = tmp_path / "audit.jsonl"
    writer = logs.setup("INFO", True, path)
    assert writer is not None
    audit.write(dict(tool="t", outcome="ok", params={"a": 1}))
    logging.getLogger("toolbus.audit").info(
        "audit", extra={"audit": {"tool": "t", "outcome": "ok", "params": {"a": 1}}}
    )
    writer.close()
    direct, logged = [json.loads(line) for line in path.read_text().splitlines()]
    assert list(direct) == list(logged) == ["ts", "tool", "outcome", "params"]
    assert {k: v for k, v in direct.items() if k != "ts"} == {
        k: v for k, v in logged.items() if k != "ts"
    }
    assert isinstance(direct["ts"], float)
    assert abs(direct["ts"] - logged["ts"]) < 5


@pytest.mark.usefixtures("restore_logging")
def test_i11_a_handler_added_to_the_audit_logger_gets_every_record(tmp_path: Path) -> None:
    """SPEC I11: the direct path is taken only while the audit file's handler is the
    logger's one handler; a handler someone adds gets each record, and so does the file."""
    path = tmp_path / "audit.jsonl"
    writer = logs.setup("INFO", True, path)
    assert writer is not None
    seen: list[dict[str, object]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.audit)  # type: ignore[attr-defined]

    extra = Collect()
    logging.getLogger("toolbus.audit").addHandler(extra)
    audit.write(dict(tool="t", outcome="ok"))
    logging.getLogger("toolbus.audit").removeHandler(extra)
    audit.write(dict(tool="t", outcome="error"))
    writer.close()
    assert seen == [{"tool": "t", "outcome": "ok"}]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["outcome"] for line in lines] == ["ok", "error"]


@pytest.mark.usefixtures("restore_logging")
def test_i11_audit_records_from_a_thread_without_a_loop_are_written(tmp_path: Path) -> None:
    """SPEC I11: a record made on a thread that runs no event loop (a plain-def handler's
    thread, a hook) is handed to the writer at once, not left in a loop's batch."""
    path = tmp_path / "audit.jsonl"
    writer = logs.setup("INFO", True, path)
    assert writer is not None
    thread = threading.Thread(target=lambda: audit.write(dict(tool="t", outcome="from-thread")))
    thread.start()
    thread.join()
    writer.close()
    [line] = path.read_text().splitlines()
    assert json.loads(line)["outcome"] == "from-thread"


def test_i11_a_failed_audit_write_is_reported_once_and_the_writer_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SPEC I11, D6: a full disk (``/dev/full``: every write fails with ENOSPC) fails
    each batch; the writer says so once on the operational log and keeps running, so
    closing it still returns."""
    lines: queue.SimpleQueue[list[bytes] | None] = queue.SimpleQueue()
    handler = logs.BatchHandler(lines)
    with caplog.at_level(logging.ERROR, logger="gateway.logs"):
        writer = logs.AuditWriter(Path("/dev/full"), lines, handler)
        lines.put([b'{"ts":1}\n'])
        lines.put([b'{"ts":2}\n'])
        writer.close()
    failures = [r for r in caplog.records if "writing audit records failed" in r.getMessage()]
    assert len(failures) == 1
    assert "No space left on device" in failures[0].getMessage()
