"""A ``sampling`` handler for the mounting tests (SPEC M3): echoes the last user text."""

from __future__ import annotations

from typing import Any


def sample(params: dict[str, Any]) -> dict[str, Any]:
    """Answer ``sampling/createMessage`` without a model: ``sampled: <last text>``."""
    text = params["messages"][-1]["content"]["text"]
    return {
        "role": "assistant",
        "content": {"type": "text", "text": f"sampled: {text}"},
        "model": "toolbus-test",
        "stopReason": "endTurn",
    }
