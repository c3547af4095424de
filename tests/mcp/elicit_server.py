"""A small MCP server that asks its user (the SDK's MCPServer, stdio), for the elicitation
tests of the browser console and of ``toolbus run`` (SPEC M3).

Its one tool, ``ask``, sends ``elicitation/create`` (form mode) with a flat schema of
every primitive kind MCP elicitation allows, then answers with what came back:
``accept {"age": 36, ...}`` (the content as sorted JSON), ``decline`` or ``cancel``.
Run with ``python tests/mcp/elicit_server.py``.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from mcp.server.elicitation import AcceptedElicitation, DeclinedElicitation, ElicitationResult
from mcp.server.mcpserver import Elicit, MCPServer, Resolve
from pydantic import BaseModel, Field

server = MCPServer("asker")

QUESTION = "Who is asking, and how should we reply?"


class Form(BaseModel):
    """The requested schema (rendered by the SDK as a flat JSON Schema object)."""

    name: str = Field(title="Name", description="Your full name", min_length=1)
    email: str = Field(
        title="Email", description="Where to reply", json_schema_extra={"format": "email"}
    )
    age: int = Field(title="Age", ge=0, le=150)
    score: float = Field(default=0.5, title="Score", ge=0, le=1)
    subscribe: bool = Field(default=False, title="Subscribe")
    color: Literal["red", "green", "blue"] = Field(default="green", title="Color")


def _question(topic: str) -> Elicit[Form]:
    """The question: the SDK asks it the way the negotiated protocol version says (inside
    the call's round trips at 2026-07-28, ``elicitation/create`` mid-call before)."""
    return Elicit(f"{QUESTION} ({topic})", Form)


@server.tool()
async def ask(topic: str, answer: Annotated[ElicitationResult[Form], Resolve(_question)]) -> str:
    """Ask the user for a form about ``topic``; answer with what came back."""
    if isinstance(answer, AcceptedElicitation):
        return "accept " + json.dumps(answer.data.model_dump(), sort_keys=True)
    if isinstance(answer, DeclinedElicitation):
        return "decline"
    return "cancel"


if __name__ == "__main__":
    server.run()
