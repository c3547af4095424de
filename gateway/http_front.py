"""The HTTP side of the port: upgrade vetting and the side routes (SPEC S1, S2, O2, K2).

:class:`UpgradeVetting` answers every request before websockets' handshake goes on
(:data:`gateway.wslib.ProcessRequest`). A WebSocket upgrade is refused, before any
session exists, when its URL carries a credential (SPEC S2: URLs end up in access logs;
HTTP 400), its ``Origin`` is not allowed (SPEC S2, case F15: HTTP 403) or it offers no
supported subprotocol (SPEC S1: HTTP 400 naming what is supported); a repeated ``Origin``
is refused 400 (SPEC S2, E1; RFC 6454 section 7.3). A plain HTTP request
goes to :class:`SideRoutes`: ``/healthz``, ``/readyz``, ``/metrics`` (Prometheus text)
and the demo console's files (SPEC O2, K2). ``/mcp`` never reaches either: the socket
sniffer hands it to the MCP app first (SPEC M4, :mod:`gateway.mcp.route`).
"""

from __future__ import annotations

import http
import logging
from pathlib import Path
from typing import Final
from urllib.parse import parse_qs, urlsplit

from gateway import wslib
from gateway.config import ServerConfig
from gateway.health import Health
from gateway.wslib import Request, Response, WsConnection
from protocol.version import negotiate, refusal_reason

logger = logging.getLogger("gateway.server")

STATIC_DIR = Path(__file__).resolve().parent / "static"
_STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
}
_CREDENTIAL_PARAMS = frozenset(
    {
        "token",
        "access_token",
        "jwt",
        "auth",
        "authorization",
        "resume_token",
        "api_key",
        "apikey",
        "password",
        "secret",
    }
)
_TEXT = "text/plain; charset=utf-8"


def credentials_in(path: str, query: str) -> bool:
    """Whether a request URL carries something named like a credential, in the query or
    as a ``;name=value`` path parameter (SPEC S2: URLs end up in access logs)."""
    names = {name.lower() for name in parse_qs(query)}
    for segment in path.split("/"):
        for parameter in segment.split(";")[1:]:
            names.add(parameter.partition("=")[0].lower())
    return bool(_CREDENTIAL_PARAMS & names)


def _response(status: http.HTTPStatus, body: bytes, content_type: str) -> Response:
    return wslib.response(
        status,
        body,
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
        ],
    )


LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1"})
"""Hosts only this machine reaches: its own pages are the only browsers there."""
WILDCARD_HOSTS: Final = frozenset({"0.0.0.0", "::", ""})
"""Every interface: no page is ever loaded from such an origin."""


class Origins:
    """The ``Origin`` allowlist of browser requests (SPEC S2, case F15).

    Args:
        server: ``server.origins`` when set; else the page origins of this server itself
            (``server.host``, ``127.0.0.1`` and ``localhost`` on :attr:`port`).
    """

    def __init__(self, server: ServerConfig) -> None:
        self._server = server
        self.port = 0
        """The bound port (set once the server listens); 0 before."""

    def allowed(self) -> set[str]:
        """Every origin allowed now, as ``scheme://host[:port]`` strings."""
        if self._server.origins:
            return set(self._server.origins)
        hosts = {self._server.host, "127.0.0.1", "localhost"}
        return {f"http://{h}:{self.port}" for h in hosts}

    def allows(self, origin: str) -> bool:
        """Whether a request carrying ``Origin: origin`` may go on."""
        return origin in self.allowed()

    def notice(self) -> list[str]:
        """What the banner says of the allowlist (SPEC S2, O1): the origins allowed, and,
        on a non-loopback address with no ``server.origins``, that a page loaded from
        another machine is refused until its origin is listed there."""
        lines = [f"browser origins allowed: {', '.join(sorted(self.allowed()))}"]
        host = self._server.host
        if self._server.origins or host in LOOPBACK_HOSTS:
            return lines
        example = f"http://HOST:{self.port}"
        # A wildcard is no origin a browser shows; a named address is, under that name only.
        page = "from another machine" if host in WILDCARD_HOSTS else f"under a name not {host}"
        lines.append(
            f"serving on {host}: a page loaded {page} gets its WebSocket "
            f"refused 403 (origin not allowed) until server.origins lists the page's "
            f"origin, e.g. TOOLBUS_SERVER__ORIGINS='[\"{example}\"]' (HOST: the address "
            "in the browser's address bar)"
        )
        return lines


class SideRoutes:
    """GET and HEAD side routes and the console's files (SPEC O2, K2).

    Args:
        health: readiness, tracked entries and the metrics text.
        static_dir: the console's files, read once here.
    """

    def __init__(self, health: Health, static_dir: Path = STATIC_DIR) -> None:
        self._health = health
        self._files = {
            f.name: (f.read_bytes(), _STATIC_TYPES.get(f.suffix, "application/octet-stream"))
            for f in static_dir.iterdir()
            if f.is_file()
        }

    def answer(self, method: str, path: str) -> Response:
        """GET serves the side routes; HEAD the same without a body (RFC 9110 section
        9.3.2); anything else is 405 with ``Allow``."""
        if method == "HEAD":
            return wslib.without_body(self._get(path))
        if method != "GET":
            response = _response(
                http.HTTPStatus.METHOD_NOT_ALLOWED, b"method not allowed\n", "text/plain"
            )
            response.headers["Allow"] = "GET, HEAD"
            return response
        return self._get(path)

    def _get(self, path: str) -> Response:
        """SPEC O2 side routes and the demo console (SPEC K2)."""
        if path == "/healthz":
            return _response(http.HTTPStatus.OK, b"ok\n", _TEXT)
        if path == "/readyz":
            # SPEC S4 (draining) and D6 (a store that cannot commit): not ready.
            ok, body = self._health.readiness()
            status = http.HTTPStatus.OK if ok else http.HTTPStatus.SERVICE_UNAVAILABLE
            return _response(status, body, _TEXT)
        if path == "/metrics":
            text = self._health.metrics_text()
            return _response(http.HTTPStatus.OK, text, "text/plain; version=0.0.4; charset=utf-8")
        return self._static(path)

    def _static(self, path: str) -> Response:
        """The console's files, looked up by name in a table built at start: a request
        path never reaches the filesystem, so no traversal or odd byte can (SPEC K2).
        ``/voice`` is the worked voice example's page (SPEC V3)."""
        pages = {"/": "index.html", "": "index.html", "/voice": "voice.html"}
        name = pages.get(path) or path.removeprefix("/")
        found = self._files.get(name.removeprefix("static/"))
        if found is None:
            return _response(http.HTTPStatus.NOT_FOUND, b"not found\n", _TEXT)
        return _response(http.HTTPStatus.OK, *found)


class UpgradeVetting:
    """Every request before the WebSocket handshake (SPEC S1, S2).

    Args:
        origins: the ``Origin`` allowlist.
        routes: where a request that is not an upgrade goes.
    """

    def __init__(self, origins: Origins, routes: SideRoutes) -> None:
        self._origins = origins
        self._routes = routes

    def process_request(self, connection: WsConnection, request: Request) -> Response | None:
        """A refusal or side-route response, or ``None`` to let the handshake go on."""
        url = urlsplit(request.path)
        # Upgrade is a list (RFC 9110 section 7.8): repeated lines are one comma list.
        upgrades = wslib.header_values(request, "Upgrade")
        if "websocket" not in ",".join(upgrades).lower():
            return self._routes.answer(request.method, url.path)
        if credentials_in(url.path, url.query):
            return wslib.plain_response(
                connection,
                http.HTTPStatus.BAD_REQUEST,
                "credentials are not accepted in the URL; "
                "send them in hello or the Authorization header\n",
            )
        try:
            origin = wslib.single_header(request, "Origin")
        except wslib.RepeatedHeader as exc:
            # RFC 6454 section 7.3: a user agent sends one Origin. Two are no browser's
            # and either one could be the one a proxy checked: refused, not chosen.
            logger.warning("refused upgrade with a repeated Origin header (SPEC S2)")
            return wslib.plain_response(connection, http.HTTPStatus.BAD_REQUEST, f"{exc}\n")
        if origin is not None and not self._origins.allows(origin):
            logger.warning("refused upgrade from origin %s (SPEC S2)", origin)
            forbidden = http.HTTPStatus.FORBIDDEN
            return wslib.plain_response(connection, forbidden, "origin not allowed\n")
        offered = wslib.header_values(request, "Sec-WebSocket-Protocol")
        if negotiate(offered) is None:
            reason = refusal_reason(offered) + "\n"
            return wslib.plain_response(connection, http.HTTPStatus.BAD_REQUEST, reason)
        return None
