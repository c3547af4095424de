"""The token file's schema messages: file, key and did-you-mean (SPEC S2, O5); what a
tenant may be, in a token file and a JWT (SPEC S2, I15)."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest

from gateway.auth import AuthError, JwtAuthenticator
from gateway.tokenfile import TokenFileError, read_token_file
from tests.support import JWT_SECRET

DIGEST = "a" * 64


def test_misspelt_entry_key_suggests_the_right_one(tmp_path: Path) -> None:
    """SPEC O5: an unknown key names the file, the entry, the closest key and the rest."""
    path = tmp_path / "tokens.yaml"
    path.write_text(f"tokens:\n  - {{sha256: {DIGEST}, user: u, profile: [p]}}\n")
    with pytest.raises(TokenFileError) as info:
        read_token_file(path)
    assert str(info.value) == (
        f"token file {path}: tokens.0.profile: unknown key (did you mean profiles?); "
        "allowed: profiles, sha256, tenant, user"
    )


def test_misspelt_top_level_key_suggests_tokens(tmp_path: Path) -> None:
    """SPEC O5: the file's only key is ``tokens``; a near miss says so."""
    path = tmp_path / "tokens.yaml"
    path.write_text("token: []\n")
    with pytest.raises(TokenFileError) as info:
        read_token_file(path)
    assert str(info.value) == (
        f"token file {path}: token: unknown key (did you mean tokens?); allowed: tokens"
    )


def test_i15_an_empty_tenant_is_refused_in_the_token_file_and_in_a_jwt(tmp_path: Path) -> None:
    """SPEC S2, I15: a tenant is absent or a non-empty string. The call ledger keys a
    principal as ``(tenant or "", user)``, so a tenant ``""`` would share the call ids
    (and the recorded results) of the same user with no tenant, while sessions, jobs
    and limits keep the two apart. The token file is refused naming the key, and a JWT
    with ``"tenant": ""`` is refused like any malformed claim."""
    path = tmp_path / "tokens.yaml"
    path.write_text(f"tokens:\n  - {{sha256: {DIGEST}, user: u, tenant: ''}}\n")
    with pytest.raises(TokenFileError) as info:
        read_token_file(path)
    assert str(info.value) == (
        f"token file {path}: tokens.0.tenant: String should have at least 1 character"
    )
    authenticator = JwtAuthenticator(secret=JWT_SECRET)
    exp = time.time() + 60
    claims = {"sub": "alice", "profiles": ["demo"], "exp": exp}
    for tenant, accepted in (("", False), ("t2", True)):
        token = jwt.encode({**claims, "tenant": tenant}, JWT_SECRET, algorithm="HS256")
        if accepted:
            assert authenticator.authenticate(token).tenant == tenant
            continue
        with pytest.raises(AuthError) as refused:
            authenticator.authenticate(token)
        assert str(refused.value) == "JWT claim 'tenant' must be a non-empty string"
