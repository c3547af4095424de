"""Fixtures of the example tests: a real server on 127.0.0.1 (tests/support.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.server import Gateway
from tests.support import running, settings_for


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    """A real server on 127.0.0.1, port 0, demo catalog, test tokens, data in tmp_path."""
    async with running(settings_for(tmp_path)) as gw:
        yield gw
