"""The token file's format, validated by schema (SPEC S2, O5).

A token file is YAML: ``tokens: [{sha256: HEX, user: U, profiles: [P], tenant?: T}]``.
It stores only SHA-256 digests, never the tokens. :func:`read_token_file` parses and
checks it and raises :class:`TokenFileError` naming the file and the entry and key at
fault, so a malformed file is one clear start-up error (and, on hot reload, one log
line while the previous good table stays in force), never a traceback at each hello.
"""

from __future__ import annotations

from pathlib import Path

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from catalog.errors import did_you_mean


class TokenFileError(ValueError):
    """The token file is unreadable or malformed; the message names the file and key."""


class TokenEntry(BaseModel):
    """One accepted token: its SHA-256 hex digest and who it stands for (SPEC S2)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    user: str = Field(min_length=1)
    profiles: list[str] = Field(default_factory=list)
    tenant: str | None = Field(None, min_length=1)
    """Absent for no tenant; never empty: ``""`` would share the call ids of the same
    user with no tenant (the ledger keys both ``("", user)``, SPEC I15)."""

    @field_validator("user", "tenant", "profiles")
    @classmethod
    def _no_nul(cls, value: str | list[str] | None) -> str | list[str] | None:
        # SPEC S2, D6: user, tenant and the session's profile (one of these) key
        # sessions, jobs and the call ledger, and PostgreSQL TEXT cannot hold U+0000:
        # refused at load, for every store alike.
        texts = [value] if isinstance(value, str) else value or []
        if any("\x00" in text for text in texts):
            raise PydanticCustomError("no_nul", "must not hold U+0000")
        return value


class TokenFile(BaseModel):
    """The whole file: ``tokens`` is the only key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: list[TokenEntry] = Field(default_factory=list)


def read_token_file(path: Path) -> list[TokenEntry]:
    """Read and validate a token file (SPEC S2, O5).

    Args:
        path: the YAML token file. An empty file holds no tokens.

    Returns:
        The entries, in file order.

    Raises:
        TokenFileError: the file cannot be read, is not YAML, or an entry is malformed
            (e.g. ``token file t.yaml: tokens.1.sha256: Field required``, or
            ``tokens.0.usr: unknown key (did you mean user?); allowed: ...``); the
            message never contains a digest or token.
    """
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TokenFileError(f"token file {path}: cannot read: {exc.strerror or exc}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"token file {path}: not valid YAML ({type(exc).__name__})") from exc
    try:
        return TokenFile.model_validate(raw or {}).tokens
    except pydantic.ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        key = ".".join(str(part) for part in first["loc"]) or "(top level)"
        message = first["msg"]
        if first["type"] == "extra_forbidden":
            model = TokenEntry if len(first["loc"]) > 1 else TokenFile
            hint = did_you_mean(str(first["loc"][-1]), model.model_fields)
            message = f"unknown key{hint}; allowed: {', '.join(sorted(model.model_fields))}"
        more = exc.error_count() - 1
        tail = f" (and {more} more problem{'s' * (more != 1)})" if more else ""
        raise TokenFileError(f"token file {path}: {key}: {message}{tail}") from None
