"""The server's current catalog, its hot reload, and per-session catalog pushes (SPEC C3, S5).

One :class:`CatalogState` per server holds the loaded :class:`~catalog.model.Catalog`
and a compiled parameter validator per tool. :meth:`CatalogState.push` computes a
session's visible catalog with :func:`catalog.visibility.visible_tools` (the same gate
the pipeline re-checks, SPEC I2) and emits it when its version differs from what the
session last saw. :meth:`CatalogState.watch` polls the files' modification times and,
on a change that loads cleanly, swaps the catalog and re-pushes to every session; a
change that fails to load is logged with every issue and the old catalog stays.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

from catalog.errors import CatalogError
from catalog.exports import catalog_version, tool_info
from catalog.loader import load_catalog
from catalog.model import Catalog, ToolDef
from catalog.params import ParamValidator, validators_for
from catalog.visibility import Scope, visible_tools
from gateway.catalog_fit import CatalogTooLarge, check_fits
from gateway.session import Session
from gateway.tasks import periodic
from protocol import messages as m

logger = logging.getLogger("gateway.catalog")


def _files(paths: Sequence[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml")))
        else:
            found.append(path)
    return found


def _mtimes(paths: Sequence[Path]) -> dict[Path, float]:
    stamps: dict[Path, float] = {}
    for path in _files(paths):
        try:
            stamps[path] = path.stat().st_mtime_ns
        except OSError:
            stamps[path] = -1
    return stamps


VIEWS = 256
"""Sets of visible tools whose catalog version :meth:`CatalogState.view` keeps, per
catalog (profiles times the visibility scopes in use; past it versions are made
anew)."""


class CatalogState:
    """The loaded catalog plus what sessions were shown (SPEC C3).

    Args:
        tool_paths: tools YAML files or folders.
        profile_paths: profiles YAML files or folders.
        max_frame: the announced ``max_message_bytes``; every profile's ``catalog``
            frame must fit it (SPEC E2, :mod:`gateway.catalog_fit`). ``None``: no bound.

    Raises:
        CatalogError: at construction, when the files do not load (SPEC C1).
        CatalogTooLarge: at construction, when a profile's catalog frame exceeds
            ``max_frame`` (one line per profile, naming both sizes).
    """

    def __init__(
        self,
        tool_paths: Sequence[Path],
        profile_paths: Sequence[Path],
        max_frame: int | None = None,
    ) -> None:
        self.tool_paths = list(tool_paths)
        self.profile_paths = list(profile_paths)
        self.max_frame = max_frame
        self._stamps = _mtimes(self.tool_paths + self.profile_paths)
        self.current: Catalog = load_catalog(self.tool_paths, self.profile_paths)
        check_fits(self.current, max_frame)
        self.validators: Mapping[str, ParamValidator] = validators_for(self.current)
        self.files: Catalog = self.current
        """The catalog the files define, without mounted MCP tools (SPEC M1)."""
        self.mounted: dict[str, Mapping[str, ToolDef]] = {}
        """Mounted MCP server name -> its tools now in the catalog (SPEC M1, M2)."""
        self.on_reload: list[Callable[[], None]] = []
        """Called after a reload swapped the catalog (the MCP mounts reconcile, SPEC M2)."""
        self._infos: dict[str, m.ToolInfo] = {}
        """Per tool name, its (frozen) tool info in :attr:`_views_of` (:meth:`view`)."""
        self._versions: dict[tuple[str, ...], str] = {}
        """Per set of visible tool names, the catalog version (:meth:`view`)."""
        self._views_of: Catalog | None = None

    def set_mounted(self, server: str, tools: Mapping[str, ToolDef]) -> None:
        """Replace one mounted MCP server's tools and rebuild :attr:`current` (SPEC M1, M2).

        A mounted tool whose name a file tool (or an earlier server) already has is left
        out and logged: the files always win. An empty mapping removes the server.
        """
        before = self.mounted.get(server)
        if tools:
            self.mounted[server] = tools
        else:
            self.mounted.pop(server, None)
        candidate = self._composed(self.files)
        try:
            check_fits(candidate, self.max_frame)
        except CatalogTooLarge as exc:
            # SPEC E2: a catalog that cannot be sent is never swapped in.
            logger.error("mcp %s: tools left out, the catalog would not fit: %s", server, exc)
            if before is None:
                self.mounted.pop(server, None)
            else:
                self.mounted[server] = before
            return
        self._swap(candidate)

    def _swap(self, catalog: Catalog) -> None:
        self.current = catalog
        self.validators = validators_for(catalog)

    def _composed(self, files: Catalog) -> Catalog:
        """``files`` with the mounted MCP tools added (files win a name clash)."""
        merged: dict[str, ToolDef] = dict(files.tools)
        for server, tools in sorted(self.mounted.items()):
            for name, tool in tools.items():
                if name in merged:
                    logger.error(
                        "mcp %s: tool %s clashes with another tool; left out", server, name
                    )
                    continue
                merged[name] = tool
        return replace(files, tools=MappingProxyType(dict(sorted(merged.items()))))

    def view(self, session: Session) -> tuple[str, list[m.ToolInfo], frozenset[str]]:
        """A session's catalog now: ``(version, tools, names)`` (SPEC C3).

        Which tools a session sees is decided for each session (profile, context,
        origin); what they look like is not. Each tool's info is made once per catalog
        and shared by every session that sees the tool (memory: one copy of the
        catalog, whatever the scopes clients pick); the version of a set of tools is
        kept for :data:`VIEWS` sets at most. Both were made at every ``hello`` before,
        about two thirds of its server time.
        """
        current = self.current
        tools = visible_tools(current, session.profile, Scope(session.context, session.origin))
        names = tuple(tool.name for tool in tools)
        if self._views_of is not current:
            self._infos, self._versions, self._views_of = {}, {}, current
        shown: list[m.ToolInfo] = []
        for tool in tools:
            info = self._infos.get(tool.name)
            if info is None:
                info = self._infos[tool.name] = m.ToolInfo(**tool_info(tool))
            shown.append(info)
        version = self._versions.get(names)
        if version is None:
            version = catalog_version(tools)
            if len(self._versions) < VIEWS:
                self._versions[names] = version
        return version, shown, frozenset(names)

    def push(
        self,
        session: Session,
        reason: m.CatalogReason,
        *,
        force: bool = False,
        request_id: str | None = None,
    ) -> bool:
        """Emit the session's catalog when it changed, or always with ``force``.

        Returns:
            Whether a ``catalog`` event was emitted.
        """
        version, infos, names = self.view(session)
        if not force and version == session.catalog_version:
            return False
        session.catalog_version, session.catalog_names = version, names
        session.emit(m.Catalog(id=request_id, version=version, reason=reason, tools=infos))
        session.save()
        return True

    def refresh_profile(self, session: Session) -> None:
        """Re-read the session's profile from the current catalog (after a reload)."""
        session.profile = self.current.profile(session.profile.name)

    def reload(self) -> bool:
        """Load the files again if any changed (SPEC C3 hot reload).

        Returns:
            ``True`` when a new catalog was loaded and swapped in.
        """
        stamps = _mtimes(self.tool_paths + self.profile_paths)
        if stamps == self._stamps:
            return False
        self._stamps = stamps
        try:
            fresh = load_catalog(self.tool_paths, self.profile_paths)
        except CatalogError as exc:
            logger.error("catalog reload failed; keeping the previous catalog: %s", exc)
            return False
        candidate = self._composed(fresh)
        try:
            check_fits(candidate, self.max_frame)
        except CatalogTooLarge as exc:
            # SPEC E2: a catalog frame larger than the announced size cannot be sent.
            logger.error("catalog reload refused; keeping the previous catalog: %s", exc)
            return False
        self.files = fresh
        self._swap(candidate)
        logger.info("catalog reloaded: %d tools", len(fresh.tools))
        for listener in self.on_reload:
            listener()
        return True

    async def watch(self, interval: float, sessions: Callable[[], Iterable[Session]]) -> None:
        """Poll for changes every ``interval`` seconds; re-push catalogs on reload.

        A round that raises is logged and retried with backoff (:func:`periodic`): the
        watcher never stops for good on one fault (SPEC C3)."""
        await periodic("catalog hot reload", interval, lambda: self._reload_and_push(sessions))

    def _reload_and_push(self, sessions: Callable[[], Iterable[Session]]) -> None:
        if self.reload():
            for session in list(sessions()):
                self.refresh_profile(session)
                self.push(session, m.CatalogReason.RELOAD)
