"""Attacks on SPEC O5: start-up failures of other kinds than the F24 list.

Each is one line on stderr naming the key and the cause, exit status 1, no traceback.
"""

from __future__ import annotations

from pathlib import Path

from tests.gateway.test_startup import _folder, _refused, _toolbus


def test_jwt_key_file_that_is_not_a_key_refused_at_start(tmp_path: Path) -> None:
    """SPEC O5, S2: a JWT public key file that exists but holds no key stops ``serve``
    (before, it started and failed every RS256 hello at run time) and ``check``."""
    key = tmp_path / "key.pem"
    key.write_text("not a pem\n")
    config = _folder(tmp_path, auth={"jwt_public_key_file": str(key)})
    _refused(
        _toolbus("serve", "--config", str(config), cwd=tmp_path),
        f"auth.jwt_public_key_file {key}: not a PEM RSA public key",
    )
    check = _toolbus("check", "--config", str(config), cwd=tmp_path)
    assert check.returncode != 0
    assert f"auth.jwt_public_key_file {key}: not a PEM RSA public key" in check.stderr
    assert "Traceback" not in check.stderr


def test_host_that_does_not_resolve_is_named(tmp_path: Path) -> None:
    """SPEC O5: a ``server.host`` that does not resolve names the key and the address
    (before: ``gaierror: [Errno -2] ...`` with no key)."""
    config = _folder(tmp_path, server={"port": 0, "host": "no-such-host.invalid"})
    result = _toolbus("serve", "--config", str(config), cwd=tmp_path)
    assert "Traceback" not in result.stderr
    assert result.returncode == 1
    assert result.stderr.startswith(
        "toolbus: cannot start: server.host no-such-host.invalid: cannot listen on "
        "no-such-host.invalid:0: "
    )
    assert result.stderr.count("\n") == 1
