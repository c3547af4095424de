"""SPEC S1: subprotocol negotiation in the WebSocket upgrade."""

from __future__ import annotations

from protocol.version import SUBPROTOCOL_V1, SUPPORTED, negotiate, refusal_reason


def test_supported_is_v1() -> None:
    """SPEC S1: this server speaks toolbus.v1."""
    assert SUPPORTED == ("toolbus.v1",)
    assert SUBPROTOCOL_V1 == "toolbus.v1"


def test_negotiate_picks_the_supported_name() -> None:
    """SPEC S1: among the offered names, the supported one is chosen."""
    assert negotiate(["chat", "toolbus.v1", "toolbus.v0"]) == "toolbus.v1"


def test_negotiate_prefers_the_servers_order() -> None:
    """SPEC S1: with several in common, the server's most preferred wins, not the client's."""
    assert negotiate(["toolbus.v1", "toolbus.v2"], ("toolbus.v2", "toolbus.v1")) == "toolbus.v2"


def test_negotiate_none_without_overlap() -> None:
    """SPEC S1: no name in common (or none offered) -> None, the upgrade is refused."""
    assert negotiate(["toolbus.v9", "TOOLBUS.V1"]) is None
    assert negotiate([]) is None


def test_refusal_reason_names_both_sides() -> None:
    """SPEC S1: the refusal says what was offered and what the server speaks."""
    assert refusal_reason(["toolbus.v9", "chat"]) == (
        "unsupported subprotocol (offered: toolbus.v9, chat; supported: toolbus.v1)"
    )
    assert refusal_reason([]) == "unsupported subprotocol (offered: none; supported: toolbus.v1)"
