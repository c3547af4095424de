"""Composition: every part of a gateway, each built once from its few collaborators
before serving (SPEC I1-I16, S1-S6, M1-M4).

:func:`build_gateway` builds them all, in one place, before the port is bound; no task
starts here, so a start-up that fails later has nothing to stop (SPEC O5).
:func:`build_pipeline` and :func:`build_connection_parts` are its pieces for the calls
and the connections. The
parts themselves (:mod:`gateway.admission`, :mod:`gateway.approval_gate`,
:mod:`gateway.execution`, :mod:`gateway.call_end`, :mod:`gateway.hello`,
:mod:`gateway.session_requests`, :mod:`gateway.connection`, :mod:`gateway.recovery`,
:mod:`gateway.health`, :mod:`gateway.http_front`, :mod:`gateway.loops`,
:mod:`gateway.sockets`) take what they use in their constructors and never reach through
the :class:`~gateway.server.Gateway`, which only starts and stops them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway import hooks
from gateway.admission import Admission, CallChecks
from gateway.approval_gate import ApprovalGate
from gateway.approvals import Approvals
from gateway.auth import Authenticator, ChainAuthenticator, JwtAuthenticator, TokenFileAuthenticator
from gateway.authority import Authority
from gateway.call_end import CallEnd
from gateway.catalog_state import CatalogState
from gateway.config import CallsConfig, LimitsConfig, ServerConfig, Settings
from gateway.connection import ConnectionParts, bucket_factory
from gateway.execution import Execution
from gateway.handoff import Handoff
from gateway.health import Health, Status
from gateway.hello import SessionOpener
from gateway.hooks import PostHook, PreHook
from gateway.http_front import Origins, SideRoutes, UpgradeVetting, credentials_in
from gateway.job_recovery import JobRecovery
from gateway.jobs import JobRunner
from gateway.ledger import CallLedger
from gateway.loops import ServerLoops
from gateway.mcp.approve import HostAsker
from gateway.mcp.elicit import Elicitations
from gateway.mcp.mounts import McpMounts
from gateway.mcp.route import McpHttp
from gateway.mcp.serve import McpEndpoint
from gateway.metrics import Metrics
from gateway.outbox import Outbox
from gateway.pipeline import Pipeline
from gateway.recovery import Recovery
from gateway.session import Session, SessionTable, TokenBucket
from gateway.session_requests import SessionRequests
from gateway.sockets import LiveSockets, SocketLifetime
from gateway.store import Store
from gateway.stores import open_store
from gateway.tasks import TaskSet
from gateway.watchdog import Watchdog
from gateway.workers import Lane, Workers
from protocol import messages as m

if TYPE_CHECKING:
    from gateway.nodes import Node


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
        Execution(
            catalog, jobs, calls, pre_hooks, post_hooks, pool, data_dir, authority, ledger, end
        ),
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


def build_authenticator(settings: Settings) -> Authenticator:
    """The authenticator chain the configuration names (SPEC S2)."""
    auth = settings.auth
    chain: list[Authenticator] = []
    if auth.token_file is not None:
        chain.append(TokenFileAuthenticator(auth.token_file))
    if auth.jwt_secret or auth.jwt_public_key_file:
        key = auth.jwt_public_key_file.read_text() if auth.jwt_public_key_file else None
        chain.append(
            JwtAuthenticator(
                auth.jwt_secret, key, auth.jwt_audience, auth.jwt_issuer, auth.jwt_profiles_claim
            )
        )
    return ChainAuthenticator(chain)


def welcome_limits(settings: Settings) -> m.Limits:
    """The limits ``welcome`` announces (SPEC S1, E2)."""
    server, limits, sessions = settings.server, settings.limits, settings.sessions
    return m.Limits(
        max_message_bytes=server.max_message_bytes,
        heartbeat_interval=server.heartbeat_interval,
        heartbeat_timeout=server.heartbeat_timeout,
        max_inflight_calls=limits.max_inflight_calls,
        invoke_rate=limits.invoke_rate,
        invoke_burst=limits.invoke_burst,
        max_pending_approvals=limits.max_pending_approvals,
        max_sessions_per_user=limits.max_sessions_per_user,
        resume_window=sessions.resume_window,
        max_unacked_events=sessions.max_unacked_events,
        max_context_bytes=limits.max_context_bytes,
    )


def build_workers(settings: Settings, metrics: Metrics) -> Workers:
    """SPEC E3: sync calls and jobs have threads of their own, each lane with
    per-session and per-user caps."""
    calls, jobs = settings.calls, settings.jobs
    return Workers(
        Lane(
            "calls",
            calls.worker_threads,
            calls.threads_per_session,
            calls.threads_per_user,
            metrics,
        ),
        Lane("jobs", jobs.worker_threads, jobs.threads_per_session, jobs.threads_per_user, metrics),
    )


@dataclass(frozen=True, slots=True)
class GatewayParts:
    """Every part of one gateway, built once by :func:`build_gateway`."""

    settings: Settings
    clock: Callable[[], float]
    metrics: Metrics
    authenticator: Authenticator
    store: Store
    catalog: CatalogState
    bucket: Callable[[], TokenBucket]
    workers: Workers
    watchdog: Watchdog
    status: Status
    sockets: LiveSockets
    background: TaskSet
    outbox: Outbox
    sessions: SessionTable
    approvals: Approvals
    elicitations: Elicitations
    authority: Authority
    jobs: JobRunner
    pipeline: Pipeline
    connection_parts: ConnectionParts
    mcp: McpMounts
    """Mounted MCP servers (SPEC M1, M2); they connect once the server starts them."""
    mcp_endpoint: McpEndpoint
    """``/mcp``: the catalog over MCP Streamable HTTP on this port (SPEC M4)."""
    mcp_http: McpHttp
    origins: Origins
    vetting: UpgradeVetting
    health: Health
    recovery: Recovery
    handoff: Handoff
    loops: ServerLoops
    node: Node | None = None
    """This process as one node of several on a shared store (SPEC N2-N5); ``None`` on
    the embedded SQLite store."""


def _node(
    settings: Settings,
    store: Store,
    sessions: SessionTable,
    outbox: Outbox,
    catalog: CatalogState,
    bucket: Callable[[], TokenBucket],
    clock: Callable[[], float],
) -> Node | None:
    """The node part on a PostgreSQL store (SPEC N2-N5), else ``None``. The PostgreSQL
    modules are imported only when such a store was opened (psycopg's start-up cost)."""
    store_pg = sys.modules.get("gateway.store_pg")
    if store_pg is None or not isinstance(store, store_pg.PgStore):
        return None
    from gateway.nodes import Node

    return Node(store, settings.nodes, sessions, outbox, catalog, bucket, clock)


def build_gateway(
    settings: Settings,
    authenticator: Authenticator | None = None,
    store: Store | None = None,
    clock: Callable[[], float] = time.time,
) -> GatewayParts:
    """Build every part of a gateway, each from the few parts it uses (SPEC S1-S6).

    Nothing here needs a running loop or starts a task; the server starts and stops the
    parts (:meth:`gateway.server.Gateway.start`, :meth:`~gateway.server.Gateway.drain`).

    Args:
        settings: the configuration.
        authenticator: overrides the one built from ``settings.auth`` (tests, embedding).
        store: overrides the store ``settings.store`` names (SPEC N1: PostgreSQL when
            ``store.url`` is set, else SQLite at ``data_dir/toolbus.db``).
        clock: Unix time in seconds.

    Raises:
        StoreError: the store cannot be opened, or is damaged (SPEC D6, O5).
    """
    metrics = Metrics()
    authenticator = authenticator or build_authenticator(settings)
    store = store or open_store(
        settings.store.url, settings.data_dir / "toolbus.db", settings.calls.call_id_window
    )
    # SPEC E2: every profile's catalog frame must fit the size welcome announces.
    max_frame = settings.server.max_message_bytes
    catalog = CatalogState(settings.catalog.tools, settings.catalog.profiles, max_frame)
    bucket = bucket_factory(settings.limits.invoke_rate, settings.limits.invoke_burst)
    workers = build_workers(settings, metrics)
    # SPEC E3: the watchdog notices a blocked event loop from outside it.
    watchdog = Watchdog(settings.server.loop_stall_threshold, metrics)
    lifetime = SocketLifetime(
        settings.server.max_socket_lifetime, settings.server.max_socket_lifetime_jitter
    )
    status, sockets, background = Status(), LiveSockets(lifetime), TaskSet()
    store_cfg = settings.store
    outbox = Outbox(
        store,
        store_cfg.unavailable_after,
        store_cfg.retry_max,
        metrics.store_commit_failures.inc,
        store_cfg.settle_after,
    )

    def session_ended(session: Session) -> None:
        """SPEC A4, I8, I15: the end of a session denies its approvals and cancels its
        calls (an expired session's running handlers run on, see Pipeline.end_session)."""
        approvals.settle_session(session.id, m.ResolutionReason.DISCONNECTED)
        elicitations.settle_session(session.id)
        authority.forget(session)
        pipeline.end_session(session)

    sessions = SessionTable(
        store,
        outbox,
        settings.sessions.resume_window,
        settings.sessions.max_unacked_events,
        session_ended,
        settings.sessions.max_call_records,
    )
    approvals = Approvals(settings.calls.approval_timeout, clock)
    elicitations = Elicitations(sessions.get, settings.calls.approval_timeout, clock, max_frame)
    authority = Authority(
        catalog, authenticator, clock, settings.auth.expiry_warning, sockets.close_lapsed
    )
    jobs = JobRunner(store, settings.jobs, metrics, workers.jobs, clock, max_frame)
    pipeline = build_pipeline(
        catalog=catalog,
        approvals=approvals,
        jobs=jobs,
        calls=settings.calls,
        limits=settings.limits,
        pre_hooks=[hooks.resolve(p) for p in settings.calls.pre_hooks],
        post_hooks=[hooks.resolve(p) for p in settings.calls.post_hooks],
        metrics=metrics,
        pool=workers.calls,
        data_dir=settings.data_dir,
        authority=authority,
        ledger=CallLedger(store, settings.calls.call_id_window, clock),
        max_frame=max_frame,
    )
    connection_parts = build_connection_parts(
        server=settings.server,
        limits=settings.limits,
        welcome_limits=welcome_limits(settings),
        authenticator=authenticator,
        sessions=sessions,
        outbox=outbox,
        store=store,
        catalog=catalog,
        authority=authority,
        pipeline=pipeline,
        approvals=approvals,
        elicitations=elicitations,
        jobs=jobs,
        metrics=metrics,
        background=background,
        bucket=bucket,
        clock=clock,
        draining=status.is_draining,
    )
    mcp = McpMounts(catalog, lambda: sessions.sessions.values(), elicitations.ask)
    origins = Origins(settings.server)
    mcp_endpoint = McpEndpoint(
        authenticator,
        sessions,
        catalog,
        pipeline,
        jobs,
        HostAsker(approvals, elicitations, clock),
        authority,
        bucket,
        clock,
        credentials_in,
        origins.allows,
    )
    health = Health(status, metrics, outbox, sessions, pipeline, approvals, jobs, workers)
    side_routes = SideRoutes(health)
    mcp_endpoint.side_routes = side_routes.answer  # SPEC O2 on a kept-alive /mcp connection
    node = _node(settings, store, sessions, outbox, catalog, bucket, clock)
    connection_parts.opener.node = node
    if node is not None:
        from gateway.node_requests import NodeRequests

        node.requests = NodeRequests(node.store, approvals, pipeline, jobs, elicitations, clock)
        connection_parts.requests.routes = node.requests
    handoff = Handoff(pipeline, metrics)
    recovery = Recovery(
        store,
        catalog,
        sessions,
        bucket,
        pipeline,
        JobRecovery(store, jobs, clock),
        authority,
        outbox,
        mcp,
        handoff,
        clock,
    )
    if node is not None:
        node.recovery = recovery
    return GatewayParts(
        node=node,
        settings=settings,
        clock=clock,
        metrics=metrics,
        authenticator=authenticator,
        store=store,
        catalog=catalog,
        bucket=bucket,
        workers=workers,
        watchdog=watchdog,
        status=status,
        sockets=sockets,
        background=background,
        outbox=outbox,
        sessions=sessions,
        approvals=approvals,
        elicitations=elicitations,
        authority=authority,
        jobs=jobs,
        pipeline=pipeline,
        connection_parts=connection_parts,
        mcp=mcp,
        mcp_endpoint=mcp_endpoint,
        mcp_http=McpHttp(mcp_endpoint),
        origins=origins,
        vetting=UpgradeVetting(origins, side_routes),
        health=health,
        recovery=recovery,
        handoff=handoff,
        loops=ServerLoops(
            settings, store, pipeline.ledger, catalog, authority, sessions, mcp_endpoint, clock
        ),
    )
