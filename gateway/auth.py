"""Authentication (SPEC S2): who is connecting, and which profiles they may use.

An :class:`Authenticator` turns a credential (from ``hello.token`` or the
``Authorization: Bearer`` header, never the URL query) into an :class:`Identity` or
raises :class:`AuthError`. Built in:

- :class:`TokenFileAuthenticator`: a YAML file of SHA-256 token hashes, each mapped to
  a user and profiles. Tokens are random secrets of at least 128 bits, so a fast hash
  is the right tool (no password stretching needed); comparison is constant-time.
- :class:`JwtAuthenticator`: HS256 or RS256 JSON Web Tokens (RFC 7519) checked with
  PyJWT; ``sub`` names the user, a configurable claim lists the profiles, ``exp`` is
  required.

Credentials never reach a log: messages name the failure kind, not the value.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jwt
import yaml

from gateway.tokenfile import TokenFileError, read_token_file

logger = logging.getLogger("gateway.auth")


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller: the user, the profiles granted, the tenant if any, and
    when the credential stops being valid (Unix seconds; ``None``: it does not expire,
    SPEC S6)."""

    user: str
    profiles: frozenset[str]
    tenant: str | None = None
    expires_at: float | None = None


class AuthError(Exception):
    """A credential is missing, malformed, unknown, expired or refused (SPEC S2)."""


class Authenticator(Protocol):
    def authenticate(self, credential: str | None) -> Identity:
        """Return the identity behind ``credential``; raise :class:`AuthError` if none."""


def hash_token(token: str) -> str:
    """SHA-256 hex digest of a token, the form a token file stores (SPEC S2)."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh bearer token: 256 random bits, URL-safe text."""
    return "tb_" + secrets.token_urlsafe(32)


class TokenFileAuthenticator:
    """Tokens from a YAML file: ``tokens: [{sha256: HEX, user: U, profiles: [P], tenant?}]``.

    Args:
        path: the token file; re-read when its modification time changes.

    Raises:
        AuthError: at construction when the file is unreadable or malformed.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._mtime = -1.0
        self._by_hash: dict[str, Identity] = {}
        self._reload()

    def version(self) -> object:
        """What the accepted tokens depend on, for change detection (SPEC S6): the
        file's modification time, re-read first. An unreadable file answers a new object
        each time, so a caller comparing versions always re-checks."""
        try:
            self._reload()
        except AuthError:
            return object()
        return self._mtime

    def seen(self) -> object:
        """:meth:`version` as of the last read of the file, without looking at the file
        again (no ``stat``): cheap enough for every handler start (SPEC S6, A7)."""
        return self._mtime

    def _reload(self) -> None:
        """Re-read the file when its mtime changed (SPEC S2, O5).

        A missing or unreadable file refuses every credential (fail closed). A malformed
        one raises :class:`AuthError` at construction; on a later change it is logged
        once at ERROR and the previous good table stays in force, so a half-written edit
        locks nobody out and no hello ever meets a traceback.
        """
        try:
            mtime = self._path.stat().st_mtime
        except OSError as exc:
            raise AuthError(f"token file {self._path}: {exc.strerror}") from None
        if mtime == self._mtime:
            return
        try:
            entries = read_token_file(self._path)
        except TokenFileError as exc:
            if self._mtime == -1.0:
                raise AuthError(str(exc)) from None
            self._mtime = mtime
            logger.error("%s; keeping the previous tokens", exc)
            return
        self._by_hash = {
            entry.sha256.lower(): Identity(entry.user, frozenset(entry.profiles), entry.tenant)
            for entry in entries
        }
        self._mtime = mtime

    def authenticate(self, credential: str | None) -> Identity:
        if not credential:
            raise AuthError("no credentials")
        self._reload()
        digest = hash_token(credential)
        for known, identity in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                return identity
        raise AuthError("unknown token")

    def by_hash(self, digest: str) -> Identity | None:
        """The identity of the token whose SHA-256 hex digest is ``digest``, on the file
        as it is now, or ``None`` (SPEC S6: a stored credential reference re-validated
        after a restart, :mod:`gateway.credref`). A missing file vouches for nothing."""
        try:
            self._reload()
        except AuthError:
            return None
        digest = digest.lower()
        for known, identity in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                return identity
        return None


class JwtAuthenticator:
    """JWT bearer tokens, HS256 with a shared secret or RS256 with a public key (SPEC S2).

    Args:
        secret: HS256 key, or ``None``.
        public_key: RS256 PEM public key, or ``None``.
        audience: required ``aud`` when set.
        issuer: required ``iss`` when set.
        profiles_claim: the claim listing granted profiles.
    """

    def __init__(
        self,
        secret: str | None = None,
        public_key: str | None = None,
        audience: str | None = None,
        issuer: str | None = None,
        profiles_claim: str = "profiles",
    ) -> None:
        self._keys: list[tuple[str, Any]] = []
        if secret:
            self._keys.append(("HS256", secret))
        if public_key:
            self._keys.append(("RS256", public_key))
        self._audience, self._issuer, self._claim = audience, issuer, profiles_claim

    def version(self) -> object:
        """Constant: a JWT is accepted or not by its own content and ``exp``."""
        return 0

    def authenticate(self, credential: str | None) -> Identity:
        if not credential or credential.count(".") != 2:
            raise AuthError("not a JWT")
        try:
            algorithm = jwt.get_unverified_header(credential).get("alg")
        except jwt.InvalidTokenError as exc:
            raise AuthError("malformed JWT") from exc
        for alg, key in self._keys:
            if alg == algorithm:
                return self._decode(credential, alg, key)
        raise AuthError("JWT algorithm not accepted")

    def _decode(self, credential: str, alg: str, key: Any) -> Identity:
        try:
            claims = jwt.decode(
                credential,
                key,
                algorithms=[alg],
                audience=self._audience,
                issuer=self._issuer,
                options={"require": ["exp", "sub"]},
            )
        except jwt.InvalidTokenError as exc:
            raise AuthError(f"JWT refused: {type(exc).__name__}") from exc
        profiles = claims.get(self._claim, [])
        if not isinstance(profiles, list) or not all(isinstance(p, str) for p in profiles):
            raise AuthError(f"JWT claim '{self._claim}' must be a list of strings")
        tenant = claims.get("tenant")
        if tenant is not None and (not isinstance(tenant, str) or not tenant):
            # A tenant keys sessions, limits and stored rows: an object or a number here
            # must be a typed refusal, not a failure deep in the session table; an empty
            # one would share the call ids of the user with no tenant (SPEC I15).
            raise AuthError("JWT claim 'tenant' must be a non-empty string")
        user = str(claims["sub"])
        for claim, texts in (("sub", [user]), ("tenant", [tenant or ""]), (self._claim, profiles)):
            if any("\x00" in text for text in texts):
                # SPEC S2, D6: user, tenant and the session's profile (one of these) key
                # stored rows, and PostgreSQL TEXT cannot hold U+0000 (the store could
                # not even be asked about the principal's sessions): a typed refusal,
                # the same on every store.
                raise AuthError(f"JWT claim '{claim}' holds U+0000")
        return Identity(user, frozenset(profiles), tenant, float(claims["exp"]))


class ChainAuthenticator:
    """Try several authenticators in order; the first that accepts wins."""

    def __init__(self, authenticators: Sequence[Authenticator]) -> None:
        self._chain = list(authenticators)

    def version(self) -> object:
        """The members' versions (see :func:`version_of`), for change detection."""
        return tuple(version_of(authenticator) for authenticator in self._chain)

    def seen(self) -> object:
        """The members' versions as last seen (see :func:`seen_version_of`)."""
        return tuple(seen_version_of(authenticator) for authenticator in self._chain)

    def authenticate(self, credential: str | None) -> Identity:
        reasons = []
        for authenticator in self._chain:
            try:
                return authenticator.authenticate(credential)
            except AuthError as exc:
                reasons.append(str(exc))
        raise AuthError("; ".join(reasons) or "no authenticator configured")

    def by_hash(self, digest: str) -> Identity | None:
        """The first member's identity for a token digest (see
        :meth:`TokenFileAuthenticator.by_hash`), or ``None``."""
        for authenticator in self._chain:
            lookup = getattr(authenticator, "by_hash", None)
            found = lookup(digest) if callable(lookup) else None
            if isinstance(found, Identity):
                return found
        return None


def version_of(authenticator: Authenticator) -> object:
    """What ``authenticator`` accepts now, as a value that changes when that may have
    changed (SPEC S6: revocation). One without a ``version()`` method answers a new
    object each time: it may change at any moment. JWTs never change (they lapse by
    ``exp``), so :class:`JwtAuthenticator` answers a constant."""
    version = getattr(authenticator, "version", None)
    return version() if callable(version) else object()


def seen_version_of(authenticator: Authenticator) -> object:
    """:func:`version_of` as the authenticator last saw it (a token file as last read,
    by a ``hello`` or a sweep), without reading anything again: a cheap check, for every
    handler start, that no change was seen since (SPEC S6, A7). One without a ``seen()``
    method answers :func:`version_of`."""
    seen = getattr(authenticator, "seen", None)
    return seen() if callable(seen) else version_of(authenticator)


def bearer(header: str | None) -> str | None:
    """The credential of an ``Authorization: Bearer <token>`` header value, else ``None``."""
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return None


def write_dev_token(data_dir: Path, profiles: Sequence[str]) -> tuple[str, Path]:
    """Create (once) a dev token for the demo and a token file that accepts it (SPEC O1).

    The token is kept in ``data_dir/dev-token`` (mode 0600) so that restarts print the
    same one; the token file stores only its hash.

    Returns:
        ``(token, token_file_path)``.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    token_path = data_dir / "dev-token"
    if token_path.exists():
        token = token_path.read_text().strip()
    else:
        token = new_token()
        token_path.write_text(token + "\n")
        token_path.chmod(0o600)
    token_file = data_dir / "tokens.yaml"
    entry = {"sha256": hash_token(token), "user": "dev", "profiles": sorted(profiles)}
    token_file.write_text(yaml.safe_dump({"tokens": [entry]}))
    return token, token_file
