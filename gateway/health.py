"""Readiness, the gauges behind ``/metrics`` and the count of tracked entries (SPEC O2,
S4, D6, E3).

:class:`Status` holds the two flags the server's lifecycle flips: ``ready`` (cleared
first by a drain, SPEC S4) and ``draining`` (no new session may start). :class:`Health`
reads them, the outbox's store availability and the live parts, for ``/readyz`` and
``/metrics``, and answers :meth:`Health.tracked` (case F33).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.approvals import Approvals
from gateway.jobs import JobRunner
from gateway.metrics import Metrics
from gateway.outbox import Outbox
from gateway.pipeline import Pipeline
from gateway.session import SessionTable
from gateway.workers import Workers


@dataclass(slots=True)
class Status:
    """The server's lifecycle flags, read by the parts that refuse work (SPEC S4)."""

    ready: bool = False
    """Serving and not draining: ``/readyz`` answers 200 (unless the store fails)."""
    draining: bool = False
    """Set once the drain began: no new session may start (SPEC S4)."""

    def is_draining(self) -> bool:
        """:attr:`draining`, as a callable for the parts that only read it."""
        return self.draining


class Health:
    """What ``/readyz`` and ``/metrics`` report (SPEC O2).

    Args:
        status: the lifecycle flags.
        metrics: the server's metrics; its gauges are set on each :meth:`metrics_text`.
        outbox: whether the store commits (SPEC D6).
        sessions: the session table (live and parked counts).
        pipeline: calls tracked.
        approvals: pending approvals.
        jobs: the job runner's tracked entries.
        workers: the worker lanes' stats (SPEC E3).
    """

    def __init__(
        self,
        status: Status,
        metrics: Metrics,
        outbox: Outbox,
        sessions: SessionTable,
        pipeline: Pipeline,
        approvals: Approvals,
        jobs: JobRunner,
        workers: Workers,
    ) -> None:
        self._status = status
        self._metrics = metrics
        self._outbox = outbox
        self._sessions = sessions
        self._pipeline = pipeline
        self._approvals = approvals
        self._jobs = jobs
        self._workers = workers

    def readiness(self) -> tuple[bool, bytes]:
        """``(ready, body)`` for ``/readyz``: not ready while draining (SPEC S4) or while
        the store cannot commit (SPEC D6)."""
        if not self._status.ready:
            return False, b"draining\n"
        if self._outbox.unavailable:
            return False, b"store unavailable\n"
        return True, b"ready\n"

    def metrics_text(self) -> bytes:
        """The Prometheus text exposition, gauges set to the values of now (SPEC O2)."""
        metrics = self._metrics
        metrics.store_available.set(0 if self._outbox.unavailable else 1)
        sessions = self._sessions.sessions
        live = sum(1 for s in sessions.values() if s.link is not None)
        metrics.sessions.labels("live").set(live)
        metrics.sessions.labels("parked").set(len(sessions) - live)
        for kind, count in self.tracked().items():
            metrics.tracked.labels(kind).set(count)
        return metrics.render()

    def tracked(self) -> dict[str, int]:
        """Per-session and per-user entries held now, by kind (SPEC E3, case F33): each
        goes back to its baseline once the sessions ended and their work is done."""
        counts = {
            "sessions": len(self._sessions.sessions),
            "session_owners": self._sessions.owners(),
            "calls_tracked": self._pipeline.tracked_calls(),
            "approvals": len(self._approvals.pending),
            **self._jobs.tracked(),
        }
        for lane in (self._workers.calls, self._workers.jobs):
            stats = lane.stats()
            counts[f"{lane.name}_threads_held"] = stats.busy
            counts[f"{lane.name}_thread_sessions"] = stats.sessions
            counts[f"{lane.name}_thread_users"] = stats.users
            counts[f"{lane.name}_thread_waiters"] = stats.waiting
        return counts
