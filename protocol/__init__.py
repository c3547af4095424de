"""toolbus protocol v1, sans-I/O: wire messages, the codec, errors, negotiation, state.

Nothing here imports asyncio, websockets, socket or time: bytes and ``now`` come in,
typed messages, errors and deadlines go out (sans-I/O, see ARCHITECTURE.md).
"""
