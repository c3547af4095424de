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
import time
from pathlib import Path
from typing import Any

from protocol.codec import encode_json

logger = logging.getLogger("gateway.logs")
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
    """Hands audit lines to the :class:`AuditWriter` thread in batches (SPEC I11).

    A record becomes its JSON line where it is made: :meth:`add_audit_fields` encodes the fields
    :func:`gateway.audit.write` gives it in one ``orjson`` call (the hot path, no
    :class:`logging.LogRecord`), and :meth:`emit` formats a record that came through
    the ``toolbus.audit`` logger with :class:`JsonFormatter` (same line). On a thread
    running an event loop the line joins the current batch, which a loop timer hands
    over :attr:`DELAY` seconds after its first line (at once when it holds
    :attr:`MAX_BATCH`): one queue put and one wake-up of the writer per batch, and the
    writer only joins bytes and writes them, so it hardly holds the GIL the loop needs.
    Lines not yet written are lost if the process is killed (at most :attr:`DELAY`
    more than with one write per record). From a thread without a loop a line goes at
    once.

    Args:
        lines: the writer's queue: lists of encoded lines, ``None`` to stop it.
    """

    DELAY = 0.02
    """Seconds a batch gathers lines on the loop before the writer gets it: a
    sequential caller's calls then share one hand-over instead of one each."""
    MAX_BATCH = 1024
    """Lines that make a batch go at once, whatever its age."""

    def __init__(self, lines: queue.SimpleQueue[list[bytes] | None]) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self._lines = lines
        self._batch: list[bytes] = []

    def add_audit_fields(self, fields: dict[str, Any]) -> None:
        """Queue one audit record given as its fields (JSON values): the line
        ``{"ts": <Unix seconds>, **fields}``, as :meth:`emit` would write it."""
        line = encode_json({"ts": round(time.time(), 6), **fields}) + b"\n"
        with self.lock or contextlib.nullcontext():
            self._add(line)

    def emit(self, record: logging.LogRecord) -> None:
        try:  # under the handler's lock (Handler.handle)
            line = (self.format(record) + "\n").encode()
        except Exception:  # a record that cannot be formatted, as logging's handlers do
            self.handleError(record)
            return
        self._add(line)

    def _add(self, line: bytes) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._lines.put([line])
            return
        batch = self._batch
        batch.append(line)
        if len(batch) == 1:
            loop.call_later(self.DELAY, self.hand_over)
        elif len(batch) >= self.MAX_BATCH:
            self.hand_over()

    def hand_over(self) -> None:
        """Give the batch gathered so far to the writer (also before it stops)."""
        with self.lock or contextlib.nullcontext():
            batch, self._batch = self._batch, []
        if batch:
            self._lines.put(batch)


class AuditWriter:
    """The thread that appends audit lines to their file (SPEC I11, O3).

    Args:
        path: the audit file, opened for appending (created with its folder's rights).
        lines: the queue :class:`BatchHandler` feeds; each batch is written with one
            write and one flush.
        handler: that handler, whose last batch :meth:`close` hands over first.

    A failed write (a full disk) is reported on the operational log, once until a
    write succeeds again; the thread goes on with the next batch.
    """

    def __init__(
        self,
        path: Path,
        lines: queue.SimpleQueue[list[bytes] | None],
        handler: BatchHandler,
    ) -> None:
        self._path = path
        self._file = path.open("ab")
        self._lines = lines
        self._handler = handler
        self._thread = threading.Thread(target=self._run, name="toolbus-audit", daemon=True)
        self._thread.start()
        self._open = True

    def _run(self) -> None:
        failing = False
        while (batch := self._lines.get()) is not None:
            try:
                self._file.write(b"".join(batch))
                self._file.flush()
            except OSError as exc:
                if not failing:
                    logger.error("%s: writing audit records failed: %s", self._path, exc)
                failing = True
                continue
            failing = False

    def close(self) -> None:
        """Write what is queued, stop the thread, close the file. Idempotent."""
        if self._open:
            self._open = False
            self._handler.hand_over()
            self._lines.put(None)
            self._thread.join()
            with contextlib.suppress(OSError):
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
        lines: queue.SimpleQueue[list[bytes] | None] = queue.SimpleQueue()
        batches = BatchHandler(lines)
        writer = AuditWriter(audit_file, lines, batches)
        atexit.register(writer.close)
        audit.handlers[:] = [batches]
        audit.propagate = False
        return writer
    return None
