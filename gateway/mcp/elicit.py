"""Elicitation during a call, forwarded to the toolbus client (SPEC M3).

A mounted MCP server that sends ``elicitation/create`` during a call is asking the user.
:meth:`Elicitations.ask` turns that into a durable ``elicit.request`` event in the
calling session's log (replayed on resume, like ``tool_start``), then waits for the
client's ``elicit.answer``. :meth:`Elicitations.answer` settles it: the first answer
from the same session wins, anything else is "not accepted" (``unknown`` never says
whether the id exists for someone else, SPEC A7). No answer before the approval timeout,
the end of the session, or the end of the call, answers the MCP server ``cancel``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.context import ToolContext
from gateway.session import Session
from protocol import messages as m

Answer = tuple[m.ElicitAction, dict[str, Any] | None]
"""What goes back to the MCP server: the action and, for ``accept``, the content."""

CANCELLED: Answer = (m.ElicitAction.CANCEL, None)


@dataclass(slots=True)
class _Pending:
    session_id: str
    future: asyncio.Future[Answer]


class Elicitations:
    """Pending elicitations of one gateway (SPEC M3).

    Args:
        session: session id -> the live or parked session, or ``None``.
        timeout: seconds a question waits for its answer (``calls.approval_timeout``).
        clock: Unix time in seconds, for ``expires_at``.
    """

    def __init__(
        self,
        session: Callable[[str], Session | None],
        timeout: float,
        clock: Callable[[], float],
    ) -> None:
        self._session = session
        self._timeout = timeout
        self._clock = clock
        self._pending: dict[str, _Pending] = {}

    async def ask(self, ctx: ToolContext, message: str, schema: dict[str, Any]) -> Answer:
        """Ask the user of ``ctx``'s session; wait for the answer (SPEC M3).

        Returns:
            The client's action and content, or ``cancel`` when the session is gone,
            ends, or does not answer within the timeout.
        """
        session = self._session(ctx.session_id)
        if session is None or session.ended:
            return CANCELLED
        elicitation_id = "el_" + secrets.token_urlsafe(16)  # 128 random bits, as A2
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending[elicitation_id] = _Pending(session.id, future)
        try:
            session.emit(
                m.ElicitRequest(
                    call_id=ctx.call_id,
                    tool=ctx.tool,
                    elicitation_id=elicitation_id,
                    message=message,
                    requested_schema=schema,
                    expires_at=self._clock() + self._timeout,
                )
            )
            async with asyncio.timeout(self._timeout):
                return await future
        except TimeoutError:
            return CANCELLED
        finally:
            self._pending.pop(elicitation_id, None)

    def answer(self, session: Session, msg: m.ElicitAnswer) -> m.ElicitResult:
        """Settle a pending question with the client's answer (SPEC M3)."""
        pending = self._pending.get(msg.elicitation_id)
        reason: m.NotAcceptedReason | None = None
        if pending is None or pending.session_id != session.id:
            reason = m.NotAcceptedReason.UNKNOWN
        elif pending.future.done():
            reason = m.NotAcceptedReason.ALREADY_DECIDED
        else:
            content = msg.content if msg.action is m.ElicitAction.ACCEPT else None
            pending.future.set_result((msg.action, content))
        return m.ElicitResult(
            id=msg.id, elicitation_id=msg.elicitation_id, accepted=reason is None, reason=reason
        )

    def settle_session(self, session_id: str) -> None:
        """The session ended: its open questions are answered ``cancel``."""
        for pending in self._pending.values():
            if pending.session_id == session_id and not pending.future.done():
                pending.future.set_result(CANCELLED)
