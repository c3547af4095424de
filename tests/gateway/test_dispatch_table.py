"""Every client message type has a handler in the gateway (SPEC S1, E1).

A type the protocol accepts but ``ConnectionHandler.BY_CLASS`` lacks would reach the
receive loop and close the socket 1011; these tests fail first.
"""

from __future__ import annotations

from gateway.connection import ConnectionHandler
from gateway.server import Gateway
from protocol.codec import encode
from protocol.connection_state import LEGAL, State
from protocol.messages import CLIENT_TYPES, Hello, type_name
from tests.protocol.golden_messages import CLIENT_GOLDEN
from tests.support import barrier, peer

AFTER_HELLO = {type_name(model) for model in CLIENT_TYPES} - {"hello"}


def test_table_covers_every_client_type_after_hello() -> None:
    """SPEC S1: the dispatch table names exactly the client types legal once open."""
    assert set(ConnectionHandler.TABLE) == AFTER_HELLO
    assert LEGAL[State.OPEN] == AFTER_HELLO


def test_table_methods_exist() -> None:
    """SPEC S1: each table entry names a method of ConnectionHandler."""
    missing = [
        name
        for name in ConnectionHandler.TABLE.values()
        if not callable(getattr(ConnectionHandler, name, None))
    ]
    assert missing == []


def test_class_table_covers_every_client_class_after_hello() -> None:
    """SPEC S1: dispatch is by message class; every client class but hello has a handler."""
    assert set(ConnectionHandler.BY_CLASS) == set(CLIENT_TYPES) - {Hello}
    assert {type_name(cls) for cls in ConnectionHandler.BY_CLASS} == AFTER_HELLO


async def test_every_client_type_is_served(gateway: Gateway) -> None:
    """SPEC S1/E1: each client message (the golden examples) gets served, not a 1011."""
    sent = []
    async with peer(gateway) as p:
        for message, _ in CLIENT_GOLDEN:
            name = type_name(type(message))
            if name in ("hello", "bye"):
                continue  # hello opened the session; bye would end it
            await p.send(encode(message).decode())
            sent.append(name)
        await barrier(p)  # answered: the socket is open and its loop still serving
    assert set(sent) == AFTER_HELLO - {"bye"}
