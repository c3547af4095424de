"""OpenAI Realtime server events for the scripted peer, and checks of what the bridge sends.

The event sequences follow the Realtime API reference (GA): a response that calls
functions is ``response.created``, then per function call ``response.output_item.added``
(item ``function_call``, ``in_progress``), ``response.function_call_arguments.delta``,
``response.function_call_arguments.done`` and ``response.output_item.done`` (the item
``completed``), then ``response.done`` whose ``response.output`` lists every item. A
spoken answer is the same with an assistant ``message`` item.

Every built event is validated against openai-python's ``RealtimeServerEvent`` (generated
from the API's OpenAPI spec), and :func:`check_sent` validates each event the bridge sent
against ``RealtimeClientEventParam``, unchanged (no missing, extra or coerced key).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

from openai.types.beta.realtime.realtime_client_event_param import (
    RealtimeClientEventParam as BetaClientEventParam,
)
from openai.types.realtime.realtime_client_event_param import RealtimeClientEventParam
from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from pydantic import TypeAdapter

SERVER = TypeAdapter(RealtimeServerEvent)
CLIENT = TypeAdapter(RealtimeClientEventParam)
BETA_CLIENT = TypeAdapter(BetaClientEventParam)
_ids = itertools.count(1)

Event = dict[str, Any]


def _event(type_: str, **fields: Any) -> Event:
    event = {"type": type_, "event_id": f"event_{next(_ids)}", **fields}
    SERVER.validate_python(event)  # a malformed script fails here, not in the bridge
    return event


@dataclass(frozen=True, slots=True)
class Call:
    """One function call of a scripted response."""

    call_id: str
    name: str
    arguments: str

    @classmethod
    def of(cls, call_id: str, name: str, params: dict[str, Any]) -> Call:
        return cls(call_id, name, json.dumps(params))

    def item(self, status: str) -> dict[str, Any]:
        return {
            "id": f"item_{self.call_id}",
            "object": "realtime.item",
            "type": "function_call",
            "status": status,
            "name": self.name,
            "call_id": self.call_id,
            "arguments": self.arguments if status != "in_progress" else "",
        }


def _response(response_id: str, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": response_id, "object": "realtime.response", "status": status, "output": output}


def response_created(response_id: str) -> Event:
    """``response.created``: a response starts (in_progress, no output yet)."""
    return _event("response.created", response=_response(response_id, "in_progress", []))


def response_done(
    response_id: str, output: list[dict[str, Any]], status: str = "completed"
) -> Event:
    """``response.done`` with every output item of the response."""
    return _event("response.done", response=_response(response_id, status, output))


def call_events(response_id: str, index: int, call: Call, status: str = "completed") -> list[Event]:
    """The events of one streamed function call, ``output_index`` ``index``."""
    where = {"response_id": response_id, "output_index": index}
    half = len(call.arguments) // 2
    item_id = f"item_{call.call_id}"
    streamed = [
        _event("response.output_item.added", item=call.item("in_progress"), **where),
        _event(
            "response.function_call_arguments.delta",
            item_id=item_id,
            call_id=call.call_id,
            delta=call.arguments[:half],
            **where,
        ),
        _event(
            "response.function_call_arguments.delta",
            item_id=item_id,
            call_id=call.call_id,
            delta=call.arguments[half:],
            **where,
        ),
        _event(
            "response.function_call_arguments.done",
            item_id=item_id,
            call_id=call.call_id,
            name=call.name,
            arguments=call.arguments,
            **where,
        ),
    ]
    return [*streamed, _event("response.output_item.done", item=call.item(status), **where)]


def calling_turn(response_id: str, *calls: Call, status: str = "completed") -> list[Event]:
    """A whole response that calls ``calls`` (parallel when several), ending in response.done."""
    item_status = "completed" if status == "completed" else "incomplete"
    events = [response_created(response_id)]
    for index, call in enumerate(calls):
        events += call_events(response_id, index, call, item_status)
    return [*events, response_done(response_id, [c.item(item_status) for c in calls], status)]


def spoken_item(response_id: str, text: str) -> dict[str, Any]:
    return {
        "id": f"item_{response_id}_msg",
        "object": "realtime.item",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_audio", "transcript": text}],
    }


def speaking_start(response_id: str, text: str) -> list[Event]:
    """The first half of a spoken answer: the response and its message item are open."""
    item = {**spoken_item(response_id, text), "status": "in_progress", "content": []}
    where = {"response_id": response_id, "output_index": 0}
    return [response_created(response_id), _event("response.output_item.added", item=item, **where)]


def speaking_end(response_id: str, text: str) -> list[Event]:
    """The second half of a spoken answer, ending in response.done."""
    item = spoken_item(response_id, text)
    where = {"response_id": response_id, "output_index": 0}
    return [
        _event("response.output_item.done", item=item, **where),
        response_done(response_id, [item]),
    ]


def spoken_turn(response_id: str, text: str) -> list[Event]:
    """A whole spoken answer without function calls."""
    return [*speaking_start(response_id, text), *speaking_end(response_id, text)]


def _plain(value: Any) -> Any:
    """A validated TypedDict value as plain dicts and lists (pydantic validates an
    ``Iterable`` field lazily, into an iterator)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return [_plain(item) for item in value]


def check_sent(events: list[Event], *, beta: bool = False) -> list[Event]:
    """Each event the bridge sent is a valid Realtime client event of the GA (or beta)
    interface, unchanged by validation (no missing, extra or coerced key). Returns them."""
    adapter = BETA_CLIENT if beta else CLIENT
    for event in events:
        assert _plain(adapter.validate_python(event)) == event, event
    return events


def output(call_id: str, text: str, event_id: str) -> Event:
    """The bridge's ``conversation.item.create`` of a function call output."""
    return {
        "type": "conversation.item.create",
        "event_id": event_id,
        "item": {"type": "function_call_output", "call_id": call_id, "output": text},
    }


def system_note(text: str, event_id: str) -> Event:
    """The bridge's ``conversation.item.create`` of a system message."""
    return {
        "type": "conversation.item.create",
        "event_id": event_id,
        "item": {
            "type": "message",
            "role": "system",
            "content": [{"type": "input_text", "text": text}],
        },
    }


def respond(event_id: str) -> Event:
    """The bridge's ``response.create``."""
    return {"type": "response.create", "event_id": event_id}


def session_update(tools: list[dict[str, Any]], event_id: str, *, beta: bool = False) -> Event:
    """The bridge's ``session.update`` carrying ``tools``."""
    session: dict[str, Any] = {"tools": tools}
    if not beta:
        session["type"] = "realtime"
    return {"type": "session.update", "event_id": event_id, "session": session}


def transcript_done(response_id: str, text: str) -> Event:
    """``response.output_audio_transcript.done``: the transcript of what the model said."""
    return _event(
        "response.output_audio_transcript.done",
        response_id=response_id,
        item_id=f"item_{response_id}_msg",
        output_index=0,
        content_index=0,
        transcript=text,
    )
