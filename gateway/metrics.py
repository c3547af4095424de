"""Prometheus metrics (SPEC O2), one registry per server so tests can run several."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    """The server's metrics, exposed as Prometheus text at ``/metrics`` (SPEC O2)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.sessions = Gauge("toolbus_sessions", "Sessions by state", ["state"], registry=r)
        self.connections = Counter("toolbus_connections_total", "Accepted sockets", registry=r)
        self.invocations = Counter(
            "toolbus_invocations_total", "Invocations by outcome", ["outcome"], registry=r
        )
        self.latency = Histogram(
            "toolbus_invoke_seconds",
            "Invoke latency from receipt to terminal reply, in seconds",
            ["mode"],
            buckets=(
                0.0005,
                0.001,
                0.0025,
                0.005,
                0.01,
                0.025,
                0.05,
                0.1,
                0.25,
                0.5,
                1,
                2.5,
                5,
                10,
            ),
            registry=r,
        )
        self.jobs = Gauge("toolbus_jobs", "Jobs of this process by state", ["state"], registry=r)
        self.jobs_finished = Counter(
            "toolbus_jobs_finished_total", "Finished jobs by state", ["state"], registry=r
        )
        self.pending_approvals = Gauge(
            "toolbus_pending_approvals", "Approvals awaiting a decision", registry=r
        )
        self.replayed = Counter(
            "toolbus_replayed_events_total", "Events re-sent on resume", registry=r
        )
        self.closes = Counter(
            "toolbus_closes_total",
            "Sockets closed by the server, by close code",
            ["code"],
            registry=r,
        )
        """Counted in one place, ``gateway.connection.count_close``, from the close frame the
        server sent: every code, including websockets' own 1002, 1007 and 1009."""
        self.store_commit_failures = Counter(
            "toolbus_store_commit_failures_total",
            "Commits the store could not write (held and retried, SPEC D6)",
            registry=r,
        )
        self.store_available = Gauge(
            "toolbus_store_available",
            "1 while the store commits, 0 while new calls are refused unavailable (SPEC D6)",
            registry=r,
        )
        self.errors = Counter("toolbus_errors_total", "Error replies by code", ["code"], registry=r)
        # SPEC E3: worker slots held per lane, and how many of those belong to handlers
        # whose caller stopped waiting (timed out) but which have not returned yet.
        self.worker_threads = Gauge(
            "toolbus_worker_threads",
            "Worker threads held by plain handlers, by lane (calls, jobs) and state",
            ["lane", "state"],
            registry=r,
        )
        self.handoffs = Counter(
            "toolbus_call_handoffs_total",
            "Calls pending approval a drain handed to another node, by side "
            "(released here, adopted here; SPEC N6)",
            ["side"],
            registry=r,
        )
        self.loop_stalls = Counter(
            "toolbus_loop_stalls_total",
            "Times the event loop did not turn for longer than the watchdog threshold, "
            "by the tool whose handler was running on it",
            ["tool"],
            registry=r,
        )
        self.tracked = Gauge(
            "toolbus_tracked",
            "Per-session and per-user entries the server holds, by kind (leak check)",
            ["kind"],
            registry=r,
        )

        self._outcomes: dict[str, Any] = {}
        self._modes: dict[str, Any] = {}
        self._job_states: dict[str, Any] = {}
        self._jobs_finished: dict[str, Any] = {}

    def job_state(self, state: str) -> Any:
        """The ``toolbus_jobs`` gauge of ``state`` (a :class:`~protocol.messages.JobState`
        or its value), its child cached: ``labels()`` re-validates its arguments, about
        3 us a call here, and each job end moved the gauge four times (issue 13, P5)."""
        gauge = self._job_states.get(state)
        if gauge is None:
            gauge = self._job_states[state] = self.jobs.labels(state)
        return gauge

    def job_finished(self, state: str) -> None:
        """Count one job that ended as ``state`` (``toolbus_jobs_finished_total``)."""
        counter = self._jobs_finished.get(state)
        if counter is None:
            counter = self._jobs_finished[state] = self.jobs_finished.labels(state)
        counter.inc()

    def invocation(self, outcome: str, mode: str, seconds: float) -> None:
        """Count one finished invocation and its latency (the labelled children are cached:
        ``labels()`` re-validates its arguments on every call, on the hot path)."""
        counter = self._outcomes.get(outcome)
        if counter is None:
            counter = self._outcomes[outcome] = self.invocations.labels(outcome)
        histogram = self._modes.get(mode)
        if histogram is None:
            histogram = self._modes[mode] = self.latency.labels(mode)
        counter.inc()
        histogram.observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition format, version 0.0.4."""
        return generate_latest(self.registry)
