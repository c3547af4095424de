"""Structured logging (SPEC O3): JSON lines on stderr, the audit stream in its own file.

Loggers are named by module (``gateway.session``); the audit logger is
``toolbus.audit`` and does not propagate, so audit records never mix with the
operational log. Nothing here ever formats a credential: callers log ids and kinds.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import queue
import sys
import threading
from pathlib import Path
from typing import Any

from protocol.codec import encode_json

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (Unix seconds), ``level``, ``logger``, ``msg``,
    extra fields, and ``exc`` with the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        audit = getattr(record, "audit", None)
        if isinstance(audit, dict):
            payload = {"ts": payload["ts"], **audit}
        else:
            for key, value in vars(record).items():
                if key not in _STANDARD and not key.startswith("_"):
                    payload[key] = value
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return encode_json(payload).decode()


class BatchHandler(logging.Handler):
    """Hands records to the :class:`AuditWriter` thread in batches (SPEC I11).

    On a thread running an event loop a record joins the current batch, which a loop
    timer hands over :attr:`DELAY` seconds after its first record (at once when it
    holds :attr:`MAX_BATCH`): one queue put and one wake-up of the writer per batch
    instead of per call, so the writer and the loop trade the GIL once per batch. As
    with the queue before, records not yet written are lost if the process is killed
    (at most :attr:`DELAY` more). From a thread without a loop a record goes at once.

    Args:
        records: the writer's queue: lists of records, ``None`` to stop it.
    """

    DELAY = 0.02
    """Seconds a batch gathers records on the loop before the writer gets it: a
    sequential caller's calls then share one hand-over instead of one each."""
    MAX_BATCH = 1024
    """Records that make a batch go at once, whatever its age."""

    def __init__(self, records: queue.SimpleQueue[list[logging.LogRecord] | None]) -> None:
        super().__init__()
        self._records = records
        self._batch: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._records.put([record])
            return
        batch = self._batch
        batch.append(record)  # under the handler's lock (Handler.handle)
        if len(batch) == 1:
            loop.call_later(self.DELAY, self.hand_over)
        elif len(batch) >= self.MAX_BATCH:
            self.hand_over()

    def hand_over(self) -> None:
        """Give the batch gathered so far to the writer (also before it stops)."""
        with self.lock or contextlib.nullcontext():
            batch, self._batch = self._batch, []
        if batch:
            self._records.put(batch)


class AuditWriter:
    """The thread that formats and appends audit records to their file (SPEC I11, O3).

    Args:
        path: the audit file, opened for appending.
        records: the queue :class:`BatchHandler` feeds; each batch is written with
            one write and one flush.
        handler: that handler, whose last batch :meth:`close` hands over first.
    """

    def __init__(
        self,
        path: Path,
        records: queue.SimpleQueue[list[logging.LogRecord] | None],
        handler: BatchHandler,
    ) -> None:
        self._file = logging.FileHandler(path, encoding="utf-8")
        self._file.setFormatter(JsonFormatter())
        self._records = records
        self._handler = handler
        self._thread = threading.Thread(target=self._run, name="toolbus-audit", daemon=True)
        self._thread.start()
        self._open = True

    def _run(self) -> None:
        file = self._file
        while (batch := self._records.get()) is not None:
            lines = []
            for record in batch:
                try:
                    lines.append(file.format(record) + "\n")
                except Exception:  # a record that cannot be formatted, as logging does
                    file.handleError(record)
            try:
                with file.lock or contextlib.nullcontext():
                    stream = file.stream
                    assert stream is not None  # opened at construction (delay=False)
                    stream.write("".join(lines))
                    stream.flush()
            except Exception:
                file.handleError(batch[-1])

    def close(self) -> None:
        """Write what is queued, stop the thread, close the file. Idempotent."""
        if self._open:
            self._open = False
            self._handler.hand_over()
            self._records.put(None)
            self._thread.join()
            self._file.close()


def setup(level: str, json_logs: bool, audit_file: Path | None) -> AuditWriter | None:
    """Configure the root logger and the audit stream (SPEC O3).

    Args:
        level: a logging level name for operational logs.
        json_logs: JSON lines when true, plain text otherwise.
        audit_file: append audit records here as JSON lines; ``None`` sends them to
            stderr with the rest.

    Returns:
        The audit writer (closed at exit; ``close()`` flushes it), or ``None`` without
        an audit file.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if json_logs
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    audit = logging.getLogger("toolbus.audit")
    audit.setLevel(logging.INFO)
    if audit_file is not None:
        audit_file.parent.mkdir(parents=True, exist_ok=True)
        # The invoke path only adds the record to a batch; a writer thread formats and
        # writes each batch, so file I/O never runs on the event loop (SPEC I11 on the
        # hot path), and the two threads meet once per batch, not once per call.
        records: queue.SimpleQueue[list[logging.LogRecord] | None] = queue.SimpleQueue()
        batches = BatchHandler(records)
        writer = AuditWriter(audit_file, records, batches)
        atexit.register(writer.close)
        audit.handlers[:] = [batches]
        audit.propagate = False
        return writer
    return None
