"""toolbus client library: the Python side of protocol ``toolbus.v1`` (SPEC K1, K3).

``toolbus.connect(url, token=..., profile=...)`` gives a :class:`Client`; see
``docs/client.md``. Scripted conversations live in :mod:`toolbus.script` (SPEC K3), the
interactive console in :mod:`toolbus.interactive`.
"""

from __future__ import annotations

from protocol.messages import Decision, ElicitAction, ElicitRequest, JobInfo, Result, ToolInfo
from toolbus.client import Client, connect
from toolbus.errors import (
    Busy,
    CallFailed,
    Cancelled,
    ConnectFailed,
    DeniedByHook,
    DeniedCapability,
    DeniedDangerous,
    DeniedScope,
    HandlerError,
    InvalidParams,
    RequestRefused,
    RequestTimeout,
    SessionClosed,
    StaleCatalog,
    Timeout,
    ToolbusClientError,
    Unavailable,
    UnknownTool,
    UsageError,
    WrongRoute,
)
from toolbus.handles import ApprovalRequest, Backoff, EventStream, JobEvent, JobHandle, JobOutcome

__all__ = [
    "ApprovalRequest",
    "Backoff",
    "Busy",
    "CallFailed",
    "Cancelled",
    "Client",
    "ConnectFailed",
    "Decision",
    "DeniedByHook",
    "DeniedCapability",
    "DeniedDangerous",
    "DeniedScope",
    "ElicitAction",
    "ElicitRequest",
    "EventStream",
    "HandlerError",
    "InvalidParams",
    "JobEvent",
    "JobHandle",
    "JobInfo",
    "JobOutcome",
    "RequestRefused",
    "RequestTimeout",
    "Result",
    "SessionClosed",
    "StaleCatalog",
    "Timeout",
    "ToolInfo",
    "ToolbusClientError",
    "Unavailable",
    "UnknownTool",
    "UsageError",
    "WrongRoute",
    "connect",
]
