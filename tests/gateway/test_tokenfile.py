"""The token file's schema messages: file, key and did-you-mean (SPEC S2, O5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.tokenfile import TokenFileError, read_token_file

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
