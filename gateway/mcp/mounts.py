"""Every mounted MCP server of the catalog, kept in step with it (SPEC M1, M2, C3).

:class:`McpMounts` starts one :class:`~gateway.mcp.server.MountedServer` task per
``mcp_servers`` entry of the catalog files. Start-up never waits for them: a server's
tools enter the catalog when it answers, and every session is pushed its new catalog
then (SPEC C3), as on every ``list_changed`` and connection change (SPEC M2). After a
hot reload of the files the mounts are reconciled: servers whose configuration changed
are restarted, removed ones stopped and their tools withdrawn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from catalog.mcp_mounts import MountSpec
from gateway.catalog_state import CatalogState
from gateway.mcp.server import Elicit, MountedServer
from gateway.session import Session
from protocol import messages as m

logger = logging.getLogger("gateway.mcp")


class McpMounts:
    """The mounted MCP servers of one gateway (SPEC M1, M2).

    Args:
        catalog: the gateway's catalog state; mounted tools are set into it.
        sessions: the live and parked sessions, to push catalog changes to (SPEC C3).
        elicit: forwards a server's elicitation to the call's user (SPEC M3); ``None``
            declares no elicitation capability to the servers.
    """

    def __init__(
        self,
        catalog: CatalogState,
        sessions: Callable[[], Iterable[Session]],
        elicit: Elicit | None = None,
    ) -> None:
        self.catalog = catalog
        self._elicit = elicit
        self._sessions = sessions
        self.servers: dict[str, MountedServer] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        """Tasks of stopped servers, kept until they finished closing (drain awaits them)."""

    def start(self) -> None:
        """Start a task per configured server; returns at once (start-up never blocks)."""
        self.catalog.on_reload.append(self.reconcile)
        self.reconcile()

    def reconcile(self) -> None:
        """Match the running servers to the catalog's ``mcp_servers`` (SPEC M1, C3)."""
        wanted: dict[str, MountSpec] = {spec.name: spec for spec in self.catalog.files.mounts}
        for name in list(self.servers):
            if wanted.get(name) != self.servers[name].spec:
                self._stop(name)
        for name, spec in wanted.items():
            if name not in self.servers:
                server = MountedServer(spec, self._publish, self._elicit)
                self.servers[name] = server
                self._tasks[name] = asyncio.get_running_loop().create_task(
                    server.run(), name=f"mcp:{name}"
                )

    def owners(self, tool: str) -> list[str]:
        """The configured servers that could provide the toolbus tool ``tool`` (its name
        has their prefix and passes their include and exclude), connected or not."""
        return [
            spec.name
            for spec in self.catalog.files.mounts
            if tool.startswith(spec.prefix) and spec.wanted(tool[len(spec.prefix) :])
        ]

    async def settled(self, names: Iterable[str]) -> None:
        """Return once each named server's first connection attempt since :meth:`start`
        ended, connected or failed (at most its ``connect_timeout``; SPEC J5, M2). A name
        not running (removed by a hot reload) does not wait."""
        waits = [self.servers[n].settled.wait() for n in set(names) if n in self.servers]
        await asyncio.gather(*waits)

    def _stop(self, name: str) -> None:
        self.servers.pop(name).stop()
        self._stopping.add(self._tasks.pop(name))
        if name in self.catalog.mounted:
            self.catalog.set_mounted(name, {})
            self._push()

    def _publish(self, server: MountedServer) -> None:
        if self.servers.get(server.spec.name) is not server:
            return  # a stopped server's last word
        self.catalog.set_mounted(server.spec.name, dict(server.tools))
        self._push()

    def _push(self) -> None:
        for session in list(self._sessions()):
            self.catalog.refresh_profile(session)
            self.catalog.push(session, m.CatalogReason.RELOAD)

    async def stop(self) -> None:
        """Stop every server (their subprocesses end); for a drain (SPEC S4)."""
        with contextlib.suppress(ValueError):
            self.catalog.on_reload.remove(self.reconcile)
        for server in self.servers.values():
            server.stop()
        tasks = [*self._tasks.values(), *self._stopping]
        self._tasks.clear()
        self._stopping.clear()
        self.servers.clear()
        await asyncio.gather(*tasks, return_exceptions=True)
