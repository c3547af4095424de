"""Audit records: one structured record per invocation (SPEC I11, A6, O3).

Records go to the ``toolbus.audit`` logger as JSON objects, a stream of their own
(the CLI sends it to ``<data_dir>/audit.jsonl`` by default; with that file and no other
handler, :func:`record` hands the fields to the file's batch handler directly).
Parameters are truncated, and parameters the tool marks ``sensitive`` are masked before
anything is written. A record's ``outcome`` is a :class:`protocol.outcomes.CallOutcome`
value.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from protocol.codec import encode_json

audit_logger = logging.getLogger("toolbus.audit")
MASK = "***"


def redact(params: Mapping[str, Any], sensitive: Sequence[str], limit: int) -> Any:
    """Mask ``sensitive`` top-level keys, then cut the JSON to ``limit`` bytes.

    Returns:
        The masked object when its JSON fits in ``limit`` bytes, else a string holding
        the first ``limit`` bytes of that JSON followed by ``...``.
    """
    masked = {k: (MASK if k in sensitive else v) for k, v in params.items()}
    raw = encode_json(masked)
    if len(raw) <= limit:
        return masked
    return raw[:limit].decode(errors="ignore") + "..."


def enabled() -> bool:
    """Whether audit records are wanted: callers skip building them otherwise (hot path)."""
    return audit_logger.isEnabledFor(logging.INFO)


def write(fields: dict[str, Any]) -> None:
    """Write one audit record (SPEC I11) given as its fields (JSON values).

    When the logger's one handler is the audit file's batch handler (``toolbus serve``
    with an audit file, :func:`gateway.logs.setup`) and it has no filters, the fields
    go to that handler directly, without a :class:`logging.LogRecord` (the hot path);
    any other handler or filter gets the record through :mod:`logging` as usual.
    """
    if not audit_logger.isEnabledFor(logging.INFO):
        return
    handlers = audit_logger.handlers
    if len(handlers) == 1 and not audit_logger.filters and not handlers[0].filters:
        add = getattr(handlers[0], "add_audit_fields", None)
        if add is not None:
            add(fields)
            return
    audit_logger.info("audit", extra={"audit": fields})
