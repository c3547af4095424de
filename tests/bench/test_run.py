"""``python -m bench.run`` outside the dev extras (docs/bench.md "Run")."""

from __future__ import annotations

import pytest

from bench import run


def test_without_the_dev_extras_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing dev extra ends the run at once with exit 2 and the pip line to run, not a
    PackageNotFoundError traceback after the benchmarks."""
    monkeypatch.setattr(run, "DEV_EXTRAS", ("pytest", "toolbus-no-such-dist"))
    assert run.missing_extras() == ["toolbus-no-such-dist"]
    assert run.main(["--quick"]) == 2
    assert capsys.readouterr().err == (
        "bench: toolbus-no-such-dist not installed: the benchmarks need the dev extras; "
        'from the clone run pip install -e ".[dev]" (scripts/check installs them)\n'
    )
