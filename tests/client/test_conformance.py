"""The conformance suite (tests/conformance/*.yaml) against the real server, and the
script runner's own behaviour on failing scripts (SPEC K3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.server import Gateway
from toolbus import script
from toolbus.script import load_script, match, run_file
from toolbus.script_runner import Missed, _recent

ROOT = Path(__file__).resolve().parents[2]
SUITE = sorted((ROOT / "tests" / "conformance").glob("*.yaml"))
DATA = Path(__file__).resolve().parent / "data"


def test_suite_is_complete() -> None:
    """SPEC K3: the suite holds the cases the protocol promises (handshake ... bad input)."""
    names = {p.stem for p in SUITE}
    assert {
        "handshake",
        "catalog_not_modified",
        "sync_invoke",
        "approval_allow",
        "approval_deny",
        "async_job",
        "resume_replay",
        "bad_malformed_json",
        "bad_unknown_type",
        "bad_invalid_utf8",
    } <= names


@pytest.mark.parametrize("path", SUITE, ids=[p.stem for p in SUITE])
async def test_conformance(gateway: Gateway, path: Path) -> None:
    """SPEC K3: each conformance script passes against the real server."""
    report = await run_file(path, gateway.url)
    assert report.passed, report.render()


async def test_whole_suite_twice_against_one_server(gateway: Gateway) -> None:
    """SPEC K3, I15: the suite runs as a user would (`toolbus run tests/conformance/*.yaml`),
    every file against the one server, twice over: call ids are keys of the user kept
    for a day, so each file makes its own with ``${run}`` and nothing collides."""
    for _ in range(2):
        for path in SUITE:
            report = await run_file(path, gateway.url)
            assert report.passed, report.render()


async def test_failing_expect_is_reported(gateway: Gateway) -> None:
    """SPEC K3: a mismatching expect fails naming step, expected and got; later steps don't run."""
    report = await run_file(DATA / "failing_expect.yaml", gateway.url)
    assert not report.passed
    failure = report.failure
    assert failure is not None
    assert failure.index == 3
    assert failure.kind == "expect"
    assert failure.detail == (
        'timed out after 2.0 s waiting for {"type":"result","call_id":"c1","result":'
        '{"result":42}}; got tool_start | result (/result/result: expected 42, got 1000.0)'
    )
    assert len(report.steps) == 3
    assert report.total == 4
    assert "FAIL step 3 expect" in report.render()


async def test_failing_strict_names_the_message_got(gateway: Gateway) -> None:
    """SPEC K3: strict makes the next message have to match; the report shows that message."""
    report = await run_file(DATA / "failing_strict.yaml", gateway.url)
    failure = report.failure
    assert failure is not None
    assert failure.index == 2
    assert '"type":"catalog"' in failure.detail
    assert "/type" in failure.detail


async def test_failing_close_is_reported(gateway: Gateway) -> None:
    """SPEC K3: expect_close fails when the server answers instead of closing."""
    report = await run_file(DATA / "failing_close.yaml", gateway.url)
    failure = report.failure
    assert failure is not None
    assert failure.kind == "expect_close"
    assert "no close within 1.0 s" in failure.detail
    assert "malformed_json" in failure.detail


async def test_bad_format_is_a_failed_report(gateway: Gateway) -> None:
    """SPEC K3: a script outside the format (here: sleep) fails with file and step named."""
    report = await run_file(DATA / "bad_format.yaml", gateway.url)
    assert not report.passed
    assert report.error is not None
    assert "bad_format.yaml: step 1" in report.error


def test_cli_exit_codes_and_output(gateway_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """SPEC K3: ``toolbus run`` exits 1 when any script fails, printing per-step results."""
    code = script.main([str(DATA / "failing_expect.yaml"), str(SUITE[0]), "--url", gateway_url])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL" in out
    assert "step 3 expect" in out
    assert "1 passed, 1 failed" in out


def test_cli_passes(gateway_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """SPEC K3: ``toolbus run`` exits 0 when every script passes."""
    code = script.main(
        [str(ROOT / "tests" / "conformance" / "sync_invoke.yaml"), "--url", gateway_url]
    )
    assert code == 0, capsys.readouterr().out
    assert "PASS" in capsys.readouterr().out


def test_matchers() -> None:
    """SPEC K3: literal, regex, any, absent, contains, capture and nested subset matching."""
    message = {"type": "result", "seq": 3, "result": {"v": 1.0, "tags": ["a", "b"]}, "ok": True}
    captures: dict[str, object] = {}
    pattern = {
        "type": {"regex": "^res"},
        "seq": {"capture": "s"},
        "result": {"v": 1, "tags": {"contains": "b"}},
        "approval_id": {"absent": True},
        "ok": {"any": True},
    }
    assert match(pattern, message, captures) is None
    assert captures == {"s": 3}
    assert match({"ok": 1}, message, {}) == "/ok: expected 1, got true"
    assert match({"result": {"tags": ["a"]}}, message, {}) is not None
    assert match({"seq": {"absent": True}}, message, {}) == "/seq: expected absent, got 3"


def test_k3_a_failed_expect_names_the_field_that_did_not_match() -> None:
    """SPEC K3: the report of a skipped message shows the mismatching field (path, expected,
    got) however long the message is; the last one of the expected type stays named when
    later messages of other types follow."""
    pattern = {"type": "result", "result": {"rows": [{"id": 7}]}}
    long_result = {"type": "result", "result": {"rows": [{"id": 8, "text": "x" * 300}]}}
    skipped = [
        Missed.of(m, match(pattern, m, {}) or "")
        for m in [long_result, *({"type": "job.progress", "seq": n} for n in range(4))]
    ]
    assert _recent(skipped) == (
        "result (/result/rows/0/id: expected 7, got 8), 1 more, then "
        "job.progress | job.progress | job.progress"
    )
    assert _recent([Missed.of("not json", "/: expected an object")]) == "'not json'"


def test_substitution_keeps_types() -> None:
    """SPEC K3: ``${name}`` alone keeps the captured type; inside text it is formatted in."""
    captures = {"n": 7, "id": "ap-1"}
    assert script.substitute({"a": "${n}", "b": "x-${id}", "c": ["${id}"]}, captures) == {
        "a": 7,
        "b": "x-ap-1",
        "c": ["ap-1"],
    }
    with pytest.raises(script.StepFailed, match="never captured"):
        script.substitute("${nope}", captures)


def test_every_suite_file_loads() -> None:
    """SPEC K3: every conformance file follows the documented format."""
    for path in SUITE:
        assert load_script(path).steps


def test_cli_http_url(gateway_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """SPEC K3: ``toolbus run --url http://...`` fails the script with a line saying a
    ws:// URL is needed, not a traceback."""
    url = gateway_url.replace("ws://", "http://")
    code = script.main([str(SUITE[0]), "--url", url])
    out = capsys.readouterr().out
    assert code == 1
    assert (
        f"  error: {url!r} is not a WebSocket URL: toolbus needs a ws:// or wss:// URL, "
        f"e.g. {gateway_url}\n"
    ) in out
