"""Progress of running jobs: ``job.progress`` events and the last note (SPEC J2, E2).

A handler reports ``progress(fraction, message)`` from the loop or from its worker
thread (the call is handed to the loop). :class:`JobProgress` keeps the last note of
each active job for ``job.get`` and ``job.list`` (SPEC J3) and emits ``job.progress`` at
most once per ``jobs.progress_interval`` per job, its text clipped so the frame fits
``max_message_bytes`` (SPEC E2).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping

from gateway.context import check_progress
from gateway.framesize import ENVELOPE, clip_text
from gateway.job_end import ActiveJob
from protocol import messages as m
from protocol.codec import encode_json

Sink = Callable[[float | None, str | None], None]
"""``progress(fraction, message)``: ``fraction`` in [0, 1] or ``None``; any thread."""


class JobProgress:
    """The progress notes of the active jobs (SPEC J2).

    Args:
        interval: seconds between two ``job.progress`` events of one job.
        clock: Unix time in seconds.
        active: the runner's active jobs, by id; a note for a job not there is dropped.
        emit: emits a job's event into its session's log (:meth:`JobEnd.emit`).
        max_frame: ``max_message_bytes`` (SPEC E2); ``None``: no bound.
    """

    def __init__(
        self,
        interval: float,
        clock: Callable[[], float],
        active: Mapping[str, ActiveJob],
        emit: Callable[[ActiveJob, m.DurableEvent], None],
        max_frame: int | None = None,
    ) -> None:
        self._interval = interval
        self._clock = clock
        self._active = active
        self._emit = emit
        self._max_frame = max_frame
        self._notes: dict[str, tuple[float | None, str | None]] = {}

    def sink(self, job: ActiveJob) -> Sink:
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()

        def progress(fraction: float | None, message: str | None = None) -> None:
            check_progress(fraction, message)  # SPEC I16: raised in the handler
            if threading.get_ident() == loop_thread:
                self._on_progress(job, fraction, message)
            else:
                loop.call_soon_threadsafe(self._on_progress, job, fraction, message)

        return progress

    def _on_progress(self, job: ActiveJob, fraction: float | None, message: str | None) -> None:
        """Emit ``job.progress`` at most once per interval per job (SPEC J2)."""
        if job.row.job_id not in self._active:
            return
        if fraction is not None:
            fraction = min(1.0, max(0.0, float(fraction)))
        if isinstance(message, str) and self._max_frame is not None:
            # SPEC E2: a handler's progress text must not make job.progress (or the job
            # reply of job.get, which carries it too) larger than max_message_bytes.
            ids = len(encode_json([job.row.job_id, job.row.tool, job.row.call_id]))
            message = clip_text(message, self._max_frame - ENVELOPE - ids)
        self._notes[job.row.job_id] = (fraction, message)
        now = self._clock()
        if now - job.last_progress < self._interval:
            return
        job.last_progress = now
        row = job.row
        self._emit(
            job,
            m.JobProgress(
                job_id=row.job_id,
                tool=row.tool,
                call_id=row.call_id,
                progress=fraction,
                message=message,
            ),
        )

    def of(self, job_id: str) -> tuple[float | None, str | None]:
        """The last ``(fraction, message)`` of a job; ``(None, None)`` without one."""
        return self._notes.get(job_id, (None, None))

    def forget(self, job_id: str) -> None:
        """Drop a job's note (it ended)."""
        self._notes.pop(job_id, None)

    def __len__(self) -> int:
        return len(self._notes)
