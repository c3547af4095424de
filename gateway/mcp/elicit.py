"""Elicitation during a call, forwarded to the toolbus client (SPEC M3).

A mounted MCP server that sends ``elicitation/create`` during a call is asking the user.
:meth:`Elicitations.ask` turns that into a durable ``elicit.request`` event in the
calling session's log (replayed on resume, like ``tool_start``), then waits for the
client's ``elicit.answer``. :meth:`Elicitations.answer` settles it: the first answer
from the same session wins, anything else is "not accepted" (``unknown`` never says
whether the id exists for someone else, SPEC A7). No answer before the approval
timeout (an answer after the announced ``expires_at`` is ``expired``), the end of the
session, or the end of the call, answers the MCP server ``cancel``.

Several nodes (SPEC N3): the session may move to another node while the call waits
here. The pending id is written into the call's stored note (``{"tool", "elicitation_id",
"expires_at"}``, as :mod:`gateway.approval_gate` writes the approval id), so the node that
now holds the session routes an answer for that id here (:mod:`gateway.node_requests`),
and answers one sent after ``expires_at`` ``expired`` itself; :meth:`holds` and
:meth:`settle` apply it with the same rules as an answer from this node's socket, at the
time that node received it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.context import ToolContext
from gateway.framesize import WIDEST_SEQ
from gateway.session import Session
from protocol import messages as m
from protocol.codec import encode_json

Answer = tuple[m.ElicitAction, dict[str, Any] | None]
"""What goes back to the MCP server: the action and, for ``accept``, the content."""

CANCELLED: Answer = (m.ElicitAction.CANCEL, None)

logger = logging.getLogger("gateway.mcp")


@dataclass(slots=True)
class _Pending:
    session_id: str
    call_id: str
    future: asyncio.Future[Answer]
    expires_at: float
    """The deadline ``elicit.request`` announced (Unix s, the gateway's clock)."""


class Elicitations:
    """Pending elicitations of one gateway (SPEC M3).

    Args:
        session: session id -> the live or parked session, or ``None``.
        timeout: seconds a question waits for its answer (``calls.approval_timeout``).
        clock: Unix time in seconds, for ``expires_at``.
        max_frame: the announced ``max_message_bytes`` (SPEC E2); ``None``: no bound.
    """

    def __init__(
        self,
        session: Callable[[str], Session | None],
        timeout: float,
        clock: Callable[[], float],
        max_frame: int | None = None,
    ) -> None:
        self._session = session
        self._timeout = timeout
        self._clock = clock
        self._max_frame = max_frame
        self._pending: dict[str, _Pending] = {}

    async def ask(self, ctx: ToolContext, message: str, schema: dict[str, Any]) -> Answer:
        """Ask the user of ``ctx``'s session; wait for the answer (SPEC M3).

        Returns:
            The client's action and content, or ``cancel`` when the session is gone,
            ends, or does not answer within the timeout, or when the question's frame
            would be larger than ``max_message_bytes`` (SPEC E2: never sent; logged).
        """
        session = self._session(ctx.session_id)
        if session is None or session.ended:
            return CANCELLED
        elicitation_id = "el_" + secrets.token_urlsafe(16)  # 128 random bits, as A2
        expires_at = self._clock() + self._timeout
        request = m.ElicitRequest(
            call_id=ctx.call_id,
            tool=ctx.tool,
            elicitation_id=elicitation_id,
            message=message,
            requested_schema=schema,
            expires_at=expires_at,
        )
        size = len(encode_json(request.model_copy(update={"seq": WIDEST_SEQ}).model_dump()))
        if self._max_frame is not None and size > self._max_frame:
            logger.warning(
                "call %s (%s): elicit.request would be %d bytes; at most %d fit; answered cancel",
                ctx.call_id,
                ctx.tool,
                size,
                self._max_frame,
            )
            return CANCELLED
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending[elicitation_id] = _Pending(session.id, ctx.call_id, future, expires_at)
        try:
            self._note(session, ctx)
            session.emit(request)
            async with asyncio.timeout(self._timeout):
                return await future
        except TimeoutError:
            return CANCELLED
        finally:
            self._pending.pop(elicitation_id, None)
            self._note(session, ctx)

    def _note(self, session: Session, ctx: ToolContext) -> None:
        """SPEC N3: the call's stored note names its newest pending question, or none,
        so another node can tell an id this call may hold from a made-up one. Only for a
        sync call still running here (a job, a promoted or finished call has no running
        row to write; its questions are answered on this node's socket only)."""
        call_id = ctx.call_id
        if (
            ctx.job_id is not None
            or session.ended
            or call_id not in session.inflight
            or call_id in session.done_calls
        ):
            return
        note: dict[str, Any] = {"tool": ctx.tool}
        for elicitation_id, pending in reversed(self._pending.items()):
            if (pending.session_id, pending.call_id) == (session.id, call_id):
                # SPEC N3, A4: and its deadline, so the node that routes an answer for it
                # answers a late one ``expired``, as this node would.
                note["elicitation_id"] = elicitation_id
                note["expires_at"] = pending.expires_at
                break
        session.store.stage_call(session.id, call_id, "running", encode_json(note))

    def holds(self, session_id: str, elicitation_id: str) -> bool:
        """Whether ``elicitation_id`` waits here for an answer from ``session_id``
        (SPEC N3: a routed answer is applied only where its question waits)."""
        pending = self._pending.get(elicitation_id)
        return pending is not None and pending.session_id == session_id

    def settle(
        self,
        session_id: str,
        elicitation_id: str,
        action: m.ElicitAction,
        content: dict[str, Any] | None,
        at: float | None = None,
    ) -> m.NotAcceptedReason | None:
        """Settle a pending question with an answer from ``session_id`` (SPEC M3, A7).

        Args:
            session_id: the answering session.
            elicitation_id: the question.
            action: the user's action.
            content: the form's content, for ``accept``.
            at: when the gateway received the answer (Unix s): another node's clock for
                one routed here (SPEC N3); ``None``: now, on this node's clock.

        Returns:
            ``None`` when it was accepted; ``unknown`` when no question of that session
            has that id (another session's id included, A7); ``already_decided`` when
            the first answer already won; ``expired`` when its ``expires_at`` has
            passed (the MCP server is answered ``cancel`` now, as at the timeout).
        """
        pending = self._pending.get(elicitation_id)
        if pending is None or pending.session_id != session_id:
            return m.NotAcceptedReason.UNKNOWN
        if pending.future.done():
            return m.NotAcceptedReason.ALREADY_DECIDED
        if (self._clock() if at is None else at) >= pending.expires_at:
            # SPEC M3, A4: the deadline announced, on this clock; the wait's timeout runs
            # on the loop's clock and may not have fired yet.
            pending.future.set_result(CANCELLED)
            return m.NotAcceptedReason.EXPIRED
        pending.future.set_result((action, content if action is m.ElicitAction.ACCEPT else None))
        return None

    def answer(self, session: Session, msg: m.ElicitAnswer) -> m.ElicitResult:
        """Settle a pending question with the client's answer (SPEC M3)."""
        reason = self.settle(session.id, msg.elicitation_id, msg.action, msg.content)
        return m.ElicitResult(
            id=msg.id, elicitation_id=msg.elicitation_id, accepted=reason is None, reason=reason
        )

    def settle_session(self, session_id: str) -> None:
        """The session ended: its open questions are answered ``cancel``."""
        for pending in self._pending.values():
            if pending.session_id == session_id and not pending.future.done():
                pending.future.set_result(CANCELLED)
