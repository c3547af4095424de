"""Catalog hot reload (SPEC C3): file changes push new catalogs; a broken file changes nothing."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from gateway.config import DEMO_DIR
from tests.support import MS, peer, running, settings_for


def _bump(path: Path, text: str) -> None:
    """Rewrite a file with a modification time clearly after the previous one."""
    stat = path.stat()
    path.write_text(text)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


@pytest.fixture
def catalog_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "catalog"
    folder.mkdir()
    shutil.copy(DEMO_DIR / "tools.yaml", folder / "tools.yaml")
    shutil.copy(DEMO_DIR / "profiles.yaml", folder / "profiles.yaml")
    return folder


async def test_profile_change_pushes_catalog(tmp_path: Path, catalog_dir: Path) -> None:
    """SPEC C3: a profile edit on disk pushes a new catalog (reason reload); the removed tool
    then fails exactly like an unknown tool."""
    profiles = catalog_dir / "profiles.yaml"
    settings = settings_for(
        tmp_path,
        catalog={
            "tools": [catalog_dir / "tools.yaml"],
            "profiles": [profiles],
            "hot_reload": True,
            "reload_interval": 10 * MS,
        },
    )
    async with running(settings) as gw, peer(gw, profile="readonly") as p:
        first = await p.expect("catalog")
        assert "convert_units" in {t["name"] for t in first["tools"]}
        _bump(
            profiles,
            profiles.read_text().replace(
                "  readonly:\n    capabilities: [notes.read, time, units]",
                "  readonly:\n    capabilities: [notes.read, time]",
            ),
        )
        pushed = await p.expect("catalog", reason="reload")
        assert "convert_units" not in {t["name"] for t in pushed["tools"]}
        assert pushed["version"] != first["version"]
        await p.invoke("c1", "convert_units", {"value": 1, "from_unit": "m", "to_unit": "km"})
        error = await p.terminal("c1")
        assert (error["type"], error["code"]) == ("call.error", "unknown_tool")


async def test_broken_reload_keeps_catalog(
    tmp_path: Path, catalog_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SPEC C1/C3: a file that no longer loads is logged with its issues; the old catalog stays."""
    tools = catalog_dir / "tools.yaml"
    settings = settings_for(
        tmp_path,
        catalog={
            "tools": [tools],
            "profiles": [catalog_dir / "profiles.yaml"],
            "hot_reload": False,
        },
    )
    async with running(settings) as gw, peer(gw) as p:
        before = await p.expect("catalog")
        names = set(gw.catalog.current.tools)
        _bump(tools, tools.read_text() + "\n  - name: broken\n    description: no handler\n")
        with caplog.at_level(logging.ERROR, logger="gateway.catalog"):
            assert gw.catalog.reload() is False
        failure = [
            r.getMessage() for r in caplog.records if "catalog reload failed" in r.getMessage()
        ]
        assert len(failure) == 1
        assert "broken" in failure[0]
        assert str(tools) in failure[0]
        assert set(gw.catalog.current.tools) == names
        await p.send({"type": "catalog.get", "id": "q", "version": before["version"]})
        reply = await p.expect("catalog.not_modified", id="q")
        assert reply["version"] == before["version"]
