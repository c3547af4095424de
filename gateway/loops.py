"""The server's long-running tasks while it serves (SPEC D2, C3, S6, I15, M4).

:class:`ServerLoops` starts them once the port is bound and cancels them when the drain
begins: the store purge (expired sessions, old jobs, call ids past their window), the
catalog hot reload, the credential re-check, and the ``/mcp`` session manager. Each
maintenance loop survives its own failures (:func:`gateway.tasks.periodic`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from gateway.authority import Authority
from gateway.catalog_state import CatalogState
from gateway.config import Settings
from gateway.ledger import CallLedger
from gateway.mcp.serve import McpEndpoint
from gateway.session import Session, SessionTable
from gateway.store import Store
from gateway.tasks import periodic


class ServerLoops:
    """The tasks that run beside the sockets, started and stopped as one.

    Args:
        settings: intervals (purge, hot reload, re-check) and job retention.
        store: purged every ``sessions.purge_interval`` seconds (SPEC D2).
        ledger: purged with the store (SPEC I15).
        catalog: hot-reloaded when ``catalog.hot_reload`` (SPEC C3).
        authority: re-checks credentials every ``auth.recheck_interval`` (SPEC S6).
        sessions: the sessions the reload and the re-check visit.
        mcp_endpoint: its SDK session manager runs while the server serves (SPEC M4).
        clock: Unix time in seconds.
    """

    def __init__(
        self,
        settings: Settings,
        store: Store,
        ledger: CallLedger,
        catalog: CatalogState,
        authority: Authority,
        sessions: SessionTable,
        mcp_endpoint: McpEndpoint,
        clock: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._store = store
        self._ledger = ledger
        self._catalog = catalog
        self._authority = authority
        self._sessions = sessions
        self._mcp_endpoint = mcp_endpoint
        self._clock = clock
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start every task on the running loop; returns at once. Call once the port is
        bound, so a start-up that fails to bind (SPEC O5) has started nothing."""
        loop = asyncio.get_running_loop()
        sessions = self._all_sessions
        self._tasks.append(loop.create_task(self._run_mcp()))
        settings = self._settings
        if settings.catalog.hot_reload:
            watch = self._catalog.watch(settings.catalog.reload_interval, sessions)
            self._tasks.append(loop.create_task(watch))
        purge = periodic("store purge", settings.sessions.purge_interval, self._purge)
        self._tasks.append(loop.create_task(purge))
        recheck = self._authority.watch(settings.auth.recheck_interval, sessions)
        self._tasks.append(loop.create_task(recheck))

    def add(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as one more task of the running loop, cancelled with the others."""
        self._tasks.append(asyncio.get_running_loop().create_task(coro))

    def stop(self) -> None:
        """Cancel every task (the drain, SPEC S4); they end at their next await."""
        for task in self._tasks:
            task.cancel()

    def _all_sessions(self) -> Iterable[Session]:
        return self._sessions.sessions.values()

    def _purge(self) -> None:
        """SPEC D2: drop expired sessions and old jobs; SPEC I15: call ids past their
        window. A failing purge is logged and retried with backoff (:func:`periodic`)."""
        self._store.purge(self._clock(), self._settings.jobs.retention)
        self._ledger.purge()

    async def _run_mcp(self) -> None:
        async with self._mcp_endpoint.running():
            await asyncio.Event().wait()
