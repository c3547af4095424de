"""One mounted MCP server: connect, list, call, watch, reconnect (SPEC M1, M2, M3).

A :class:`MountedServer` owns one task, :meth:`MountedServer.run`, that holds the
official SDK's :class:`mcp.Client` open (stdio subprocess or Streamable HTTP) and keeps
it that way:

- connect and ``tools/list`` within ``connect_timeout``; on success the tools are
  published to the catalog (pushed to sessions, SPEC C3);
- ``notifications/tools/list_changed`` lists again and republishes when any field
  toolbus derives from the listing changed (SPEC M2, C3); every ``health_interval`` a
  ``tools/list`` probes the server; a failed listing keeps the tools and the
  connection and is retried with backoff (:mod:`gateway.mcp.watch`);
- a dead connection is noticed at once (:mod:`gateway.mcp.transport`): a stdio server
  whose output ends, an HTTP transport that failed, a request refused below JSON-RPC
  (HTTP 404 for the session after a restart of the server);
- when the connection is lost the tools stay in the catalog but answer a typed
  ``unavailable`` (SPEC M2) while the task reconnects (or restarts the subprocess)
  with exponential backoff from ``backoff_initial`` to ``backoff_max`` seconds.

Calls (:meth:`MountedServer.call`, :func:`gateway.mcp.calls.call_tool`) run on the
caller's task: cancelling it (``call.cancel``, ``job.cancel``, a timeout) makes the SDK
send ``notifications/cancelled`` (SPEC M3). What the server asks during a call (sampling,
elicitation) is :class:`gateway.mcp.peer.PeerRequests`'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from catalog.mcp_mounts import MountSpec, expand_env
from catalog.model import ToolDef
from gateway.context import ToolContext
from gateway.failures import ToolFailure
from gateway.mcp.calls import Handler, build_tools, call_tool, list_entries
from gateway.mcp.errlog import logged_stdio
from gateway.mcp.peer import Elicit, PeerRequests
from gateway.mcp.transport import describe, http, watched
from gateway.mcp.watch import watch
from protocol.errors import ErrorCode

logger = logging.getLogger("gateway.mcp")

__all__ = ["Elicit", "MountedServer", "describe"]


class MountedServer:
    """The live side of one :class:`~catalog.mcp_mounts.MountSpec` (SPEC M1, M2).

    Args:
        spec: the server's configuration.
        publish: called with this server whenever :attr:`tools` or the connection state
            changed; the caller republishes the catalog.
    """

    def __init__(
        self,
        spec: MountSpec,
        publish: Callable[[MountedServer], None],
        elicit: Elicit | None = None,
    ) -> None:
        self.spec = spec
        self._publish = publish
        self.peer = PeerRequests(spec, elicit, describe)
        """The server's sampling and elicitation requests (SPEC M3)."""
        self.client: Client | None = None
        self.tools: dict[str, ToolDef] = {}
        """toolbus name -> tool, as last listed; kept while the server is down."""
        self.problems: list[str] = []
        """Why listed tools were left out (bad names, bad schemas), for ``toolbus check``."""
        self.last_error: str | None = None
        self.connected = asyncio.Event()
        self.settled = asyncio.Event()
        """Set once the first connection attempt ended (connected and its tools published,
        or failed) and when stopped: job recovery waits for it (SPEC J5, M2)."""
        self.attempts = 0
        self._lost = asyncio.Event()
        self._relist = asyncio.Event()
        self._scope: anyio.CancelScope | None = None
        self._stopped = False

    # -- connecting ----------------------------------------------------------------------

    def _transport(self) -> Any:
        spec = self.spec
        if spec.command is not None:
            params = StdioServerParameters(
                command=spec.command,
                args=list(spec.args),
                env={k: expand_env(v) for k, v in spec.env.items()} or None,
                cwd=spec.cwd,
            )
            return watched(logged_stdio(params, spec.name), self._lost)
        assert spec.url is not None
        headers = {k: expand_env(v) for k, v in spec.headers.items()}
        return watched(http(spec.url, headers, self._lose), self._lost)

    def _client(self) -> Client:
        return Client(
            self._transport(),
            message_handler=self._on_message,
            sampling_callback=self.peer.sampling,
            elicitation_callback=self.peer.elicitation if self.peer.elicit is not None else None,
            client_info=types.Implementation(name="toolbus", version="1"),
            cache=None,
        )

    async def run(self) -> None:
        """Connect, serve, and reconnect with backoff until :meth:`stop` (SPEC M2).

        Stop it with :meth:`stop`, not ``Task.cancel()``: the SDK's stdio clean-up is
        shielded against anyio cancellation only, and a native cancel can leave the
        server's subprocess running.
        """
        try:
            with anyio.CancelScope() as self._scope:
                if not self._stopped:
                    await self._supervise()
        finally:
            self.settled.set()

    def stop(self) -> None:
        """End :meth:`run`: the connection is closed and a subprocess stopped."""
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()

    async def _supervise(self) -> None:
        delay = self.spec.backoff_initial
        while True:
            self._lost.clear()
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of a peer we do not control: retry
                self.last_error = describe(exc)
            finally:
                was_up = self.client is not None
                self.client = None
                self.connected.clear()
            self.attempts += 1
            self.settled.set()
            if was_up:
                delay = self.spec.backoff_initial  # it worked until now: retry soon
            logger.warning(
                "mcp %s: %s; reconnecting in %.1f s",
                self.spec.name,
                self.last_error or "connection lost",
                delay,
            )
            if was_up:
                self._publish(self)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.spec.backoff_max)

    async def _session(self) -> None:
        """One connection, from connect to loss. The connect timeout is an anyio cancel
        scope around the whole ``async with``: the SDK's task groups and its subprocess
        clean-up only unwind correctly under their own kind of cancellation."""
        with anyio.CancelScope() as scope:
            timer = asyncio.get_running_loop().call_later(self.spec.connect_timeout, scope.cancel)
            try:
                async with self._client() as client:
                    await self._load(client)
                    timer.cancel()
                    self.client, self.last_error = client, None
                    self.connected.set()
                    logger.info("mcp %s: connected, %d tools", self.spec.name, len(self.tools))
                    self._publish(self)
                    self.settled.set()
                    await self._watch(client)
            finally:
                timer.cancel()
        if scope.cancelled_caught:
            raise TimeoutError

    async def probe(self) -> None:
        """Connect once, list the tools into :attr:`tools` and :attr:`problems`, and
        disconnect (``toolbus check``, SPEC M1).

        Raises:
            TimeoutError: no answer within ``connect_timeout``.
            Exception: whatever connecting raised (see :func:`describe`).
        """
        with anyio.fail_after(self.spec.connect_timeout):
            async with self._client() as client:
                await self._load(client)

    async def _watch(self, client: Client) -> None:
        """Until the connection is lost (SPEC M2; :func:`gateway.mcp.watch.watch`)."""
        await watch(client, self.spec, self._lost, self._relist, self._refresh)
        self.last_error = self.last_error or "the server closed the connection"

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._relist.set()  # listed by _watch: never call the server from here

    # -- tools ---------------------------------------------------------------------------

    async def _load(self, client: Client) -> None:
        self.tools, self.problems = self.build(await list_entries(client))

    async def _refresh(self, client: Client) -> None:
        """List again and republish when anything toolbus derives from the listing
        changed (SPEC M2, C3); a failed listing raises and keeps :attr:`tools`."""
        before = self.tools
        await self._load(client)
        if _listed(self.tools) != _listed(before):
            logger.info("mcp %s: tools changed, %d now", self.spec.name, len(self.tools))
            self._publish(self)

    def build(self, entries: list[dict[str, Any]]) -> tuple[dict[str, ToolDef], list[str]]:
        """toolbus tools from ``tools/list`` entries (SPEC M1; :func:`build_tools`)."""
        return build_tools(self.spec, entries, self._handler)

    def _handler(self, mcp_name: str) -> Handler:
        async def call_mcp_tool(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
            return await self.call(mcp_name, params, ctx)

        return call_mcp_tool

    async def call(self, mcp_name: str, params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Call the MCP tool ``mcp_name`` (SPEC M3); ``params`` are already validated (I4).

        Returns:
            The result object of :func:`gateway.mcp.mapping.to_result`.

        Raises:
            ToolFailure: ``unavailable`` when the server is not connected or the
                connection is lost during the call (SPEC M2); ``handler_error`` with
                the server's text for ``isError``, with the MCP error for a JSON-RPC
                error, or naming a malformed result (SPEC M3; :func:`call_tool`).
        """
        client = self.client
        if client is None or self._lost.is_set():
            raise ToolFailure(ErrorCode.UNAVAILABLE, self._down_text())
        return await call_tool(
            client, self.peer, mcp_name, params, ctx, self._lose, self._lost.is_set
        )

    def _lose(self, why: str = "the connection was lost during a call") -> None:
        """The connection is dead (a call saw it close, or the HTTP transport saw a
        request refused below JSON-RPC): the supervisor reconnects now (SPEC M2). Not
        while connecting: a refusal then fails the attempt itself, or is the SDK's own
        fallback (a 404 to ``server/discover``)."""
        if self.client is not None and not self._lost.is_set():
            self.last_error = why
            self._lost.set()

    def _down_text(self) -> str:
        why = f" ({self.last_error})" if self.last_error else ""
        return f"MCP server {self.spec.name!r} is not connected{why}; it is being reconnected"

    def status(self) -> Mapping[str, Any]:
        """For ``toolbus check`` and logs: state, tools, problems, last error."""
        return {
            "connected": self.client is not None,
            "tools": sorted(self.tools),
            "problems": list(self.problems),
            "error": self.last_error,
        }


def _listed(tools: Mapping[str, ToolDef]) -> dict[str, tuple[Any, ...]]:
    """Every field of each tool but its handler (a new closure per listing): any change
    of what toolbus derives from ``tools/list`` is a change (SPEC M1, M2, C3)."""
    return {
        name: tuple(getattr(tool, f.name) for f in dataclasses.fields(tool) if f.name != "func")
        for name, tool in tools.items()
    }
