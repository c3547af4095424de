"""Wire messages of protocol v1 (subprotocol ``toolbus.v1``) as frozen pydantic models.

Every message is one JSON object in one WebSocket text frame, with a ``type``
discriminator. Client requests carry an optional ``id`` (1-128 characters) that the
server echoes on its direct reply or error. Server events that a client must not miss
(SPEC D1) carry ``seq``: per session, gap-free, starting at 1; they are the members of
:data:`DurableEvent`. Replies (``welcome``, ``error``, ``confirm.result``, ``grants``,
``job``, ``jobs``, ``context``, ``reconnect``, ``auth.expiring``, ``auth.refreshed``)
carry no ``seq`` and are not replayed.

A durable event is built without ``seq`` (its default, :data:`UNSEQUENCED`) and the
server's session log assigns the next number when it emits it (``Session.emit``, SPEC
D1). On the wire ``seq`` is required: the codec refuses a durable event without it and
the JSON Schema lists it as required.

Times on the wire are Unix time in seconds (float). Field names follow the SPEC
(ids indexed in docs/protocol.md, "SPEC ids").

Direction unions: :data:`ClientMessage` (client to server), :data:`ServerMessage`
(server to client). The codec (:mod:`protocol.codec`) holds the one ``TypeAdapter``
for each.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Final, Literal, NewType, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from protocol.errors import ErrorCode

SessionId = NewType("SessionId", str)
CallId = NewType("CallId", str)
ApprovalId = NewType("ApprovalId", str)
JobId = NewType("JobId", str)

NAME_MAX = 128
"""Characters a request id, call id or tool name may have (SPEC E1)."""
RequestId = Annotated[StrictStr, Field(min_length=1, max_length=NAME_MAX)]
Name = Annotated[StrictStr, Field(min_length=1, max_length=NAME_MAX)]
Seq = Annotated[StrictInt, Field(ge=1)]
SeqOrZero = Annotated[StrictInt, Field(ge=0)]
Time = StrictFloat

UNSEQUENCED: Final = 0
"""``seq`` of a durable event not yet emitted: ``Session.emit`` assigns the session's next
``seq`` (SPEC D1) when it encodes the event. Never on the wire (``seq`` >= 1 there)."""
JsonObject = dict[StrictStr, Any]


class Decision(StrEnum):
    """A client's answer to an approval request (SPEC A3)."""

    ALLOW = "allow"
    DENY = "deny"
    ALLOW_ALWAYS = "allow_always"


class Resolution(StrEnum):
    """How an approval ended (SPEC A4, A6)."""

    ALLOWED = "allowed"
    DENIED = "denied"


class ResolutionReason(StrEnum):
    """Why an approval ended (SPEC A4): the typed reason on ``tool.resolved``."""

    USER = "user"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    DISCONNECTED = "disconnected"


class ElicitAction(StrEnum):
    """The user's answer to an ``elicit.request`` (SPEC M3; MCP elicitation actions)."""

    ACCEPT = "accept"
    DECLINE = "decline"
    CANCEL = "cancel"


class NotAcceptedReason(StrEnum):
    """Why a ``tool.confirm`` changed nothing (SPEC A3)."""

    UNKNOWN = "unknown"
    ALREADY_DECIDED = "already_decided"
    EXPIRED = "expired"
    NOT_YOURS = "not_yours"


class JobState(StrEnum):
    """Job lifecycle (SPEC J1): queued -> running -> done | failed | cancelled."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class CatalogReason(StrEnum):
    """Why a ``catalog`` event was sent (SPEC C3, S5, I13)."""

    INITIAL = "initial"
    REQUESTED = "requested"
    RELOAD = "reload"
    CONTEXT = "context"
    STALE = "stale"


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)


# --------------------------------------------------------------------------- shared parts


class ToolStarts(StrEnum):
    """Which started calls send ``tool_start`` (SPEC A6): hello option ``tool_start``."""

    ALL = "all"
    """Every started call (the default)."""
    GATED = "gated"
    """Only calls that wait for approval (SPEC A1, A2): an ungated call then sends just
    its terminal reply, one frame and one logged event fewer."""


class Options(_Message):
    """Session options chosen in ``hello`` (SPEC S1, A1, A6). ``tool_start`` ``None``
    means ``all``."""

    confirm_tool_calls: StrictBool = False
    tool_start: ToolStarts | None = None


class Limits(_Message):
    """Server limits announced in ``welcome`` (SPEC E2). Sizes in bytes, times in seconds."""

    max_message_bytes: StrictInt
    heartbeat_interval: StrictFloat
    heartbeat_timeout: StrictFloat
    max_inflight_calls: StrictInt
    invoke_rate: StrictFloat
    """Sustained invokes per second per session."""
    invoke_burst: StrictInt
    max_pending_approvals: StrictInt
    max_sessions_per_user: StrictInt
    resume_window: StrictFloat
    max_unacked_events: StrictInt
    max_context_bytes: StrictInt
    """Largest session context, as JSON (SPEC S5)."""


class ToolInfo(_Message):
    """One tool as a session's catalog shows it (SPEC C3)."""

    name: StrictStr
    description: StrictStr
    parameters: JsonObject
    mode: Literal["sync", "async", "client"]
    dangerous: StrictBool = False
    requires_approval: StrictBool = False
    category: StrictStr | None = None
    long_running: StrictBool = False
    dispatch_message: StrictStr | None = None


class Violation(_Message):
    """One JSON Schema violation: where (RFC 6901 JSON pointer into params) and what."""

    pointer: StrictStr
    message: StrictStr
    keyword: StrictStr | None = None


class JobError(_Message):
    code: StrictStr
    message: StrictStr


class JobInfo(_Message):
    """A job as ``job.get`` / ``job.list`` show it (SPEC J1, J3)."""

    job_id: StrictStr
    tool: StrictStr
    state: JobState
    created_at: Time
    started_at: Time | None = None
    finished_at: Time | None = None
    progress: StrictFloat | None = None
    progress_message: StrictStr | None = None
    summary: StrictStr | None = None
    artifacts: list[JsonObject] = Field(default_factory=list)
    result: JsonObject | None = None
    error: JobError | None = None
    call_id: StrictStr | None = None


# --------------------------------------------------------------------- client -> server


class Hello(_Message):
    """First message of every connection (SPEC S1, S2, D3)."""

    type: Literal["hello"] = "hello"
    id: RequestId | None = None
    token: StrictStr | None = Field(default=None, repr=False)
    profile: Name | None = None
    context: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    options: Options = Field(default_factory=Options)
    session_id: StrictStr | None = None
    resume_token: StrictStr | None = Field(default=None, repr=False)
    last_seq: SeqOrZero | None = None


class CatalogGet(_Message):
    """Ask for the catalog; ``version`` is the client's copy (SPEC C3)."""

    type: Literal["catalog.get"] = "catalog.get"
    id: RequestId | None = None
    version: StrictStr | None = None


class Invoke(_Message):
    """Call a tool (SPEC I1-I14). ``params`` omitted is validated as ``{}``."""

    type: Literal["invoke"] = "invoke"
    id: RequestId | None = None
    call_id: RequestId
    tool: Name
    params: JsonObject | None = None
    catalog_version: StrictStr | None = None


class CallCancel(_Message):
    """Cancel a running or approval-pending call (SPEC I8, A4)."""

    type: Literal["call.cancel"] = "call.cancel"
    id: RequestId | None = None
    call_id: RequestId


class ToolConfirm(_Message):
    """Answer an approval request (SPEC A3)."""

    type: Literal["tool.confirm"] = "tool.confirm"
    id: RequestId | None = None
    approval_id: Annotated[StrictStr, Field(min_length=1, max_length=256)]
    decision: Decision


class ElicitAnswer(_Message):
    """Answer an ``elicit.request`` (SPEC M3): ``content`` matches the requested schema
    and is sent only with ``accept``."""

    type: Literal["elicit.answer"] = "elicit.answer"
    id: RequestId | None = None
    elicitation_id: Annotated[StrictStr, Field(min_length=1, max_length=256)]
    action: ElicitAction
    content: JsonObject | None = None


class GrantsList(_Message):
    """List this session's "always allow" grants (SPEC A3)."""

    type: Literal["grants.list"] = "grants.list"
    id: RequestId | None = None


class GrantsRevoke(_Message):
    """Revoke an "always allow" grant for ``tool`` (SPEC A3)."""

    type: Literal["grants.revoke"] = "grants.revoke"
    id: RequestId | None = None
    tool: Name


class JobGet(_Message):
    type: Literal["job.get"] = "job.get"
    id: RequestId | None = None
    job_id: RequestId


class JobList(_Message):
    """List the caller's own jobs, newest first (SPEC J3)."""

    type: Literal["job.list"] = "job.list"
    id: RequestId | None = None
    status: JobState | None = None
    limit: Annotated[StrictInt, Field(ge=1, le=1000)] = 100


class JobCancel(_Message):
    type: Literal["job.cancel"] = "job.cancel"
    id: RequestId | None = None
    job_id: RequestId


class Ack(_Message):
    """Cumulative acknowledgement: every event with ``seq`` <= this was processed (SPEC D2)."""

    type: Literal["ack"] = "ack"
    seq: SeqOrZero


class ContextUpdate(_Message):
    """Change the session context (SPEC S5): keys set; a ``null`` value removes the key."""

    type: Literal["context.update"] = "context.update"
    id: RequestId | None = None
    context: dict[StrictStr, StrictStr | None]


class Bye(_Message):
    """End the session for good: pending approvals are denied, no resume (SPEC A4)."""

    type: Literal["bye"] = "bye"
    id: RequestId | None = None


class AuthRefresh(_Message):
    """Replace the session's credential on the open socket (SPEC S6).

    ``token`` must name the same principal (tenant, user) and still grant the session's
    profile; else an ``error`` (``auth_failed``, ``principal_mismatch``,
    ``profile_denied``) answers and the old credential and its expiry stand.
    """

    type: Literal["auth.refresh"] = "auth.refresh"
    id: RequestId | None = None
    token: StrictStr = Field(repr=False)


ClientMessage = Annotated[
    Hello
    | CatalogGet
    | Invoke
    | CallCancel
    | ToolConfirm
    | ElicitAnswer
    | GrantsList
    | GrantsRevoke
    | JobGet
    | JobList
    | JobCancel
    | Ack
    | ContextUpdate
    | Bye
    | AuthRefresh,
    Field(discriminator="type"),
]

# --------------------------------------------------------------------- server -> client


class Welcome(_Message):
    """Answer to ``hello`` (SPEC S1, D3). ``last_seq`` is the newest event in the log."""

    type: Literal["welcome"] = "welcome"
    id: RequestId | None = None
    protocol: StrictStr
    session_id: StrictStr
    resume_token: StrictStr
    resumed: StrictBool
    last_seq: SeqOrZero
    user: StrictStr
    profile: StrictStr
    limits: Limits


class Catalog(_Message):
    """The session's catalog (SPEC C3): only the tools visible to this profile and context."""

    type: Literal["catalog"] = "catalog"
    seq: Seq = UNSEQUENCED
    id: RequestId | None = None
    version: StrictStr
    reason: CatalogReason
    tools: list[ToolInfo]


class CatalogNotModified(_Message):
    """Answer to ``catalog.get`` whose ``version`` is current (SPEC C3)."""

    type: Literal["catalog.not_modified"] = "catalog.not_modified"
    id: RequestId | None = None
    version: StrictStr


class ToolStart(_Message):
    """A tool is starting; with ``approval_id`` it waits for ``tool.confirm`` (SPEC A2, A6)."""

    type: Literal["tool_start"] = "tool_start"
    seq: Seq = UNSEQUENCED
    call_id: StrictStr
    tool: StrictStr
    params: JsonObject
    approval_id: StrictStr | None = None
    expires_at: Time | None = None


class ElicitRequest(_Message):
    """A running tool (a mounted MCP server's) asks the user for input (SPEC M3); the
    client answers ``elicit.answer`` before ``expires_at`` or the answer is ``cancel``."""

    type: Literal["elicit.request"] = "elicit.request"
    seq: Seq = UNSEQUENCED
    call_id: StrictStr
    tool: StrictStr
    elicitation_id: StrictStr
    message: StrictStr
    requested_schema: JsonObject
    expires_at: Time


class ToolResolved(_Message):
    """An approval was settled (SPEC A4, A6)."""

    type: Literal["tool.resolved"] = "tool.resolved"
    seq: Seq = UNSEQUENCED
    call_id: StrictStr
    approval_id: StrictStr
    tool: StrictStr
    resolution: Resolution
    reason: ResolutionReason
    always: StrictBool = False


class Result(_Message):
    """Terminal reply of a sync call (SPEC I8, I10, A5).

    ``declined`` is true when the user denied the call: ``result`` then carries the
    configured text for the model. ``replaced`` is true when a post-execute hook
    replaced the handler's value (SPEC I10).
    """

    type: Literal["result"] = "result"
    seq: Seq = UNSEQUENCED
    call_id: StrictStr
    tool: StrictStr
    result: JsonObject
    declined: StrictBool = False
    replaced: StrictBool = False


class Dispatched(_Message):
    """Terminal reply of an async call, or of a sync call promoted to a job (SPEC I9, I14)."""

    type: Literal["dispatched"] = "dispatched"
    seq: Seq = UNSEQUENCED
    call_id: StrictStr
    tool: StrictStr
    job_id: StrictStr
    message: StrictStr
    promoted: StrictBool = False


class CallError(_Message):
    """Terminal reply of a call that did not produce a result (SPEC I1-I8, I13)."""

    type: Literal["call.error"] = "call.error"
    seq: Seq = UNSEQUENCED
    call_id: StrictStr
    tool: StrictStr
    code: ErrorCode
    message: StrictStr
    suggestions: list[StrictStr] | None = None
    guidance: StrictStr | None = None
    violations: list[Violation] | None = None
    reason_code: StrictStr | None = None
    catalog_version: StrictStr | None = None


class JobProgress(_Message):
    """Progress of a running job (SPEC J2); ``progress`` is a fraction in [0, 1]."""

    type: Literal["job.progress"] = "job.progress"
    seq: Seq = UNSEQUENCED
    job_id: StrictStr
    tool: StrictStr
    progress: StrictFloat | None = None
    message: StrictStr | None = None
    call_id: StrictStr | None = None


class JobDone(_Message):
    """A job finished with a result (SPEC J4)."""

    type: Literal["job.done"] = "job.done"
    seq: Seq = UNSEQUENCED
    job_id: StrictStr
    tool: StrictStr
    ok: Literal[True] = True
    summary: StrictStr
    artifacts: list[JsonObject] = Field(default_factory=list)
    result: JsonObject = Field(default_factory=dict)
    finished_at: Time
    call_id: StrictStr | None = None


class JobFailed(_Message):
    """A job ended in error (SPEC J4, J5)."""

    type: Literal["job.failed"] = "job.failed"
    seq: Seq = UNSEQUENCED
    job_id: StrictStr
    tool: StrictStr
    ok: Literal[False] = False
    summary: StrictStr
    error: JobError
    finished_at: Time
    call_id: StrictStr | None = None


class JobCancelled(_Message):
    """A job was cancelled by its owner or by the end of its session (SPEC J3, J4)."""

    type: Literal["job.cancelled"] = "job.cancelled"
    seq: Seq = UNSEQUENCED
    job_id: StrictStr
    tool: StrictStr
    ok: Literal[False] = False
    summary: StrictStr
    finished_at: Time
    call_id: StrictStr | None = None


class Error(_Message):
    """A request or frame was refused; the connection stays open unless a close follows."""

    type: Literal["error"] = "error"
    id: RequestId | None = None
    code: ErrorCode
    message: StrictStr
    details: JsonObject | None = None


class ConfirmResult(_Message):
    """Answer to ``tool.confirm`` (SPEC A3): ``accepted`` is false with a ``reason``."""

    type: Literal["confirm.result"] = "confirm.result"
    id: RequestId | None = None
    approval_id: StrictStr
    accepted: StrictBool
    reason: NotAcceptedReason | None = None


class ElicitResult(_Message):
    """Answer to ``elicit.answer`` (SPEC M3): ``accepted`` is false with a ``reason``."""

    type: Literal["elicit.result"] = "elicit.result"
    id: RequestId | None = None
    elicitation_id: StrictStr
    accepted: StrictBool
    reason: NotAcceptedReason | None = None


class Grants(_Message):
    """This session's "always allow" tools (SPEC A3), answer to grants.list/revoke."""

    type: Literal["grants"] = "grants"
    id: RequestId | None = None
    tools: list[StrictStr]


class Job(_Message):
    """Answer to ``job.get`` and ``job.cancel`` (SPEC J3)."""

    type: Literal["job"] = "job"
    id: RequestId | None = None
    job: JobInfo


class Jobs(_Message):
    """Answer to ``job.list`` (SPEC J3)."""

    type: Literal["jobs"] = "jobs"
    id: RequestId | None = None
    jobs: list[JobInfo]


class Context(_Message):
    """Answer to ``context.update`` with the whole new context (SPEC S5)."""

    type: Literal["context"] = "context"
    id: RequestId | None = None
    context: dict[StrictStr, StrictStr]


class AuthExpiring(_Message):
    """The session's credential expires soon (SPEC S6): send ``auth.refresh`` before
    ``expires_at`` or the server closes 4004. Not durable (no ``seq``): it concerns the
    live socket only, and a resume authenticates afresh."""

    type: Literal["auth.expiring"] = "auth.expiring"
    expires_at: Time
    seconds_left: StrictFloat
    """Seconds from when the server sent this until ``expires_at``."""


class AuthRefreshed(_Message):
    """Answer to an accepted ``auth.refresh`` (SPEC S6): the new expiry, or ``None``
    when the new credential does not expire."""

    type: Literal["auth.refreshed"] = "auth.refreshed"
    id: RequestId | None = None
    expires_at: Time | None = None


class Reconnect(_Message):
    """Sent before a 1012 close on drain (SPEC S4): reconnect and resume after the delay."""

    type: Literal["reconnect"] = "reconnect"
    reason: StrictStr
    retry_after: StrictFloat
    """Seconds to wait before reconnecting."""


DurableEvent = (
    Catalog
    | ToolStart
    | ToolResolved
    | ElicitRequest
    | Result
    | Dispatched
    | CallError
    | JobProgress
    | JobDone
    | JobFailed
    | JobCancelled
)
"""Events with ``seq``, appended to the session's log before they are sent (SPEC D1)."""

DURABLE_TYPES: tuple[type[BaseModel], ...] = get_args(DurableEvent)
"""The classes of :data:`DurableEvent`: their ``seq`` is required on the wire."""

TerminalReply = Result | Dispatched | CallError
"""The one terminal reply of each call (SPEC I12)."""

ServerMessage = Annotated[
    Welcome
    | Catalog
    | CatalogNotModified
    | ToolStart
    | ToolResolved
    | ElicitRequest
    | Result
    | Dispatched
    | CallError
    | JobProgress
    | JobDone
    | JobFailed
    | JobCancelled
    | Error
    | ConfirmResult
    | ElicitResult
    | Grants
    | Job
    | Jobs
    | Context
    | Reconnect
    | AuthExpiring
    | AuthRefreshed,
    Field(discriminator="type"),
]

CLIENT_TYPES: tuple[type[BaseModel], ...] = (
    Hello,
    CatalogGet,
    Invoke,
    CallCancel,
    ToolConfirm,
    ElicitAnswer,
    GrantsList,
    GrantsRevoke,
    JobGet,
    JobList,
    JobCancel,
    Ack,
    ContextUpdate,
    Bye,
    AuthRefresh,
)
SERVER_TYPES: tuple[type[BaseModel], ...] = (
    Welcome,
    Catalog,
    CatalogNotModified,
    ToolStart,
    ToolResolved,
    ElicitRequest,
    Result,
    Dispatched,
    CallError,
    JobProgress,
    JobDone,
    JobFailed,
    JobCancelled,
    Error,
    ConfirmResult,
    ElicitResult,
    Grants,
    Job,
    Jobs,
    Context,
    Reconnect,
    AuthExpiring,
    AuthRefreshed,
)


def type_name(model: type[BaseModel]) -> str:
    """Return the wire ``type`` string of a message class."""
    default: str = model.model_fields["type"].default
    return default
