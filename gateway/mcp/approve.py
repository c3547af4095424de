"""Approvals asked of an MCP client at ``/mcp`` through elicitation (SPEC A3, A5, M4).

:class:`ApprovalAsker` turns a call's ``tool_start`` with an ``approval_id`` into an MCP
question and its answer into a toolbus decision: a 2026-07-28 client gets an
``InputRequiredResult`` and answers in its retry; an older one gets
``elicitation/create`` on the request's stream; a client without the elicitation
capability cannot be asked, so the call is denied (A5 declined result).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.approvals import Approvals
from gateway.session import Session
from protocol import messages as m

APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approve": {"type": "boolean", "title": "Allow this call?"}},
    "required": ["approve"],
}
"""The form an approval asks for (SPEC A3 through MCP elicitation, M4)."""

Parked = dict[str, tuple[str, str]]
"""``request_state`` -> (call id, approval id) of approvals asked by an
``InputRequiredResult`` and not answered yet (one per internal session)."""


class ApprovalAsker:
    """Asks MCP clients for approvals and settles them (SPEC A3, A5, M4).

    Args:
        approvals: the gateway's pending approvals; every answer settles one.
    """

    def __init__(self, approvals: Approvals) -> None:
        self.approvals = approvals

    def answered(
        self, session: Session, parked: Parked, params: types.CallToolRequestParams
    ) -> str | None:
        """The call a retry belongs to, after applying its approval answer (SPEC A3);
        ``None`` for a ``request_state`` that is unknown or already settled."""
        asked = parked.pop(str(params.request_state), None)
        if asked is None:
            return None
        call_id, approval_id = asked
        answer = (params.input_responses or {}).get("approval")
        self.approvals.confirm(session.id, session.user, approval_id, _decision(answer))
        return call_id

    async def ask(
        self,
        ctx: ServerRequestContext[Any],
        session: Session,
        parked: Parked,
        call_id: str,
        frame: dict[str, Any],
    ) -> types.InputRequiredResult | None:
        """SPEC A3 via MCP elicitation; SPEC A5 (declined) when the client cannot be asked
        (no ``elicitation`` capability): then denied ``disconnected`` by the server.

        Args:
            ctx: the ``tools/call`` request of the call.
            session: the internal session the call runs in.
            parked: where a 2026-07-28 question's ``request_state`` is kept, a random key.
            call_id: the toolbus call.
            frame: its ``tool_start`` (``approval_id``, ``tool``, ``params``).

        Returns:
            The ``InputRequiredResult`` to answer a 2026-07-28 client with (the call
            waits for its retry), else ``None`` once the approval is settled.
        """
        capabilities = ctx.session.client_capabilities
        if capabilities is None or capabilities.elicitation is None:
            # Nobody can be asked: the server denies it, ``disconnected`` (no channel to
            # a user, SPEC A4), audited ``by`` the server, never as the user's decision.
            self.approvals.settle(
                frame["approval_id"], m.Resolution.DENIED, m.ResolutionReason.DISCONNECTED
            )
            return None
        form = types.ElicitRequestFormParams(
            message=f"Allow {frame['tool']} with {json.dumps(frame['params'])}?",
            requested_schema=APPROVAL_SCHEMA,
        )
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            state = secrets.token_urlsafe(24)
            parked[state] = (call_id, frame["approval_id"])
            return types.InputRequiredResult(
                input_requests={"approval": types.ElicitRequest(params=form)},
                request_state=state,
            )
        answer = await ctx.session.elicit_form(form.message, form.requested_schema, ctx.request_id)
        self.approvals.confirm(session.id, session.user, frame["approval_id"], _decision(answer))
        return None


def _decision(answer: object) -> m.Decision:
    """``allow`` only for an accepted form whose ``approve`` is true (SPEC A3)."""
    if (
        isinstance(answer, types.ElicitResult)
        and answer.action == "accept"
        and (answer.content or {}).get("approve") is True
    ):
        return m.Decision.ALLOW
    return m.Decision.DENY
