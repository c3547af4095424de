"""The ``toolbus`` command (SPEC O1): serve, check, catalog, schema, token."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest
import yaml
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.auth import hash_token
from gateway.cli import main
from tests.support import spawn_serve

ROOT = Path(__file__).resolve().parents[2]


def test_check_ok(capsys: pytest.CaptureFixture[str]) -> None:
    """SPEC O1/C1: `toolbus check` validates the bundled catalog."""
    assert main(["check"]) == 0
    assert capsys.readouterr().out == "ok: 10 tools, 4 profiles\n"


def test_check_reports_every_issue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SPEC O1/C1: a broken catalog exits 1 and names the file and the tool."""
    tools = tmp_path / "tools.yaml"
    tools.write_text(
        "tools:\n  - name: broken\n    description: x\n    capability: c\n    mode: sync\n"
        "    handler: nowhere.at_all:fn\n    parameters: {type: object}\n"
    )
    config = tmp_path / "toolbus.yaml"
    config.write_text(yaml.safe_dump({"catalog": {"tools": [str(tools)], "profiles": []}}))
    assert main(["check", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert str(tools) in err
    assert "broken" in err
    assert "nowhere.at_all" in err


@pytest.mark.parametrize("fmt", ["wire", "openai-realtime", "openai-chat", "anthropic", "mcp"])
def test_catalog_formats(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    """SPEC C4/O1: every export format prints the profile's filtered catalog as JSON."""
    assert main(["catalog", "--profile", "readonly", "--format", fmt]) == 0
    out = json.loads(capsys.readouterr().out)
    tools = out["tools"] if fmt == "wire" else out
    names = {t.get("name") or t.get("function", {}).get("name") for t in tools}
    assert "notes_delete" not in names
    assert "notes_list" in names


def test_catalog_context_shows_scoped_tool(capsys: pytest.CaptureFixture[str]) -> None:
    """SPEC C1/C4: a project-scoped tool appears only with its context key."""
    assert main(["catalog", "--profile", "demo"]) == 0
    assert "project_summary" not in capsys.readouterr().out
    assert main(["catalog", "--profile", "demo", "--context", "project_id=p1"]) == 0
    assert "project_summary" in capsys.readouterr().out


def test_catalog_unknown_profile(capsys: pytest.CaptureFixture[str]) -> None:
    """SPEC C2/O1: an unknown profile is an error listing the known ones."""
    assert main(["catalog", "--profile", "nope"]) == 1
    assert "known: demo, legacy, readonly, voice" in capsys.readouterr().err


def test_schema_check_in_step(capsys: pytest.CaptureFixture[str]) -> None:
    """SPEC layout: `toolbus schema --check` passes on the checked-in schema/."""
    assert main(["schema", "--check", "--out", str(ROOT / "schema")]) == 0


def test_schema_writes_and_detects_drift(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC layout: `toolbus schema` writes the files; a changed or stale file is drift."""
    out = tmp_path / "schema"
    assert main(["schema", "--out", str(out)]) == 0
    assert main(["schema", "--check", "--out", str(out)]) == 0
    (out / "messages" / "invoke.json").write_text("{}")
    (out / "stale.json").write_text("{}")
    capsys.readouterr()
    (out / "messages" / "welcome.json").unlink()
    assert main(["schema", "--check", "--out", str(out)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert sorted(err) == sorted(
        [
            f"differs: {out / 'messages' / 'invoke.json'}",
            f"missing: {out / 'messages' / 'welcome.json'}",
            f"not generated: {out / 'stale.json'}",
        ]
    )


def test_schema_check_names_a_missing_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`toolbus schema --check` run outside the repository (no ./schema) says so in one
    line, instead of a line of drift per file."""
    assert main(["schema", "--check", "--out", str(tmp_path / "schema")]) == 1
    assert capsys.readouterr().err == (
        f"toolbus schema --check: no folder {tmp_path / 'schema'} here (run it in the "
        "repository root, or give --out)\n"
    )


def test_token_mints_hash_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SPEC S2: `toolbus token` prints the token once; the file keeps only its hash."""
    path = tmp_path / "tokens.yaml"
    assert (
        main(["token", "--user", "ana", "--profiles", "demo,voice", "--token-file", str(path)]) == 0
    )
    token = capsys.readouterr().out.strip()
    text = path.read_text()
    assert token not in text
    entry = yaml.safe_load(text)["tokens"][0]
    assert entry == {"sha256": hash_token(token), "user": "ana", "profiles": ["demo", "voice"]}


def test_s2_c2_token_refuses_a_profile_the_catalog_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC S2, C2: a typo in `--profiles` is refused before the file is touched (a
    session of that profile would get an empty catalog); `--any-profile` mints it
    anyway, without loading the catalog."""
    path = tmp_path / "tokens.yaml"
    argv = ["token", "--user", "ana", "--profiles", "demo,vocie,x", "--token-file", str(path)]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        "toolbus token: unknown profiles 'vocie', 'x'; the catalog has: demo, legacy, "
        "readonly, voice (--any-profile mints it anyway)\n"
    )
    assert not path.exists()
    assert main(["token", "--user", "ana", "--profiles", ",", "--token-file", str(path)]) == 1
    assert capsys.readouterr().err == "toolbus token: --profiles names no profile\n"
    assert main([*argv, "--any-profile"]) == 0
    token = capsys.readouterr().out.strip()
    entry = yaml.safe_load(path.read_text())["tokens"][0]
    assert entry == {"sha256": hash_token(token), "user": "ana", "profiles": ["demo", "vocie", "x"]}


def test_s2_c2_token_checks_the_configured_catalog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC S2, C2: with `--config`, the profiles are those of that config's catalog."""
    (tmp_path / "tools.yaml").write_text("tools: []\n")
    (tmp_path / "profiles.yaml").write_text("profiles:\n  ops: {capabilities: []}\n")
    config = tmp_path / "toolbus.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "catalog": {
                    "tools": [str(tmp_path / "tools.yaml")],
                    "profiles": [str(tmp_path / "profiles.yaml")],
                }
            }
        )
    )
    path = tmp_path / "tokens.yaml"
    base = ["token", "--config", str(config), "--user", "ana", "--token-file", str(path)]
    assert main([*base, "--profiles", "demo"]) == 1
    assert capsys.readouterr().err == (
        "toolbus token: unknown profile 'demo'; the catalog has: ops "
        "(--any-profile mints it anyway)\n"
    )
    assert main([*base, "--profiles", "ops"]) == 0
    assert yaml.safe_load(path.read_text())["tokens"][0]["profiles"] == ["ops"]


async def test_serve_prints_url_and_token_then_drains(tmp_path: Path) -> None:
    """SPEC O1/S4: `toolbus serve` prints URL and dev token; SIGTERM drains with 1012."""
    env = {**os.environ, "TOOLBUS_CATALOG__HOT_RELOAD": "false"}
    proc = await spawn_serve(
        "--port", "0", "--data-dir", str(tmp_path / "data"), cwd=tmp_path, env=env
    )
    try:
        await _serve_session(proc, tmp_path)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _serve_session(proc: asyncio.subprocess.Process, tmp_path: Path) -> None:
    assert proc.stdout is not None
    async with asyncio.timeout(30):
        first = (await proc.stdout.readline()).decode()
        await proc.stdout.readline()
        token_line = (await proc.stdout.readline()).decode()
    url = first.split()[3]
    assert url.startswith("ws://127.0.0.1:")
    token = token_line.rsplit(" ", 1)[1].strip()
    assert (tmp_path / "data" / "dev-token").read_text().strip() == token
    async with connect(url, subprotocols=["toolbus.v1"]) as ws:  # type: ignore[list-item]
        await ws.send(json.dumps({"type": "hello", "token": token, "profile": "demo"}))
        async with asyncio.timeout(10):
            welcome = json.loads(await ws.recv())
            assert welcome["type"] == "welcome"
            assert welcome["user"] == "dev"
            proc.send_signal(signal.SIGTERM)
            kinds = await _until_closed(ws)
        assert kinds[-1] == "reconnect"
        assert ws.close_code == 1012
    async with asyncio.timeout(30):
        assert await proc.wait() == 0


async def test_s2_serve_on_every_interface_names_the_origins_a_page_needs(
    tmp_path: Path,
) -> None:
    """SPEC S2, O1: on 0.0.0.0 the banner lists the origins allowed and says that a page
    from another machine needs server.origins; such a page's upgrade is refused 403 until
    its origin is listed, and the loopback banner has no such line."""
    # PYTHONPATH: the code of this tree, not the editable install, from another folder.
    env = {**os.environ, "TOOLBUS_CATALOG__HOT_RELOAD": "false", "PYTHONPATH": str(ROOT)}
    data = ["--port", "0", "--data-dir", str(tmp_path / "data")]
    page = "http://192.0.2.7:8765"
    for host, origins, expected in [
        ("0.0.0.0", None, 5),
        ("0.0.0.0", f'["{page}"]', 4),
        ("127.0.0.1", None, 4),
    ]:
        run_env = env if origins is None else {**env, "TOOLBUS_SERVER__ORIGINS": origins}
        proc = await spawn_serve("--host", host, *data, cwd=tmp_path, env=run_env)
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(30):
                lines = [(await proc.stdout.readline()).decode() for _ in range(4)]
            port = int(lines[0].split()[3].rsplit(":", 1)[1].rstrip("/"))
            url = f"ws://127.0.0.1:{port}/"
            if origins is not None:
                assert lines[3] == f"browser origins allowed: {page}\n"
                async with connect(url, origin=page, subprotocols=["toolbus.v1"]):  # type: ignore[arg-type, list-item]
                    pass
                continue
            own = [f"http://{h}:{port}" for h in sorted({host, "127.0.0.1", "localhost"})]
            assert lines[3] == f"browser origins allowed: {', '.join(own)}\n"
            if expected == 5:
                async with asyncio.timeout(30):
                    lines.append((await proc.stdout.readline()).decode())
                assert lines[4] == (
                    "serving on 0.0.0.0: a page loaded from another machine gets its "
                    "WebSocket refused 403 (origin not allowed) until server.origins lists "
                    "the page's origin, e.g. TOOLBUS_SERVER__ORIGINS="
                    f"'[\"http://HOST:{port}\"]' (HOST: the address in the browser's "
                    "address bar)\n"
                )
                with pytest.raises(InvalidStatus) as refused:
                    async with connect(url, origin=page, subprotocols=["toolbus.v1"]):  # type: ignore[arg-type, list-item]
                        pass
                assert refused.value.response.status_code == 403
        finally:
            proc.kill()
            await proc.wait()


async def _until_closed(ws: ClientConnection) -> list[str]:
    """The types of the messages received until the server closes the connection."""
    kinds: list[str] = []
    try:
        while True:
            kinds.append(json.loads(await ws.recv())["type"])
    except ConnectionClosed:
        return kinds


def test_config_mistake_from_the_environment_names_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC O4: a bad value set by an environment variable names the variable, not only
    the file (which may not even hold the key)."""
    config = tmp_path / "toolbus.yaml"
    config.write_text("catalog: {tools: []}\n")
    monkeypatch.setenv("TOOLBUS_SERVER__PORT", "abc")
    assert main(["check", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"{config}: 1 problem(s):\n"
        "  server.port: Input should be a valid integer, unable to parse string as an "
        "integer (from TOOLBUS_SERVER__PORT)\n"
    )


def test_o4_misspelt_section_in_a_variable_is_refused_like_a_misspelt_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC O4: TOOLBUS_SEVER__PORT (a section typo) is refused naming the variable and the
    closest section, as TOOLBUS_SERVER__PROT (a key typo) is; neither is ignored."""
    config = tmp_path / "toolbus.yaml"
    config.write_text("catalog: {tools: []}\n")
    monkeypatch.setenv("TOOLBUS_SEVER__PORT", "9000")
    assert main(["check", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"{config}: 1 problem(s):\n"
        "  sever: unknown key (did you mean server?) (from TOOLBUS_SEVER__PORT)\n"
    )
    monkeypatch.delenv("TOOLBUS_SEVER__PORT")
    monkeypatch.setenv("TOOLBUS_SERVER__PROT", "9000")
    assert main(["check", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"{config}: 1 problem(s):\n"
        "  server.prot: unknown key (did you mean port?) (from TOOLBUS_SERVER__PROT)\n"
    )


def test_config_mistakes_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SPEC O4: a misspelt key in the config file is reported with the file and the key,
    not as a traceback; exit status 2."""
    config = tmp_path / "toolbus.yaml"
    config.write_text("sever: {port: 1}\ncatalog: {tools: []}\n")
    assert main(["check", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"{config}: 1 problem(s):\n  sever: unknown key (did you mean server?)\n"
    )
    assert main(["check", "--config", str(tmp_path / "absent.yaml")]) == 2
    assert capsys.readouterr().err == f"{tmp_path / 'absent.yaml'}: no such file\n"


def test_o5_check_notes_a_token_for_a_profile_the_catalog_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC O5, C2: `toolbus check` names a token-file entry whose profile the catalog
    lacks (its sessions would get no tools), as a note: the check still passes."""
    path = tmp_path / "tokens.yaml"
    assert main(["token", "--user", "ana", "--profiles", "demo", "--token-file", str(path)]) == 0
    argv = ["token", "--user", "bo", "--profiles", "voice,vocie", "--any-profile"]
    assert main([*argv, "--token-file", str(path)]) == 0
    capsys.readouterr()
    config = tmp_path / "toolbus.yaml"
    config.write_text(yaml.safe_dump({"auth": {"token_file": str(path)}}))
    assert main(["check", "--config", str(config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("note: token file")] == [
        f"note: token file {path}: tokens.1 (user bo): profile 'vocie' is not in the "
        "catalog; its sessions would get no tools"
    ]
