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

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from catalog.errors import CatalogError
from catalog.exports import catalog_version, tool_info
from catalog.loader import load_catalog
from catalog.model import Catalog
from catalog.params import ParamValidator, validators_for
from catalog.visibility import Scope, visible_tools
from gateway.session import Session
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


class CatalogState:
    """The loaded catalog plus what sessions were shown (SPEC C3).

    Args:
        tool_paths: tools YAML files or folders.
        profile_paths: profiles YAML files or folders.

    Raises:
        CatalogError: at construction, when the files do not load (SPEC C1).
    """

    def __init__(self, tool_paths: Sequence[Path], profile_paths: Sequence[Path]) -> None:
        self.tool_paths = list(tool_paths)
        self.profile_paths = list(profile_paths)
        self._stamps = _mtimes(self.tool_paths + self.profile_paths)
        self.current: Catalog = load_catalog(self.tool_paths, self.profile_paths)
        self.validators: Mapping[str, ParamValidator] = validators_for(self.current)

    def view(self, session: Session) -> tuple[str, list[m.ToolInfo], frozenset[str]]:
        """A session's catalog now: ``(version, tools, names)`` (SPEC C3)."""
        tools = visible_tools(self.current, session.profile, Scope(session.context, session.origin))
        infos = [m.ToolInfo(**tool_info(tool)) for tool in tools]
        return catalog_version(tools), infos, frozenset(t.name for t in tools)

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
        session.emit(m.Catalog, id=request_id, version=version, reason=reason, tools=infos)
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
        self.current, self.validators = fresh, validators_for(fresh)
        logger.info("catalog reloaded: %d tools", len(fresh.tools))
        return True

    async def watch(self, interval: float, sessions: Callable[[], Iterable[Session]]) -> None:
        """Poll for changes every ``interval`` seconds; re-push catalogs on reload."""
        while True:
            await asyncio.sleep(interval)
            if self.reload():
                for session in list(sessions()):
                    self.refresh_profile(session)
                    self.push(session, m.CatalogReason.RELOAD)
