"""Composition: the parts of the pipeline and of every connection, each built once
from its few collaborators before serving (SPEC I1-I16, S1-S6).

:func:`build_pipeline` and :func:`build_connection_parts` are the one place that knows
which part takes what; the parts themselves (:mod:`gateway.admission`,
:mod:`gateway.approval_gate`, :mod:`gateway.execution`, :mod:`gateway.call_end`,
:mod:`gateway.hello`, :mod:`gateway.session_requests`, :mod:`gateway.connection`) never
reach through the :class:`~gateway.server.Gateway`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gateway.admission import Admission, CallChecks
from gateway.approval_gate import ApprovalGate
from gateway.approvals import Approvals
from gateway.auth import Authenticator
from gateway.authority import Authority
from gateway.call_end import CallEnd
from gateway.config import CallsConfig, LimitsConfig, ServerConfig
from gateway.connection import ConnectionParts
from gateway.execution import Execution
from gateway.hello import SessionOpener
from gateway.hooks import PostHook, PreHook
from gateway.jobs import JobRunner
from gateway.ledger import CallLedger
from gateway.mcp.elicit import Elicitations
from gateway.metrics import Metrics
from gateway.outbox import Outbox
from gateway.pipeline import Pipeline
from gateway.session import SessionTable, TokenBucket
from gateway.session_requests import SessionRequests
from gateway.store import Store
from gateway.tasks import TaskSet
from gateway.workers import Lane
from protocol import messages as m

if TYPE_CHECKING:
    from gateway.catalog_state import CatalogState


def build_pipeline(
    *,
    catalog: CatalogState,
    approvals: Approvals,
    jobs: JobRunner,
    calls: CallsConfig,
    limits: LimitsConfig,
    pre_hooks: Sequence[PreHook],
    post_hooks: Sequence[PostHook],
    metrics: Metrics,
    pool: Lane,
    data_dir: Any,
    authority: Authority,
    ledger: CallLedger,
    max_frame: int | None,
) -> Pipeline:
    """The pipeline and its parts, wired (SPEC I1-I16).

    Args:
        catalog: the server's current catalog state (swapped on hot reload).
        approvals: the approval registry.
        jobs: the job runner.
        calls: call settings (timeouts, declined text, audit size).
        limits: per-session limits (SPEC E2).
        pre_hooks: pre-execute hooks in order (SPEC I6).
        post_hooks: post-execute hooks in order (SPEC I10).
        metrics: the server's metrics.
        pool: the worker lane for plain handlers of sync calls (SPEC S3, E3).
        data_dir: the folder handed to tools as ``ctx.data_dir``.
        authority: the re-check of every gate after each wait (SPEC A7, S6).
        ledger: the principals' call ids across sessions (SPEC I15).
        max_frame: the announced ``max_message_bytes``: params and results must fit
            their ``tool_start``/``result`` frame (SPEC E2); ``None``: no bound.
    """
    end = CallEnd(ledger, metrics, calls, max_frame)
    return Pipeline(
        ledger,
        Admission(ledger, limits, metrics),
        CallChecks(catalog, end),
        ApprovalGate(approvals, calls, limits, metrics, end),
        Execution(catalog, jobs, calls, pre_hooks, post_hooks, pool, data_dir, authority, end),
        end,
    )


def build_connection_parts(
    *,
    server: ServerConfig,
    limits: LimitsConfig,
    welcome_limits: m.Limits,
    authenticator: Authenticator,
    sessions: SessionTable,
    outbox: Outbox,
    store: Store,
    catalog: CatalogState,
    authority: Authority,
    pipeline: Pipeline,
    approvals: Approvals,
    elicitations: Elicitations,
    jobs: JobRunner,
    metrics: Metrics,
    background: TaskSet,
    bucket: Callable[[], TokenBucket],
    clock: Callable[[], float],
    draining: Callable[[], bool],
) -> ConnectionParts:
    """What every connection uses, wired once (SPEC S1-S6, D2-D6, E1).

    Args:
        server: the server settings.
        limits: per-session limits (SPEC E2).
        welcome_limits: the limits announced in ``welcome``.
        authenticator: checks a hello's credential (SPEC S2).
        sessions: the session table.
        outbox: the group commit (SPEC D1, D6).
        store: the store (events, jobs).
        catalog: the server's current catalog state.
        authority: binds and refreshes credentials (SPEC S6).
        pipeline: runs calls (SPEC I1-I16).
        approvals: the approval registry (SPEC A3).
        elicitations: mounted MCP servers' questions (SPEC M3).
        jobs: the job runner (SPEC J3).
        metrics: the server's metrics.
        background: keeps fire-and-forget tasks referenced.
        bucket: a new session's invoke token bucket (SPEC E2).
        clock: Unix time in seconds.
        draining: ``True`` once the server drains (SPEC S4).
    """
    opener = SessionOpener(
        authenticator,
        sessions,
        outbox,
        store,
        catalog,
        authority,
        metrics,
        limits,
        welcome_limits,
        bucket,
        clock,
    )
    requests = SessionRequests(
        pipeline,
        approvals,
        elicitations,
        jobs,
        store,
        outbox,
        catalog,
        authority,
        metrics,
        limits,
        background,
    )
    return ConnectionParts(server, opener, requests, sessions, outbox, metrics, clock, draining)
