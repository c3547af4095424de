"""A job row's state changes built field by field (SPEC J3, J4, J6; issue 13, P5).

:meth:`JobRow.at_state` and :meth:`JobRow.ended` stand in for
:func:`dataclasses.replace` on the job path. They list every field themselves, so each
is checked here against ``replace`` on a row whose fields all differ: a field added to
:class:`JobRow` and left out of either method fails these tests (or the constructor).
"""

from __future__ import annotations

import dataclasses

from gateway.store_rows import JobRow


def _row() -> JobRow:
    """A row whose every field holds a value of its own, so a swapped field shows."""
    return JobRow(
        job_id="job_1",
        tool="finish_at",
        state="running",
        session_id="s_1",
        user="alice",
        tenant="acme",
        profile="demo",
        call_id="c1",
        params={"at": 1.5},
        context={"project_id": "p1"},
        created_at=10.0,
        started_at=11.0,
        finished_at=12.0,
        summary="old summary",
        artifacts=[{"uri": "a"}],
        result={"old": True},
        error={"code": "x", "message": "y"},
    )


def test_every_field_is_covered() -> None:
    """The methods below are checked against every field JobRow has."""
    assert len(dataclasses.fields(JobRow)) == 17


def test_j6_at_state_is_replace_of_state_and_start() -> None:
    """SPEC J6: queued again (no start time) and running (a start time)."""
    row = _row()
    for state, started in (("queued", None), ("running", 12.5)):
        moved = row.at_state(state, started)
        assert moved == dataclasses.replace(row, state=state, started_at=started)
        assert dataclasses.astuple(moved) == dataclasses.astuple(
            dataclasses.replace(row, state=state, started_at=started)
        )
    assert row.state == "running"  # the old row is not changed


def test_j4_ended_is_replace_of_the_end_fields() -> None:
    """SPEC J3, J4: done, failed and cancelled rows keep every other field."""
    row = _row()
    ends = {
        "finished_at": 20.0,
        "summary": "finish_at finished",
        "artifacts": [{"uri": "b"}],
        "result": {"t": 20.0},
        "error": None,
    }
    ended = row.ended("done", **ends)
    expected = dataclasses.replace(row, state="done", **ends)
    assert dataclasses.astuple(ended) == dataclasses.astuple(expected)
    assert ended == expected
    assert row.finished_at == 12.0


def test_j4_ended_as_failed_and_cancelled_keeps_what_they_keep() -> None:
    """SPEC J4, J3: ``JobEnd.failed`` and ``JobEnd.cancelled`` pass the row's own
    artifacts and result (and, cancelled, its error) back to ``ended``: the rows equal
    the ``replace`` calls they stand in for."""
    row = _row()
    error = {"code": "handler_error", "message": "boom"}
    failed = row.ended("failed", 20.0, "failed: boom", row.artifacts, row.result, error)
    assert failed == dataclasses.replace(
        row, state="failed", finished_at=20.0, summary="failed: boom", error=error
    )
    cancelled = row.ended("cancelled", 21.0, "cancelled", row.artifacts, row.result, row.error)
    assert cancelled == dataclasses.replace(
        row, state="cancelled", finished_at=21.0, summary="cancelled"
    )
