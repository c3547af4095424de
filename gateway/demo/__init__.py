"""The demo catalog bundled with ``toolbus serve`` (SPEC O1): tools, profiles, handlers.

Load it with ``catalog.load_catalog([TOOLS_PATH], [PROFILES_PATH])``.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOLS_PATH = HERE / "tools.yaml"
PROFILES_PATH = HERE / "profiles.yaml"

__all__ = ["PROFILES_PATH", "TOOLS_PATH"]
