"""A credential's stored reference, re-validated after a restart (SPEC S6, A7, J6).

A session's credential lives only in memory (:class:`gateway.authority.Credential`). A
session a restart brings back has none until its client resumes, yet its queued and
re-run jobs start at once. So that nothing of it runs on a credential revoked or
expired meanwhile, the session row keeps a *reference* to the credential it last
authenticated with, never the credential itself:

- a credential without an expiry (a token-file token): ``{"kind": "token", "sha256":
  HEX, "profile": P}``, the SHA-256 digest the token file itself stores (SPEC S2);
- a JWT (any credential with an ``exp``): ``{"kind": "jwt", "sub": U, "exp": SECONDS}``.

:func:`lapse_of` re-validates a reference on the state now: the digest still in the
token file, naming the session's principal and still granting its profile; the ``exp``
not passed. A row without a reference (written before store schema version 2) or of an
unknown kind cannot be re-validated and counts as revoked: fail closed.
"""

from __future__ import annotations

from typing import Any

from gateway.auth import Authenticator, Identity, hash_token
from protocol.codec import decode_json, encode_json
from protocol.errors import ErrorCode

_TOKEN, _JWT = "token", "jwt"


def encode_ref(token: str, identity: Identity, profile: str) -> str:
    """The reference to store for ``token`` (SPEC S6); never contains the token.

    Args:
        token: the credential the session authenticated with.
        identity: what it was accepted as; ``expires_at`` set makes it a JWT reference.
        profile: the session's profile name.

    Returns:
        Compact JSON text for :attr:`gateway.store.SessionRow.credential_ref`.
    """
    ref: dict[str, Any]
    if identity.expires_at is not None:
        ref = {"kind": _JWT, "sub": identity.user, "exp": identity.expires_at}
    else:
        ref = {"kind": _TOKEN, "sha256": hash_token(token), "profile": profile}
    return encode_json(ref).decode()


def identity_by_hash(authenticator: Authenticator, digest: str) -> Identity | None:
    """The identity the token with SHA-256 ``digest`` stands for now, or ``None``: an
    authenticator without a ``by_hash`` lookup cannot vouch for a stored digest."""
    lookup = getattr(authenticator, "by_hash", None)
    if not callable(lookup):
        return None
    found = lookup(digest)
    return found if isinstance(found, Identity) else None


def lapse_of(
    ref: str | None,
    authenticator: Authenticator,
    principal: tuple[str, str | None],
    profile: str,
    now: float,
) -> ErrorCode | None:
    """Re-validate a stored reference on the state now (SPEC S6, A7).

    Args:
        ref: the stored reference (:func:`encode_ref`), or ``None``.
        authenticator: the server's, reading the current token file.
        principal: the session's ``(user, tenant)``.
        profile: the session's profile name.
        now: Unix time in seconds.

    Returns:
        ``None`` when the credential still stands; ``CREDENTIAL_EXPIRED`` past a JWT's
        ``exp``; ``CREDENTIAL_REVOKED`` otherwise (digest gone, another principal, the
        profile no longer granted, no reference or an unreadable one).
    """
    try:
        data = decode_json(ref.encode()) if ref else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return ErrorCode.CREDENTIAL_REVOKED
    if data.get("kind") == _JWT:
        exp = data.get("exp")
        if data.get("sub") != principal[0] or not isinstance(exp, int | float):
            return ErrorCode.CREDENTIAL_REVOKED
        return ErrorCode.CREDENTIAL_EXPIRED if now >= exp else None
    digest = data.get("sha256")
    if data.get("kind") != _TOKEN or not isinstance(digest, str):
        return ErrorCode.CREDENTIAL_REVOKED
    identity = identity_by_hash(authenticator, digest)
    if (
        identity is None
        or (identity.user, identity.tenant) != principal
        or data.get("profile") != profile
        or profile not in identity.profiles
    ):
        return ErrorCode.CREDENTIAL_REVOKED
    return None
