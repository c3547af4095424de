"""Golden wire examples of protocol v1: (message object, exact JSON bytes), one per type.

Shared by test_golden.py (both ways through the codec) and test_schema_drift.py (each
example validates against its generated JSON Schema). The bytes are written by hand: a
change to field order, naming or ``None`` handling shows up here first.
"""

from __future__ import annotations

from pydantic import BaseModel

from protocol import messages as m
from protocol.errors import ErrorCode

LIMITS = m.Limits(
    max_message_bytes=1048576,
    heartbeat_interval=20.0,
    heartbeat_timeout=20.0,
    max_inflight_calls=16,
    invoke_rate=10.0,
    invoke_burst=20,
    max_pending_approvals=32,
    max_sessions_per_user=8,
    resume_window=120.0,
    max_unacked_events=10000,
    max_context_bytes=16384,
)
LIMITS_JSON = (
    b'{"max_message_bytes":1048576,"heartbeat_interval":20.0,"heartbeat_timeout":20.0,'
    b'"max_inflight_calls":16,"invoke_rate":10.0,"invoke_burst":20,'
    b'"max_pending_approvals":32,"max_sessions_per_user":8,"resume_window":120.0,'
    b'"max_unacked_events":10000,"max_context_bytes":16384}'
)

JOB_INFO = m.JobInfo(
    job_id="j1",
    tool="report",
    state=m.JobState.DONE,
    created_at=1700000000.0,
    started_at=1700000001.5,
    finished_at=1700000002.25,
    summary="3 pages",
    artifacts=[{"url": "https://x/r.pdf"}],
    result={"pages": 3},
    call_id="c9",
)
JOB_INFO_JSON = (
    b'{"job_id":"j1","tool":"report","state":"done","created_at":1700000000.0,'
    b'"started_at":1700000001.5,"finished_at":1700000002.25,"summary":"3 pages",'
    b'"artifacts":[{"url":"https://x/r.pdf"}],"result":{"pages":3},"call_id":"c9"}'
)

CLIENT_GOLDEN: list[tuple[BaseModel, bytes]] = [
    (
        m.Hello(
            id="h1",
            token="secret",
            profile="voice",
            context={"project_id": "p1", "origin": "https://app"},
            options=m.Options(confirm_tool_calls=True),
            session_id="s1",
            resume_token="rt",
            last_seq=7,
        ),
        b'{"type":"hello","id":"h1","token":"secret","profile":"voice",'
        b'"context":{"project_id":"p1","origin":"https://app"},'
        b'"options":{"confirm_tool_calls":true},"session_id":"s1","resume_token":"rt",'
        b'"last_seq":7}',
    ),
    (m.Hello(), b'{"type":"hello","context":{},"options":{"confirm_tool_calls":false}}'),
    (m.CatalogGet(id="r1", version="v7"), b'{"type":"catalog.get","id":"r1","version":"v7"}'),
    (
        m.Invoke(
            id="r2",
            call_id="c1",
            tool="weather",
            params={"city": "Paris", "days": 3, "units": None, "tags": ["a", 1.5]},
            catalog_version="v7",
        ),
        b'{"type":"invoke","id":"r2","call_id":"c1","tool":"weather",'
        b'"params":{"city":"Paris","days":3,"units":null,"tags":["a",1.5]},'
        b'"catalog_version":"v7"}',
    ),
    (m.CallCancel(call_id="c1"), b'{"type":"call.cancel","call_id":"c1"}'),
    (
        m.ToolConfirm(id="r3", approval_id="ap-1", decision=m.Decision.ALLOW_ALWAYS),
        b'{"type":"tool.confirm","id":"r3","approval_id":"ap-1","decision":"allow_always"}',
    ),
    (
        m.ElicitAnswer(
            id="r9", elicitation_id="el-1", action=m.ElicitAction.ACCEPT, content={"name": "Ada"}
        ),
        b'{"type":"elicit.answer","id":"r9","elicitation_id":"el-1","action":"accept",'
        b'"content":{"name":"Ada"}}',
    ),
    (m.GrantsList(id="r4"), b'{"type":"grants.list","id":"r4"}'),
    (m.GrantsRevoke(tool="weather"), b'{"type":"grants.revoke","tool":"weather"}'),
    (m.JobGet(id="r5", job_id="j1"), b'{"type":"job.get","id":"r5","job_id":"j1"}'),
    (
        m.JobList(status=m.JobState.RUNNING, limit=10),
        b'{"type":"job.list","status":"running","limit":10}',
    ),
    (m.JobCancel(job_id="j1"), b'{"type":"job.cancel","job_id":"j1"}'),
    (m.Ack(seq=42), b'{"type":"ack","seq":42}'),
    (
        m.ContextUpdate(context={"project_id": "p2", "origin": None}),
        b'{"type":"context.update","context":{"project_id":"p2","origin":null}}',
    ),
    (m.Bye(id="r6"), b'{"type":"bye","id":"r6"}'),
    (m.AuthRefresh(id="r7", token="jwt"), b'{"type":"auth.refresh","id":"r7","token":"jwt"}'),
]

SERVER_GOLDEN: list[tuple[BaseModel, bytes]] = [
    (
        m.Welcome(
            id="h1",
            protocol="toolbus.v1",
            session_id="s1",
            resume_token="rt2",
            resumed=True,
            last_seq=9,
            user="ada",
            profile="voice",
            limits=LIMITS,
        ),
        b'{"type":"welcome","id":"h1","protocol":"toolbus.v1","session_id":"s1",'
        b'"resume_token":"rt2","resumed":true,"last_seq":9,"user":"ada","profile":"voice",'
        b'"limits":' + LIMITS_JSON + b"}",
    ),
    (
        m.Catalog(
            seq=1,
            version="v7",
            reason=m.CatalogReason.INITIAL,
            tools=[
                m.ToolInfo(
                    name="weather",
                    description="Forecast",
                    parameters={"type": "object", "properties": {}},
                    mode="sync",
                ),
                m.ToolInfo(
                    name="report",
                    description="Build a report",
                    parameters={"type": "object"},
                    mode="async",
                    dangerous=True,
                    requires_approval=True,
                    category="docs",
                    long_running=True,
                    dispatch_message="Working on it.",
                ),
            ],
        ),
        b'{"type":"catalog","seq":1,"version":"v7","reason":"initial","tools":['
        b'{"name":"weather","description":"Forecast",'
        b'"parameters":{"type":"object","properties":{}},"mode":"sync","dangerous":false,'
        b'"requires_approval":false,"long_running":false},'
        b'{"name":"report","description":"Build a report","parameters":{"type":"object"},'
        b'"mode":"async","dangerous":true,"requires_approval":true,"category":"docs",'
        b'"long_running":true,"dispatch_message":"Working on it."}]}',
    ),
    (
        m.CatalogNotModified(id="r1", version="v7"),
        b'{"type":"catalog.not_modified","id":"r1","version":"v7"}',
    ),
    (
        m.ToolStart(
            seq=2,
            call_id="c1",
            tool="delete_file",
            params={"path": "/tmp/x"},
            approval_id="ap-1",
            expires_at=1700003600.0,
        ),
        b'{"type":"tool_start","seq":2,"call_id":"c1","tool":"delete_file",'
        b'"params":{"path":"/tmp/x"},"approval_id":"ap-1","expires_at":1700003600.0}',
    ),
    (
        m.ToolResolved(
            seq=3,
            call_id="c1",
            approval_id="ap-1",
            tool="delete_file",
            resolution=m.Resolution.DENIED,
            reason=m.ResolutionReason.TIMEOUT,
        ),
        b'{"type":"tool.resolved","seq":3,"call_id":"c1","approval_id":"ap-1",'
        b'"tool":"delete_file","resolution":"denied","reason":"timeout","always":false}',
    ),
    (
        m.ElicitRequest(
            seq=3,
            call_id="c1",
            tool="ev_ask",
            elicitation_id="el-1",
            message="Your name?",
            requested_schema={"type": "object", "properties": {"name": {"type": "string"}}},
            expires_at=1700000000.5,
        ),
        b'{"type":"elicit.request","seq":3,"call_id":"c1","tool":"ev_ask",'
        b'"elicitation_id":"el-1","message":"Your name?","requested_schema":{"type":"object",'
        b'"properties":{"name":{"type":"string"}}},"expires_at":1700000000.5}',
    ),
    (
        m.Result(seq=4, call_id="c1", tool="weather", result={"temp": 21.5}, replaced=True),
        b'{"type":"result","seq":4,"call_id":"c1","tool":"weather","result":{"temp":21.5},'
        b'"declined":false,"replaced":true}',
    ),
    (
        m.Dispatched(
            seq=5, call_id="c2", tool="report", job_id="j1", message="On it.", promoted=True
        ),
        b'{"type":"dispatched","seq":5,"call_id":"c2","tool":"report","job_id":"j1",'
        b'"message":"On it.","promoted":true}',
    ),
    (
        m.CallError(
            seq=6,
            call_id="c3",
            tool="wether",
            code=ErrorCode.INVALID_PARAMS,
            message="2 violations",
            suggestions=["weather"],
            guidance="Use weather.",
            violations=[
                m.Violation(pointer="/days", message="must be >= 1", keyword="minimum"),
                m.Violation(pointer="", message="'city' is required"),
            ],
            reason_code="bad",
            catalog_version="v7",
        ),
        b'{"type":"call.error","seq":6,"call_id":"c3","tool":"wether","code":"invalid_params",'
        b'"message":"2 violations","suggestions":["weather"],"guidance":"Use weather.",'
        b'"violations":[{"pointer":"/days","message":"must be >= 1","keyword":"minimum"},'
        b'{"pointer":"","message":"\'city\' is required"}],"reason_code":"bad",'
        b'"catalog_version":"v7"}',
    ),
    (
        m.JobProgress(seq=7, job_id="j1", tool="report", progress=0.5, message="half"),
        b'{"type":"job.progress","seq":7,"job_id":"j1","tool":"report","progress":0.5,'
        b'"message":"half"}',
    ),
    (
        m.JobDone(
            seq=8,
            job_id="j1",
            tool="report",
            summary="3 pages",
            artifacts=[{"url": "https://x/r.pdf"}],
            result={"pages": 3},
            finished_at=1700000002.25,
            call_id="c2",
        ),
        b'{"type":"job.done","seq":8,"job_id":"j1","tool":"report","ok":true,'
        b'"summary":"3 pages","artifacts":[{"url":"https://x/r.pdf"}],"result":{"pages":3},'
        b'"finished_at":1700000002.25,"call_id":"c2"}',
    ),
    (
        m.JobFailed(
            seq=9,
            job_id="j2",
            tool="report",
            summary="failed",
            error=m.JobError(code="restart", message="server restarted"),
            finished_at=1700000003.0,
        ),
        b'{"type":"job.failed","seq":9,"job_id":"j2","tool":"report","ok":false,'
        b'"summary":"failed","error":{"code":"restart","message":"server restarted"},'
        b'"finished_at":1700000003.0}',
    ),
    (
        m.JobCancelled(seq=10, job_id="j3", tool="report", summary="cancelled", finished_at=1.5),
        b'{"type":"job.cancelled","seq":10,"job_id":"j3","tool":"report","ok":false,'
        b'"summary":"cancelled","finished_at":1.5}',
    ),
    (
        m.Error(
            id="r9",
            code=ErrorCode.EXTRA_FIELD,
            message="x: Extra inputs are not permitted",
            details={"field": "x"},
        ),
        b'{"type":"error","id":"r9","code":"extra_field",'
        b'"message":"x: Extra inputs are not permitted","details":{"field":"x"}}',
    ),
    (
        m.ConfirmResult(
            id="r3", approval_id="ap-1", accepted=False, reason=m.NotAcceptedReason.EXPIRED
        ),
        b'{"type":"confirm.result","id":"r3","approval_id":"ap-1","accepted":false,'
        b'"reason":"expired"}',
    ),
    (
        m.ElicitResult(id="r9", elicitation_id="el-1", accepted=True),
        b'{"type":"elicit.result","id":"r9","elicitation_id":"el-1","accepted":true}',
    ),
    (
        m.Grants(id="r4", tools=["weather", "search"]),
        b'{"type":"grants","id":"r4","tools":["weather","search"]}',
    ),
    (m.Job(id="r5", job=JOB_INFO), b'{"type":"job","id":"r5","job":' + JOB_INFO_JSON + b"}"),
    (
        m.Jobs(jobs=[JOB_INFO, m.JobInfo(job_id="j4", tool="t", state="queued", created_at=2.0)]),
        b'{"type":"jobs","jobs":[' + JOB_INFO_JSON + b',{"job_id":"j4","tool":"t",'
        b'"state":"queued","created_at":2.0,"artifacts":[]}]}',
    ),
    (
        m.Context(id="r7", context={"project_id": "p2"}),
        b'{"type":"context","id":"r7","context":{"project_id":"p2"}}',
    ),
    (
        m.Reconnect(reason="deploy", retry_after=2.5),
        b'{"type":"reconnect","reason":"deploy","retry_after":2.5}',
    ),
    (
        m.AuthExpiring(expires_at=1700000060.0, seconds_left=59.5),
        b'{"type":"auth.expiring","expires_at":1700000060.0,"seconds_left":59.5}',
    ),
    (
        m.AuthRefreshed(id="r7", expires_at=1700003600.0),
        b'{"type":"auth.refreshed","id":"r7","expires_at":1700003600.0}',
    ),
    (m.AuthRefreshed(), b'{"type":"auth.refreshed"}'),
]
