"""Who may use ``/mcp``: the HTTP checks made before the MCP SDK sees a request (SPEC S2, M4).

:class:`HttpAdmission` answers a refused request with a plain-text HTTP error and puts
the principal of an admitted one in the ASGI scope (``scope["state"]["toolbus"]``:
identity, profile name, credential).
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qs

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.responses import PlainTextResponse
from starlette.types import Scope

from gateway.auth import Authenticator, AuthError, bearer

PROFILE_HEADER = "x-toolbus-profile"

_SINGLE = ("authorization", "mcp-session-id", "origin", PROFILE_HEADER)
"""Headers read as one value (lower case): a request repeating one is refused (SPEC S2,
E1): 401 for ``Authorization``, as for any credential refused, else 400."""


def _header_lines(scope: Scope) -> dict[str, list[str]]:
    """Every value of each request header, by lower-case name, in the order sent."""
    lines: dict[str, list[str]] = {}
    for key, value in scope["headers"]:
        lines.setdefault(key.decode("latin-1").lower(), []).append(value.decode("latin-1"))
    return lines


class HttpAdmission:
    """The ``/mcp`` request checks (SPEC S2, M4).

    Args:
        authenticator: checks ``Authorization: Bearer`` (SPEC S2), as ``hello`` does.
        credentials_in: ``(path, query) -> bool``: the URL names a credential (SPEC S2).
        origin_allowed: ``origin -> bool`` for requests that carry ``Origin``.
    """

    def __init__(
        self,
        authenticator: Authenticator,
        credentials_in: Callable[[str, str], bool],
        origin_allowed: Callable[[str], bool],
    ) -> None:
        self.authenticator = authenticator
        self.credentials_in = credentials_in
        self.origin_allowed = origin_allowed

    def refusal(self, scope: Scope) -> PlainTextResponse | None:
        """The HTTP refusal of this request, or ``None`` once its principal is in
        ``scope["state"]["toolbus"]``: 404 off ``/mcp``, 400 for a credential in the URL,
        403 for a refused ``Origin`` or a profile not granted (the ``X-Toolbus-Profile``
        header or ``profile`` query parameter; default: the only granted one), 401 (with
        ``WWW-Authenticate: Bearer``) for a missing, refused or repeated credential, 400
        for another header of :data:`_SINGLE` sent twice (SPEC S2, E1)."""
        path, query = scope["path"], scope.get("query_string", b"").decode("latin-1")
        if path.rstrip("/") != "/mcp":
            return PlainTextResponse("not found\n", 404)
        if self.credentials_in(path, query):
            return PlainTextResponse(
                "credentials are not accepted in the URL; send Authorization: Bearer\n", 400
            )
        lines = _header_lines(scope)
        repeated = sorted(n for n in _SINGLE if n != "authorization" and len(lines.get(n, ())) > 1)
        if repeated:
            # SPEC S2, E1: RFC 9110 section 5.3, RFC 6454 section 7.3: one value each;
            # two are refused, never one of them chosen.
            return PlainTextResponse(f"repeated {repeated[0]} header\n", 400)
        headers = {name: values[0] for name, values in lines.items()}
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin):
            return PlainTextResponse("origin not allowed\n", 403)
        credential = bearer(headers.get("authorization"))
        try:
            if len(lines.get("authorization", ())) > 1:
                raise AuthError("repeated Authorization header")
            identity = self.authenticator.authenticate(credential)
        except AuthError:
            return PlainTextResponse(
                "authentication failed\n", 401, headers={"WWW-Authenticate": "Bearer"}
            )
        asked: str | None = headers.get(PROFILE_HEADER) or next(
            iter(parse_qs(query).get("profile", [])), None
        )
        if asked is None and len(identity.profiles) == 1:
            asked = next(iter(identity.profiles))
        if asked is None or asked not in identity.profiles:
            granted = ", ".join(sorted(identity.profiles)) or "none"
            return PlainTextResponse(f"profile not granted; granted: {granted}\n", 403)
        scope.setdefault("state", {})["toolbus"] = (identity, asked, credential or "")
        # SPEC M4, S2, A7: the SDK binds an MCP session to the principal that opened it
        # (``scope["user"]``); another principal's requests naming it are answered as
        # for an unknown session id. The credential itself is not kept there.
        token = AccessToken(
            token="",
            client_id="toolbus",
            scopes=[],
            subject=identity.user,
            claims=None if identity.tenant is None else {"iss": identity.tenant},
        )
        scope["user"] = AuthenticatedUser(token)
        return None
