"""Structured logging (SPEC O3): JSON lines on stderr, the audit stream in its own file.

Loggers are named by module (``gateway.session``); the audit logger is
``toolbus.audit`` and does not propagate, so audit records never mix with the
operational log. Nothing here ever formats a credential: callers log ids and kinds.
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue
import sys
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


class AuditWriter:
    """The thread that formats and appends audit records to their file (SPEC I11, O3).

    Args:
        path: the audit file, opened for appending.
        records: the queue the ``toolbus.audit`` logger's handler feeds.
    """

    def __init__(self, path: Path, records: queue.SimpleQueue[logging.LogRecord]) -> None:
        self._file = logging.FileHandler(path, encoding="utf-8")
        self._file.setFormatter(JsonFormatter())
        self._listener = logging.handlers.QueueListener(records, self._file)
        self._listener.start()
        self._open = True

    def close(self) -> None:
        """Write what is queued, stop the thread, close the file. Idempotent."""
        if self._open:
            self._open = False
            self._listener.stop()
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
        # The invoke path only enqueues the record; a listener thread formats and writes
        # it, so file I/O never runs on the event loop (SPEC I11 on the hot path).
        records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        writer = AuditWriter(audit_file, records)
        atexit.register(writer.close)
        audit.handlers[:] = [logging.handlers.QueueHandler(records)]
        audit.propagate = False
        return writer
    return None
