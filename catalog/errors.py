"""Load errors of the catalog (SPEC C1).

Loading never stops at the first problem: every problem found in every file becomes a
:class:`LoadIssue`, and :class:`CatalogError` carries them all, so one ``toolbus check``
run shows everything to fix.

Exception tree::

    CatalogError        the catalog or profile files are invalid; nothing was loaded
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from catalog.mcp_mounts import MountSpec


@dataclass(frozen=True, slots=True)
class LoadIssue:
    """One problem in the catalog or profile files (SPEC C1).

    Attributes:
        file: the file (or in-memory source label) the problem is in.
        tool: the tool or profile concerned (``profile:NAME`` for profiles), or ``None``
            for a file-level problem.
        message: what is wrong, naming the key when there is one.
    """

    file: str
    tool: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.tool}" if self.tool is not None else self.file
        return f"{where}: {self.message}"


class CatalogError(Exception):
    """The catalog could not be loaded; :attr:`issues` lists every problem (SPEC C1).

    Args:
        issues: every problem found, in file order; at least one.
        mounts: the MCP server mounts that parsed (SPEC M1), so ``toolbus check`` can
            still probe them and list their problems in the same run (SPEC O5).
    """

    def __init__(self, issues: list[LoadIssue], mounts: tuple[MountSpec, ...] = ()) -> None:
        self.issues: list[LoadIssue] = list(issues)
        self.mounts = mounts
        super().__init__(self._render())

    def _render(self) -> str:
        count = len(self.issues)
        header = f"{count} catalog issue{'s' if count != 1 else ''}"
        return "\n".join([header + ":", *(f"  {issue}" for issue in self.issues)])

    def __str__(self) -> str:
        return self._render()


def unknown_key(key: str, allowed: Iterable[str]) -> str:
    """The issue text for a misspelt key, with the closest allowed key when one is near.

    Returns:
        e.g. ``"timout: unknown key (did you mean timeout?); allowed: a, b, ..."``.
    """
    names = sorted(allowed)
    return f"{key}: unknown key{did_you_mean(key, names)}; allowed: {', '.join(names)}"


def did_you_mean(key: str, allowed: Iterable[str]) -> str:
    """``" (did you mean NAME?)"`` with the allowed name closest to ``key``, or ``""``."""
    close = difflib.get_close_matches(key, sorted(allowed), n=1)
    return f" (did you mean {close[0]}?)" if close else ""
