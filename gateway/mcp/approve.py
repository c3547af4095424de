"""Questions asked of an MCP client at ``/mcp`` through elicitation (SPEC A3, A5, M3, M4).

:class:`HostAsker` asks the MCP host two kinds of question for a call it runs: its
approval (a ``tool_start`` with an ``approval_id``, SPEC A3) and a mounted MCP server's
question (an ``elicit.request``, SPEC M3). A 2026-07-28 client gets an
``InputRequiredResult`` and answers in its retry; an older one gets
``elicitation/create`` on the request's stream. A client without the elicitation
capability cannot be asked: the approval is denied by the server (A5 declined result),
the mounted server's question is answered ``decline``. A question that cannot be asked
or gets no answer (the client answers an error, the stream fails, its deadline passes)
is settled all the same, so the call ends (SPEC A4: pending slots never leak): the
approval denied by the server, the mounted server's question answered ``cancel``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.approvals import Approvals
from gateway.mcp.elicit import Elicitations
from gateway.session import Session
from protocol import messages as m

logger = logging.getLogger("gateway.mcp.approve")

APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approve": {"type": "boolean", "title": "Allow this call?"}},
    "required": ["approve"],
}
"""The form an approval asks for (SPEC A3 through MCP elicitation, M4)."""

APPROVAL = "approval"
"""The ``inputRequests`` key of an approval (SPEC A3, M4)."""
QUESTION = "question"
"""The ``inputRequests`` key of a mounted MCP server's question (SPEC M3, M4)."""


@dataclass(frozen=True, slots=True)
class Asked:
    """A question asked by an ``InputRequiredResult`` and not answered yet."""

    call_id: str
    question_id: str
    """The ``approval_id`` (SPEC A2) or the ``elicitation_id`` (SPEC M3)."""
    key: str
    """:data:`APPROVAL` or :data:`QUESTION`."""


Parked = dict[str, Asked]
"""``request_state`` -> the question it asked (one map per internal session)."""


class HostAsker:
    """Asks MCP clients for approvals and mounted servers' answers (SPEC A3, A5, M3, M4).

    Args:
        approvals: the gateway's pending approvals; every answer settles one.
        elicitations: the mounted servers' pending questions (SPEC M3).
        clock: Unix time in seconds (the clock of ``expires_at``).
    """

    def __init__(
        self, approvals: Approvals, elicitations: Elicitations, clock: Callable[[], float]
    ) -> None:
        self.approvals = approvals
        self.elicitations = elicitations
        self.clock = clock

    def answered(
        self, session: Session, parked: Parked, params: types.CallToolRequestParams
    ) -> str | None:
        """The call a retry belongs to, after applying its answer (SPEC A3, M3);
        ``None`` for a ``request_state`` that is unknown or already settled."""
        asked = parked.pop(str(params.request_state), None)
        if asked is None:
            return None
        answer = (params.input_responses or {}).get(asked.key)
        if asked.key == APPROVAL:
            decision = _decision(answer)
            self.approvals.confirm(session.id, session.user, asked.question_id, decision)
        else:
            self._answer(session, asked.question_id, answer)
        return asked.call_id

    async def ask(
        self,
        ctx: ServerRequestContext[Any],
        session: Session,
        parked: Parked,
        call_id: str,
        frame: dict[str, Any],
    ) -> types.InputRequiredResult | None:
        """SPEC A3 via MCP elicitation; SPEC A5 (declined) when the client cannot be asked
        (no ``elicitation`` capability) or its answer fails (an error, a lost stream, no
        answer by ``expires_at``): then denied ``disconnected`` by the server.

        Args:
            ctx: the ``tools/call`` request of the call.
            session: the internal session the call runs in.
            parked: where a 2026-07-28 question's ``request_state`` is kept, a random key.
            call_id: the toolbus call.
            frame: its ``tool_start`` (``approval_id``, ``tool``, ``params``,
                ``expires_at``).

        Returns:
            The ``InputRequiredResult`` to answer a 2026-07-28 client with (the call
            waits for its retry), else ``None`` once the approval is settled.
        """
        approval_id = frame["approval_id"]
        form = types.ElicitRequestFormParams(
            message=f"Allow {frame['tool']} with {json.dumps(frame['params'])}?",
            requested_schema=APPROVAL_SCHEMA,
        )
        if _can_elicit(ctx) and ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return _park(parked, Asked(call_id, approval_id, APPROVAL), form)
        answer = await self._elicit(ctx, call_id, form, frame.get("expires_at"))
        if answer is None:
            # Nobody can be asked, or no answer came: the server denies it,
            # ``disconnected`` (no channel to a user, SPEC A4), audited ``by`` the
            # server, never as the user's decision.
            self.approvals.settle(approval_id, m.Resolution.DENIED, m.ResolutionReason.DISCONNECTED)
        else:
            self.approvals.confirm(session.id, session.user, approval_id, _decision(answer))
        return None

    async def forward(
        self,
        ctx: ServerRequestContext[Any],
        session: Session,
        parked: Parked,
        call_id: str,
        frame: dict[str, Any],
    ) -> types.InputRequiredResult | None:
        """SPEC M3, M4: a mounted MCP server's question during the call (an
        ``elicit.request`` of the internal session) asked of the MCP host, its answer
        sent back as the session's ``elicit.answer`` would be. A host without the
        ``elicitation`` capability is not asked: the server gets ``decline`` at once; a
        failed answer (as in :meth:`ask`) is ``cancel``.

        Args:
            ctx: the ``tools/call`` request of the call.
            session: the internal session the call runs in.
            parked: as in :meth:`ask`.
            call_id: the toolbus call.
            frame: its ``elicit.request`` (``elicitation_id``, ``message``,
                ``requested_schema``, ``expires_at``).

        Returns:
            As :meth:`ask`: an ``InputRequiredResult`` for a 2026-07-28 client, else
            ``None`` once the question is settled.
        """
        elicitation_id = frame["elicitation_id"]
        if not _can_elicit(ctx):
            self.elicitations.settle(session.id, elicitation_id, m.ElicitAction.DECLINE, None)
            return None
        form = types.ElicitRequestFormParams(
            message=frame["message"], requested_schema=frame["requested_schema"]
        )
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return _park(parked, Asked(call_id, elicitation_id, QUESTION), form)
        answer = await self._elicit(ctx, call_id, form, frame["expires_at"])
        self._answer(session, elicitation_id, answer)
        return None

    def _answer(self, session: Session, elicitation_id: str, answer: object) -> None:
        """SPEC M3: the host's answer to a mounted server's question; anything but an
        ``ElicitResult`` (no answer, a malformed one) is ``cancel``."""
        if isinstance(answer, types.ElicitResult):
            action, content = m.ElicitAction(answer.action), answer.content
        else:
            action, content = m.ElicitAction.CANCEL, None
        self.elicitations.settle(session.id, elicitation_id, action, content)

    async def _elicit(
        self,
        ctx: ServerRequestContext[Any],
        call_id: str,
        form: types.ElicitRequestFormParams,
        expires_at: float | None,
    ) -> types.ElicitResult | None:
        """``elicitation/create`` on the request's stream, waited for until
        ``expires_at`` (Unix s; ``None``: no bound); ``None`` when the client cannot be
        asked or no answer came (SPEC A4: the question is settled either way)."""
        if not _can_elicit(ctx):
            return None
        try:
            left = None if expires_at is None else max(0.0, expires_at - self.clock())
            async with asyncio.timeout(left):
                return await ctx.session.elicit_form(
                    form.message, form.requested_schema, ctx.request_id
                )
        except Exception as exc:  # the client's error, a lost stream, a bad answer
            logger.warning(
                "call %s: elicitation/create got no answer: %s", call_id, type(exc).__name__
            )
            return None


def _can_elicit(ctx: ServerRequestContext[Any]) -> bool:
    """Whether the client declared the ``elicitation`` capability (SPEC M4)."""
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and capabilities.elicitation is not None


def _park(
    parked: Parked, asked: Asked, form: types.ElicitRequestFormParams
) -> types.InputRequiredResult:
    """A 2026-07-28 question: kept under a random ``request_state`` until the retry."""
    state = secrets.token_urlsafe(24)
    parked[state] = asked
    return types.InputRequiredResult(
        input_requests={asked.key: types.ElicitRequest(params=form)}, request_state=state
    )


def _decision(answer: object) -> m.Decision:
    """``allow`` only for an accepted form whose ``approve`` is true (SPEC A3)."""
    if (
        isinstance(answer, types.ElicitResult)
        and answer.action == "accept"
        and (answer.content or {}).get("approve") is True
    ):
        return m.Decision.ALLOW
    return m.Decision.DENY
