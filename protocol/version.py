"""Subprotocol names and version negotiation (SPEC S1, RFC 6455 section 1.9).

The protocol version is negotiated in the WebSocket upgrade through
``Sec-WebSocket-Protocol``: the client offers one or more ``toolbus.vN`` names and the
server picks the newest it supports. A client offering none is refused at the
handshake with a reason naming what the server speaks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

SUBPROTOCOL_V1: Final = "toolbus.v1"
SUPPORTED: Final[tuple[str, ...]] = (SUBPROTOCOL_V1,)
"""Supported subprotocols, most preferred first."""


def negotiate(offered: Sequence[str], supported: Sequence[str] = SUPPORTED) -> str | None:
    """Pick the subprotocol for a connection (SPEC S1).

    Args:
        offered: names from the client's ``Sec-WebSocket-Protocol`` header, in its order.
        supported: names this server speaks, most preferred first.

    Returns:
        The server's most preferred name that the client offered, or ``None`` when
        there is none in common (the upgrade must then be refused).
    """
    wanted = set(offered)
    for name in supported:
        if name in wanted:
            return name
    return None


def refusal_reason(offered: Sequence[str], supported: Sequence[str] = SUPPORTED) -> str:
    """Explain a failed negotiation in one line, for the HTTP 400 body of the handshake."""
    got = ", ".join(offered) if offered else "none"
    return f"unsupported subprotocol (offered: {got}; supported: {', '.join(supported)})"
