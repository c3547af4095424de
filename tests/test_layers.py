"""The layering rules hold: `lint-imports` keeps every contract in pyproject.toml (STYLE).

The contracts (``[tool.importlinter]``): ``protocol/`` is sans-I/O (no asyncio,
websockets, socket, time, threading, selectors, gateway); ``catalog/`` imports no
gateway, asyncio, websockets, socket, time or threading; the ``toolbus/`` client does
not import ``gateway``; only ``protocol/codec.py`` (and
``protocol/jsonschema.py``, which writes ``schema/``) imports orjson; only
``gateway/wslib.py`` imports websockets in ``gateway/`` (the library seam).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``lint-imports`` (from the dev extras, beside this Python) in ``cwd``."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_import_contracts_are_kept() -> None:
    """STYLE layout: all five import contracts hold for the real packages."""
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Contracts: 5 kept, 0 broken." in run.stdout


FAKE_TREE = {
    "protocol/__init__.py": "",
    "protocol/clock.py": "def now():\n    import time\n    return time.time()\n",
    "protocol/shell.py": "from gateway import server\n",
    "protocol/codec.py": "import orjson\n",
    "protocol/jsonschema.py": "import orjson\n",
    "catalog/__init__.py": "",
    "catalog/run.py": "import asyncio.tasks\n",
    "gateway/__init__.py": "",
    "gateway/server.py": "import orjson\n",
    "gateway/wslib.py": "import websockets.asyncio.server\n",
    "gateway/hello.py": "from websockets.asyncio.server import ServerConnection\n",
    "toolbus/__init__.py": "",
    "toolbus/cheat.py": "import gateway.server\n",
}


def test_contracts_catch_violations(tmp_path: Path) -> None:
    """STYLE layout: nested, from-, dotted and third-party forbidden imports are caught."""
    for name, text in FAKE_TREE.items():
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    run = lint_imports(tmp_path)
    assert run.returncode == 1
    assert "Contracts: 0 kept, 5 broken." in run.stdout
    for edge in (
        "protocol.clock -> time",
        "protocol.shell -> gateway",
        "catalog.run -> asyncio",
        "toolbus.cheat -> gateway.server",
        "gateway.server -> orjson",
        "gateway.hello -> websockets",
    ):
        assert edge in run.stdout, edge
