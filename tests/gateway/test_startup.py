"""Start-up and configuration (SPEC O4, O5; cases F24, F25), through real ``toolbus``
subprocesses: every reason ``serve`` cannot start is one message naming the cause and
a non-zero exit, never a traceback; ``check`` finds what ``serve`` would refuse; one
server per data folder.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from websockets.asyncio.client import connect

from gateway.cli import main
from tests.support import clean_env, run_toolbus, spawn_serve

TIMEOUT = 60.0
"""Seconds a `toolbus` subprocess may take to exit before the test fails."""

TOOLS = """
tools:
  - name: ping
    description: Answer pong.
    capability: t
    mode: sync
    handler: f24_tools:ping
    parameters: {type: object}
  - name: gate_job
    description: A job that ends once the test creates its gate file.
    capability: t
    mode: async
    handler: f24_tools:gate_job
    parameters:
      type: object
      properties: {gate: {type: string}}
      required: [gate]
"""

HANDLERS = """
import asyncio
from pathlib import Path


def ping(params, ctx):
    return {"pong": True}


async def gate_job(params, ctx):
    gate = Path(params["gate"])
    while not gate.exists():  # the test creates the file once the second serve has exited
        await asyncio.sleep(0.01)
    return {"summary": "gate opened"}
"""


def _folder(tmp_path: Path, **config: object) -> Path:
    """A config folder: toolbus.yaml (port 0, data in ./data, plus ``config``), the
    tools and profiles files and the handler module; returns the config file."""
    (tmp_path / "tools.yaml").write_text(TOOLS)
    (tmp_path / "profiles.yaml").write_text("profiles:\n  p: {capabilities: [t]}\n")
    (tmp_path / "f24_tools.py").write_text(HANDLERS)
    data: dict[str, object] = {
        "data_dir": "data",
        "server": {"port": 0, "heartbeat_interval": 0},
        "catalog": {"tools": ["tools.yaml"], "profiles": ["profiles.yaml"], "hot_reload": False},
    }
    data.update(config)
    path = tmp_path / "toolbus.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _toolbus(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``toolbus ARGS`` to its end (it must not start serving)."""
    return run_toolbus(*args, cwd=cwd, env=clean_env(), timeout=TIMEOUT)


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port some other program is listening on."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder on a small tmpfs remounted read-only: unwritable even for root."""
    mount = tmp_path / "ro"
    mount.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.fail("this test needs root and mount(8) to make a folder really read-only")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def _refused(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert result.stderr == f"toolbus: cannot start: {message}\n"
    assert result.returncode == 1


def _both_refuse(config: Path, cwd: Path, problem: str) -> None:
    """`serve` refuses to start naming ``problem`` (see :func:`_refused`) and `check`
    reports it as its one ``error:`` line, exit 1 (SPEC O5)."""
    _refused(_toolbus("serve", "--config", str(config), cwd=cwd), problem)
    check = _toolbus("check", "--config", str(config), cwd=cwd)
    assert (check.returncode, check.stdout, check.stderr) == (1, "", f"error: {problem}\n")


def test_case_f24_port_in_use(tmp_path: Path, busy_port: int) -> None:
    """SPEC O5, F24: a port in use is named with the key, no traceback, exit 1."""
    config = _folder(tmp_path, server={"port": busy_port})
    result = _toolbus("serve", "--config", str(config), cwd=tmp_path)
    _refused(
        result,
        f"server.port {busy_port}: cannot listen on 127.0.0.1:{busy_port}: address already in use",
    )


def test_case_f24_handler_module_missing(tmp_path: Path) -> None:
    """SPEC O5, C1, F24: a handler module that does not exist names the file and tool;
    `check` reports it too and does not say ok."""
    config = _folder(tmp_path)
    tools = tmp_path / "tools.yaml"
    tools.write_text(TOOLS.replace("f24_tools:ping", "no_such_module:ping"))
    problem = (
        f"{tools}: ping: handler: handler 'no_such_module:ping': importing 'no_such_module' "
        "failed: ModuleNotFoundError: No module named 'no_such_module'"
    )
    _both_refuse(config, tmp_path, problem)


def test_case_f24_handler_module_calls_sys_exit(tmp_path: Path) -> None:
    """SPEC O5, F24: a handler module calling sys.exit(3) at import is a load error of
    that tool (exit 1, not the module's 3); `check` says the same."""
    config = _folder(tmp_path)
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    tools = tmp_path / "tools.yaml"
    tools.write_text(TOOLS.replace("f24_tools:ping", "exits:ping"))
    problem = (
        f"{tools}: ping: handler: handler 'exits:ping': importing 'exits' failed: SystemExit: 3"
    )
    _both_refuse(config, tmp_path, problem)


def test_case_f24_hook_does_not_import(tmp_path: Path) -> None:
    """SPEC O5, I6, F24: a hook path that does not import names the key; `check`
    reports it (it used to say ok)."""
    config = _folder(tmp_path, calls={"pre_hooks": ["f24_tools:ping", "nohooks.here:deny"]})
    problem = (
        "calls.pre_hooks[1]: hook 'nohooks.here:deny' cannot be imported: importing "
        "'nohooks.here' failed: ModuleNotFoundError: No module named 'nohooks'"
    )
    _both_refuse(config, tmp_path, problem)


def test_case_f24_data_folder_is_a_file(tmp_path: Path) -> None:
    """SPEC O5, F24: a data folder that is a file is named as such; `check` too."""
    config = _folder(tmp_path)
    data = tmp_path / "data"
    data.write_text("not a folder\n")
    _both_refuse(config, tmp_path, f"data_dir {data}: is a file, not a folder")
    assert data.read_text() == "not a folder\n"


def test_case_f24_data_folder_unwritable(tmp_path: Path, read_only_dir: Path) -> None:
    """SPEC O5, F24: an unwritable data folder (read-only mount, so root cannot write
    either) is named; nothing is created in it; `check` reports it too."""
    config = _folder(tmp_path, data_dir=str(read_only_dir))
    _both_refuse(config, tmp_path, f"data_dir {read_only_dir}: not writable")
    assert list(read_only_dir.iterdir()) == []


def test_case_f24_data_folder_cannot_be_created(tmp_path: Path, read_only_dir: Path) -> None:
    """SPEC O5, F24: a data folder that would have to be created on a read-only mount."""
    config = _folder(tmp_path, data_dir=str(read_only_dir / "data"))
    # check names it in serve's words: it tries the creation (and undoes it), SPEC O5
    problem = f"data_dir {read_only_dir / 'data'}: cannot create it: Read-only file system"
    _both_refuse(config, tmp_path, problem)


def test_case_f24_every_problem_listed_by_check(tmp_path: Path) -> None:
    """SPEC O5: `check` lists the handler, hook and token-file problems together,
    one ``error:`` line each."""
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tokens:\n  - {user: ana, profiles: [p]}\n")
    config = _folder(
        tmp_path, calls={"post_hooks": ["f24_tools"]}, auth={"token_file": str(tokens)}
    )
    (tmp_path / "tools.yaml").write_text(TOOLS.replace("f24_tools:ping", "gone:ping"))
    check = _toolbus("check", "--config", str(config), cwd=tmp_path)
    assert check.returncode == 1
    assert check.stdout == ""
    assert check.stderr.splitlines() == [
        f"error: {tmp_path / 'tools.yaml'}: ping: handler: handler 'gone:ping': importing "
        "'gone' failed: ModuleNotFoundError: No module named 'gone'",
        "error: calls.post_hooks[0]: hook 'f24_tools' is not 'module:function'",
        f"error: auth.token_file: token file {tokens}: tokens.0.sha256: Field required",
    ]


def test_malformed_token_file_refused_at_start(tmp_path: Path) -> None:
    """SPEC O5, S2: a malformed token file is a start-up error naming the file and the
    entry's key, not a traceback at every hello."""
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tokens:\n  - {sha256: abc, user: ana}\n")
    config = _folder(tmp_path, auth={"token_file": str(tokens)})
    _refused(
        _toolbus("serve", "--config", str(config), cwd=tmp_path),
        f"auth.token_file: token file {tokens}: tokens.0.sha256: String should match "
        "pattern '^[0-9a-fA-F]{64}$'",
    )


def test_store_that_cannot_open_is_one_line(tmp_path: Path) -> None:
    """SPEC O5: a store the server cannot open (here a folder where the SQLite file
    goes) stops start-up with one line naming it, through the generic start-up path."""
    config = _folder(tmp_path)
    (tmp_path / "data" / "toolbus.db").mkdir(parents=True)
    result = _toolbus("serve", "--config", str(config), cwd=tmp_path)
    assert "Traceback" not in result.stderr
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("toolbus:")]
    assert len(lines) == 1
    assert lines[0].startswith("toolbus: cannot start: ")
    assert str(tmp_path / "data" / "toolbus.db") in lines[0]
    assert "unable to open database file" in lines[0]


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("jobs", "max_concurrent", 0, "Input should be greater than or equal to 1"),
        ("jobs", "max_per_session", -1, "Input should be greater than or equal to 1"),
        ("limits", "invoke_rate", -5.0, "Input should be greater than 0"),
        ("limits", "invoke_burst", 0, "Input should be greater than or equal to 1"),
        ("server", "port", -5, "Input should be greater than or equal to 0"),
        ("server", "port", 70000, "Input should be less than or equal to 65535"),
        ("server", "max_message_bytes", 100, "Input should be greater than or equal to 1024"),
        ("calls", "worker_threads", 0, "Input should be greater than or equal to 1"),
        ("calls", "default_timeout", -1.0, "Input should be greater than or equal to 0"),
        ("sessions", "resume_window", -1.0, "Input should be greater than or equal to 0"),
        (
            "log",
            "level",
            "loud",
            "unknown log level 'loud'; one of DEBUG, INFO, WARNING, ERROR, CRITICAL",
        ),
    ],
)
def test_config_out_of_range_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    section: str,
    key: str,
    value: object,
    message: str,
) -> None:
    """SPEC O4: an out-of-range value is refused at start with the key named, exit 2."""
    config = tmp_path / "toolbus.yaml"
    config.write_text(yaml.safe_dump({section: {key: value}}))
    expected = f"{config}: 1 problem(s):\n  {section}.{key}: {message}\n"
    assert main(["check", "--config", str(config)]) == 2
    assert capsys.readouterr().err == expected
    assert main(["serve", "--config", str(config), "--data-dir", str(tmp_path / "d")]) == 2
    assert capsys.readouterr().err == expected
    assert not (tmp_path / "d").exists()


def test_config_out_of_range_from_env_and_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC O4: the same ranges hold for environment overrides and command-line flags."""
    monkeypatch.setenv("TOOLBUS_JOBS__MAX_CONCURRENT", "0")
    assert main(["check"]) == 2
    assert capsys.readouterr().err == (
        "configuration: 1 problem(s):\n"
        "  jobs.max_concurrent: Input should be greater than or equal to 1"
        " (from TOOLBUS_JOBS__MAX_CONCURRENT)\n"
    )
    monkeypatch.delenv("TOOLBUS_JOBS__MAX_CONCURRENT")
    assert main(["serve", "--port", "-5", "--data-dir", str(tmp_path / "d")]) == 2
    assert capsys.readouterr().err == (
        "configuration: 1 problem(s):\n  server.port: Input should be greater than or equal to 0\n"
    )
    assert not (tmp_path / "d").exists()


async def _start_serve(config: Path, cwd: Path) -> tuple[asyncio.subprocess.Process, str, str]:
    """Start `toolbus serve`; return the process, its URL and its dev token."""
    proc = await spawn_serve("--config", str(config), cwd=cwd)
    assert proc.stdout is not None
    async with asyncio.timeout(TIMEOUT):
        url = (await proc.stdout.readline()).decode().split()[3]
        await proc.stdout.readline()
        token = (await proc.stdout.readline()).decode().rsplit(" ", 1)[1].strip()
    return proc, url, token


async def test_case_f25_second_serve_refused_job_untouched(tmp_path: Path) -> None:
    """SPEC O5, F25: with a server running an async job, a second `toolbus serve` on
    the same data folder exits at once naming the folder in use and the first server's
    pid, touches none of its files, and the first server's job ends done."""
    config = _folder(tmp_path)
    data = tmp_path / "data"
    gate = tmp_path / "gate"
    first, url, token = await _start_serve(config, tmp_path)
    procs = [first]
    try:
        async with connect(url, subprotocols=["toolbus.v1"]) as ws:  # type: ignore[list-item]
            await ws.send(json.dumps({"type": "hello", "token": token, "profile": "p"}))
            await ws.send(
                json.dumps(
                    {
                        "type": "invoke",
                        "call_id": "c1",
                        "tool": "gate_job",
                        "params": {"gate": str(gate)},
                    }
                )
            )
            async with asyncio.timeout(TIMEOUT):
                while (frame := json.loads(await ws.recv()))["type"] != "dispatched":
                    pass
            job_id = frame["job_id"]
            files = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in data.iterdir()}
            started = time.monotonic()
            second = await asyncio.to_thread(
                _toolbus, "serve", "--config", str(config), cwd=tmp_path
            )
            took = time.monotonic() - started
            _refused(
                second,
                f"data_dir {data}: the data folder is in use by another toolbus serve "
                f"(pid {first.pid}); stop it or give this one another data_dir",
            )
            # "At once": it never waits on the lock (LOCK_NB); the bound only allows for
            # the interpreter's start on a loaded machine.
            assert took < 30.0, f"the second serve took {took:.1f} s to give up"
            now = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in data.iterdir()}
            for name in ("tokens.yaml", "dev-token", "toolbus.lock"):
                assert now[name] == files[name], f"{name} was rewritten by the second serve"
            gate.touch()
            async with asyncio.timeout(TIMEOUT):
                while (frame := json.loads(await ws.recv()))["type"] != "job.done":
                    pass
            assert frame["job_id"] == job_id
            assert frame["ok"] is True
            assert frame["summary"] == "gate opened"
        first.send_signal(signal.SIGTERM)
        async with asyncio.timeout(TIMEOUT):
            assert await first.wait() == 0
        # The lock went with the first server: a new one starts on the folder.
        procs.append((await _start_serve(config, tmp_path))[0])
        procs[-1].send_signal(signal.SIGTERM)
        async with asyncio.timeout(TIMEOUT):
            assert await procs[-1].wait() == 0
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "server: {port: [\n",
            "not valid YAML: line 2, column 1: expected the node content, but found '<stream end>'",
        ),
        ("- a\n- b\n", "must be a mapping of sections (server:, calls:, …)"),
        ("just text\n", "must be a mapping of sections (server:, calls:, …)"),
    ],
)
def test_config_file_mistakes_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    """SPEC O4, O5: a config file that is not YAML or not a mapping is one line naming
    the file, exit 2, for check and serve alike (they were tracebacks)."""
    config = tmp_path / "toolbus.yaml"
    config.write_text(content)
    for command in ("check", "serve"):
        assert main([command, "--config", str(config)]) == 2
        assert capsys.readouterr().err == f"{config}: {message}\n"


def test_config_folder_and_bad_env_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC O4: a folder given as the config file, and an environment section that does
    not parse, are named without a traceback."""
    assert main(["check", "--config", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"{tmp_path}: is a folder, not a YAML file\n"
    monkeypatch.setenv("TOOLBUS_SERVER", "{")
    assert main(["check"]) == 2
    assert capsys.readouterr().err == (
        "configuration: TOOLBUS_SERVER: not JSON; a mapping is written as JSON here, "
        """e.g. TOOLBUS_SERVER='{"key": 1}'\n"""
    )


@pytest.mark.parametrize("name", ["TOOLBUS_SERVER__ORIGINS", "TOOLBUS_CATALOG__TOOLS"])
def test_o4_a_list_in_the_environment_that_is_not_json_is_named(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC O4: a key holding a list, set from the environment as a bare value (not
    JSON), is named with the form it needs (pydantic-settings names only its section);
    the same value as JSON is taken."""
    monkeypatch.setenv(name, "https://a.example")
    assert main(["check"]) == 2
    assert capsys.readouterr().err == (
        f"configuration: {name}: not JSON; a list is written as JSON here, "
        f"""e.g. {name}='["a", "b"]'\n"""
    )
    monkeypatch.setenv("TOOLBUS_SERVER__ORIGINS", '["https://a.example"]')
    monkeypatch.delenv("TOOLBUS_CATALOG__TOOLS", raising=False)
    assert main(["check"]) == 0


def test_o4_the_bad_list_is_named_not_a_plain_value_set_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC O4: with a plain value set from the environment (``TOOLBUS_DATA_DIR``, a path:
    no JSON wanted) beside a list that is not JSON, the list's variable is named, not the
    path's (whose name sorts first); the path alone is taken."""
    monkeypatch.setenv("TOOLBUS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("TOOLBUS_SERVER__ORIGINS", "https://a.example")
    assert main(["check"]) == 2
    assert capsys.readouterr().err == (
        "configuration: TOOLBUS_SERVER__ORIGINS: not JSON; a list is written as JSON here, "
        """e.g. TOOLBUS_SERVER__ORIGINS='["a", "b"]'\n"""
    )
    monkeypatch.delenv("TOOLBUS_SERVER__ORIGINS")
    assert main(["check"]) == 0


def test_token_refuses_to_extend_a_malformed_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC S2, O5: `toolbus token` names a malformed token file instead of a traceback,
    and leaves it as it was."""
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tokens: 5\n")
    assert main(["token", "--user", "a", "--profiles", "p", "--token-file", str(tokens)]) == 1
    assert capsys.readouterr().err == (
        f"token file {tokens}: tokens: Input should be a valid list\n"
    )
    assert tokens.read_text() == "tokens: 5\n"


def test_audit_file_problems_named(tmp_path: Path) -> None:
    """SPEC O5: an audit file that is a folder is reported by `check` and refuses `serve`
    with the key named."""
    config = _folder(tmp_path, log={"audit_file": "audit"})
    (tmp_path / "audit").mkdir()
    problem = f"log.audit_file {tmp_path / 'audit'}: is a folder, not a file"
    check = _toolbus("check", "--config", str(config), cwd=tmp_path)
    assert (check.returncode, check.stdout, check.stderr) == (1, "", f"error: {problem}\n")
    _refused(_toolbus("serve", "--config", str(config), cwd=tmp_path), problem)
