"""``job`` and ``jobs`` replies fit the announced frame size (SPEC E2, J3).

A job's ``result`` and ``artifacts`` are delivered whole by its ``job.done`` event,
which the job runner already keeps under ``max_message_bytes``. The ``job`` reply adds
fields to that (state, times, progress), and a ``jobs`` reply lists up to 1,000 jobs,
so either could exceed the size the server announced. The rule (docs/protocol.md):

- each job is listed whole while the reply fits;
- a job that would make the reply too large is listed without ``result`` and
  ``artifacts`` (a ``done`` job without ``result`` means: read it with ``job.get``, or
  from its ``job.done`` event);
- a ``jobs`` reply that still does not fit ends before the first job that does not fit
  (fewer jobs than ``limit``; ask again with a smaller ``limit`` or a ``status``).
"""

from __future__ import annotations

from pydantic import BaseModel

from protocol import messages as m
from protocol.codec import encode


def _size(message: BaseModel) -> int:
    return len(encode(message))


def fit_job(request_id: str | None, info: m.JobInfo, max_frame: int | None) -> m.Job:
    """The ``job`` reply for ``info``, its result and artifacts left out when the whole
    frame would exceed ``max_frame`` bytes (``None``: no bound)."""
    reply = m.Job(id=request_id, job=info)
    if max_frame is None or _size(reply) <= max_frame:
        return reply
    return m.Job(id=request_id, job=_bare(info))


def fit_jobs(request_id: str | None, infos: list[m.JobInfo], max_frame: int | None) -> m.Jobs:
    """The ``jobs`` reply: ``infos`` in order, each whole while the frame stays within
    ``max_frame`` bytes, else without result and artifacts; it ends before a job that
    does not fit even so (``None``: no bound)."""
    if max_frame is None:
        return m.Jobs(id=request_id, jobs=infos)
    used = _size(m.Jobs(id=request_id, jobs=[]))
    kept: list[m.JobInfo] = []
    for info in infos:
        for candidate in (info, _bare(info)):
            # +1: the comma between two list items.
            cost = len(encode(candidate)) + (1 if kept else 0)
            if used + cost <= max_frame:
                kept.append(candidate)
                used += cost
                break
        else:
            break
    return m.Jobs(id=request_id, jobs=kept)


def _bare(info: m.JobInfo) -> m.JobInfo:
    return info.model_copy(update={"result": None, "artifacts": []})
