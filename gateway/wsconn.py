"""The server-side WebSocket connection class, with coalesced writes.

websockets writes each outgoing frame with its own ``transport.write``; when the link
queues several frames at once (``tool_start`` and ``result`` of a quick call, a replay
page), that is one ``send`` syscall and one wake-up of the peer per frame. This subclass
joins the frames of one flush into a single write. Behaviour is otherwise websockets'
own, including the half-close on an empty chunk (RFC 6455 section 7.1.1).
"""

from __future__ import annotations

import contextlib

from websockets.asyncio.server import ServerConnection


class CoalescingConnection(ServerConnection):
    """A :class:`ServerConnection` whose :meth:`send_data` writes queued frames at once."""

    def send_data(self) -> None:
        pending: list[bytes] = []
        for data in self.protocol.data_to_send():
            if data:
                pending.append(data)
                continue
            self._write(pending)
            pending = []
            if self.transport.can_write_eof():
                # websockets does the same: a half-close is best effort.
                with contextlib.suppress(Exception):
                    self.transport.write_eof()
            else:
                self.transport.close()
        self._write(pending)

    def _write(self, chunks: list[bytes]) -> None:
        if len(chunks) == 1:
            self.transport.write(chunks[0])
        elif chunks:
            self.transport.write(b"".join(chunks))
