"""examples/voice/mint_key.py when OpenAI cannot give a secret (SPEC V3): one clear line
on stderr and exit 1, never a traceback or the key. A real HTTP server on 127.0.0.1
stands in for OpenAI (the script's URL is pointed at it)."""

from __future__ import annotations

import http.server
import importlib.util
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "voice"
PATH = "/v1/realtime/client_secrets"


def _mint() -> ModuleType:
    spec = importlib.util.spec_from_file_location("voice_mint_key", EXAMPLES / "mint_key.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Fake(http.server.BaseHTTPRequestHandler):
    """Answers every POST with the class's ``status`` and ``body``; records headers."""

    status = 200
    body = b""
    seen: list[str | None] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append(self.headers["Authorization"])
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_openai() -> Iterator[tuple[str, type[Fake]]]:
    handler = type("Handler", (Fake,), {"seen": []})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _run(
    mint: ModuleType, host: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    monkeypatch.setattr(mint, "CLIENT_SECRETS_URL", f"http://{host}{PATH}")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    code = mint.main([])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_unreachable_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC V3: no network (here: a closed port) prints one line naming the host, exit 1
    (it was a raw URLError traceback)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        host = f"127.0.0.1:{probe.getsockname()[1]}"
    result = _run(_mint(), host, monkeypatch, capsys)
    assert result == (1, "", f"mint_key: cannot reach {host}: Connection refused\n")


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (401, b'{"error": {"message": "sk-x"}}', "refused the request: HTTP 401 Unauthorized"),
        (200, b"<html>proxy</html>", "answered without an ek_ client secret"),
        (200, b'{"value": "sk-oops"}', "answered without an ek_ client secret"),
    ],
)
def test_refusal_or_bad_answer_is_one_line(
    fake_openai: tuple[str, type[Fake]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    status: int,
    body: bytes,
    message: str,
) -> None:
    """SPEC V3: an HTTP error status or an answer without a secret is one line naming
    the host, exit 1, without the key or the answer's text."""
    host, handler = fake_openai
    handler.status, handler.body = status, body
    assert _run(_mint(), host, monkeypatch, capsys) == (1, "", f"mint_key: {host} {message}\n")
    assert handler.seen == ["Bearer sk-x"]


def test_secret_printed(
    fake_openai: tuple[str, type[Fake]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SPEC V3: a good answer prints only the ek_ secret, exit 0."""
    host, handler = fake_openai
    handler.status, handler.body = 200, b'{"value": "ek_abc", "expires_at": 1}'
    assert _run(_mint(), host, monkeypatch, capsys) == (0, "ek_abc\n", "")
