"""Configuration: one YAML file plus environment overrides (SPEC O4).

Precedence, highest first: keyword arguments (tests, CLI flags), environment variables
``TOOLBUS_<SECTION>__<KEY>`` (e.g. ``TOOLBUS_SERVER__PORT=9000``,
``TOOLBUS_LIMITS__INVOKE_RATE=50``), the YAML file, then the defaults below. Every
default is documented on its field and in ``docs/configuration.md``. Times are in
seconds, sizes in bytes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

DEMO_DIR = Path(__file__).resolve().parent / "demo"


class _Section(BaseModel):
    # SPEC O4: out-of-range values are refused at start with the key named; the ranges
    # are Field constraints below (``ge``/``gt``/``le``), and NaN or infinity is never a
    # meaningful time, rate or size.
    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False
    )


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    """Address to bind; ``0.0.0.0`` for every interface."""
    port: int = Field(8765, ge=0, le=65535)
    """TCP port; 0 picks a free one (the bound port is logged and printed)."""
    origins: list[str] = Field(default_factory=list)
    """Origin allowlist for browser connections (SPEC S2); an upgrade from any other
    origin is refused 403. Empty: only the server's own origin (``http://host:port``,
    ``localhost`` and ``127.0.0.1`` forms), so on ``host: 0.0.0.0`` a page loaded from
    another machine (``http://192.168.1.5:8765``) is refused until its origin is listed
    here; ``serve`` prints the allowlist, and says so on a non-loopback host. Requests
    without an Origin header (non-browser clients) are always allowed: CSWSH needs a
    browser."""
    max_message_bytes: int = Field(1 << 20, ge=1024)
    """Largest frame or fragmented message either side sends (SPEC E2): a bigger client
    message closes 1009; an invoke's params or a handler's result may use all of it but
    the envelope of its tool_start or result frame (256 bytes plus call_id and tool).
    Every profile's catalog frame must fit it too: start refuses, a hot reload is kept
    out (docs/protocol.md)."""
    max_depth: int = Field(32, ge=1)
    """Deepest JSON nesting accepted in a client message (SPEC E1)."""
    hello_timeout: float = Field(10.0, gt=0)
    """Seconds a new connection has to send ``hello`` (SPEC S1); else close 1008."""
    heartbeat_interval: float = Field(20.0, ge=0)
    """Seconds between WebSocket pings (SPEC S3); 0 disables."""
    heartbeat_timeout: float = Field(20.0, ge=0)
    """Seconds to wait for a pong before the peer is declared dead (SPEC S3)."""
    max_outbound_bytes: int = Field(8 << 20, ge=1)
    """Bytes queued for one socket before it is closed 1013 as a slow consumer (SPEC D5);
    also the bound of the events held for one socket while the store cannot commit
    (SPEC D6), past which it is closed 1013 the same way."""
    drain_retry_after: float = Field(1.0, ge=0)
    """``retry_after`` sent in ``reconnect`` on drain (SPEC S4), in seconds."""
    drain_grace: float = Field(10.0, ge=0)
    """Seconds a drain (SPEC S4) waits for plain handlers of jobs and calls, which cannot
    be interrupted, to return: one that returns in time is reported as it ended (a job
    ``done``, a call its ``result``); past it, a job ends ``failed`` ``interrupted`` and
    the handler dies with the process (SPEC J6). Jobs still ``queued`` stay queued and
    run after the restart. A node among several (SPEC N6) gives every job and running
    call, ``async def`` ones too, this long, after its clients moved on. Calls waiting
    for approval never wait for it: they are handed off. 0: no wait. The sockets' closes
    follow: a client that does not read holds its close up to 5 s (for the frames queued
    before the hint) plus the close handshake (``min(heartbeat_timeout, 10)`` s), so a
    drain can take this grace plus 15 s; give a supervisor's stop timeout that much."""
    max_socket_lifetime: float = Field(0.0, ge=0)
    """Seconds a socket may stay open; then it gets the drain's ``reconnect`` hint
    (``retry_after`` 0) and a 1012 close, and the client resumes, through the load
    balancer, on whichever node it picks (SPEC N6: load moves onto nodes added later).
    0: no limit."""
    max_socket_lifetime_jitter: float = Field(0.1, ge=0, lt=1)
    """Fraction of ``max_socket_lifetime`` taken off at random, per socket, so sockets
    opened together do not all end together: each lives between ``(1 - jitter) *
    max_socket_lifetime`` and ``max_socket_lifetime`` seconds (SPEC N6)."""
    reuse_port: bool = False
    """Bind with ``SO_REUSEPORT`` (Linux) so that several processes share the port;
    ``serve --workers N`` sets it in its workers. Needs a shared store (``store.url``)."""
    loop_stall_threshold: float = Field(0.5, ge=0)
    """Seconds the event loop may go without turning before the watchdog thread logs the
    running tool's name and the loop's stack and counts ``toolbus_loop_stalls_total``
    (SPEC E3: an ``async def`` handler that blocks); 0 disables the watchdog."""


class AuthConfig(_Section):
    token_file: Path | None = None
    """YAML token file (SPEC S2): ``tokens: [{sha256, user, profiles, tenant?}]`` (a
    tenant, when given, is a non-empty string; user, tenant and profiles hold no
    U+0000). With neither a token file nor JWT configured, ``serve`` creates a dev token
    in data_dir."""
    jwt_secret: str | None = None
    """HS256 shared secret for JWT credentials."""
    jwt_public_key_file: Path | None = None
    """PEM public key for RS256 JWT credentials."""
    jwt_audience: str | None = None
    jwt_issuer: str | None = None
    jwt_profiles_claim: str = "profiles"
    """Claim holding the list of profiles a JWT grants; ``sub`` names the user, and the
    optional ``tenant`` claim (a non-empty string) its tenant. A JWT whose ``sub``,
    ``tenant`` or a profile holds U+0000 is refused (``auth_failed``)."""
    expiry_warning: float = Field(60.0, ge=0)
    """Seconds before a credential's expiry (JWT ``exp``) that the socket gets
    ``auth.expiring`` (SPEC S6); 0 sends no warning."""
    recheck_interval: float = Field(1.0, gt=0)
    """Seconds between checks that each open session's credential is still accepted
    (a token removed from the token file closes its sessions 4005, SPEC S6)."""


class CatalogConfig(_Section):
    tools: list[Path] = Field(default_factory=lambda: [DEMO_DIR / "tools.yaml"])
    """Tool YAML files or folders (SPEC C1). Default: the bundled demo catalog."""
    profiles: list[Path] = Field(default_factory=lambda: [DEMO_DIR / "profiles.yaml"])
    """Profile YAML files (SPEC C2). Default: the bundled demo profiles."""
    hot_reload: bool = True
    """Watch the files and push new catalogs when they change (SPEC C3)."""
    reload_interval: float = Field(1.0, gt=0)
    """Seconds between checks of the catalog files' modification times."""


class LimitsConfig(_Section):
    max_inflight_calls: int = Field(32, ge=1)
    """Calls running or awaiting approval at once, per session (SPEC E2); a call promoted
    to a job (SPEC I14) counts until its handler returns."""
    invoke_rate: float = Field(50.0, gt=0)
    """Sustained invokes per second per session, re-sends and attaches included (token
    bucket, SPEC E2)."""
    invoke_burst: int = Field(100, ge=1)
    """Invokes a session may send at once before the rate applies."""
    max_sessions_per_user: int = Field(20, ge=1)
    """Live plus resumable sessions one user may hold (SPEC E2); the internal sessions of
    ``/mcp`` (docs/mcp.md) are not counted."""
    max_pending_approvals: int = Field(16, ge=1)
    """Approvals awaiting a decision, per session (SPEC E2)."""
    max_context_bytes: int = Field(16384, ge=0)
    """Size of a session context as JSON (SPEC S5, E2); hello or context.update past it
    is refused ``context_too_large``."""


class CallsConfig(_Section):
    default_timeout: float = Field(30.0, ge=0)
    """Run timeout of a sync tool without its own (SPEC I8); 0 disables."""
    approval_timeout: float = Field(3600.0, gt=0)
    """Seconds an approval may stay pending before it is denied (SPEC A4)."""
    declined_message: str = (
        "The user declined this tool call. Do not retry it; ask the user how to proceed."
    )
    """Text the model gets when a call is declined (SPEC A5)."""
    pre_hooks: list[str] = Field(default_factory=list)
    """``module:function`` pre-execute hooks, in order (SPEC I6)."""
    post_hooks: list[str] = Field(default_factory=list)
    """``module:function`` post-execute hooks, in order (SPEC I10)."""
    worker_threads: int = Field(32, ge=1)
    """Threads for plain (non-async) handlers of sync calls (SPEC S3). Jobs have threads
    of their own (``jobs.worker_threads``), so a quick call never queues behind jobs."""
    threads_per_session: int = Field(8, ge=1)
    """Of ``worker_threads``, how many one session may hold at once (SPEC E3). A handler
    holds its thread until it really returns, even past its timeout."""
    threads_per_user: int = Field(16, ge=1)
    """Of ``worker_threads``, how many one user (tenant + user) may hold at once, over all
    their sessions (SPEC E3)."""
    thread_wait: float = Field(5.0, ge=0)
    """Seconds a sync call waits for a thread when its session's, its user's or the whole
    share is in use; then it ends ``call.error`` ``busy`` without having run (SPEC E3).
    The call's timeout counts from the handler's start."""
    audit_param_bytes: int = Field(1024, ge=0)
    """Parameters are truncated to this many bytes of JSON in audit records (SPEC I11)."""
    call_id_window: float = Field(86400.0, gt=0)
    """Seconds a ``call_id`` stays an idempotency key of its principal (tenant + user),
    whatever happens to the session that used it (SPEC I15): a re-send from any of the
    principal's sessions within it attaches to the call or gets its recorded outcome."""


class JobsConfig(_Section):
    max_concurrent: int = Field(64, ge=1)
    """Jobs running at once across the server (SPEC J1). A sync call promoted to a job
    (SPEC I14) counts, in this bound and the two below, from its promotion until its
    handler returns: it takes its slot at once, even past the bound (its handler runs
    already), and jobs submitted after it wait ``queued`` until the count is back
    under the bound. Every job holds its slots until its handler really returns: a
    plain handler whose job was cancelled or timed out runs on in its thread (it cannot
    be interrupted), and the slots stay taken until it returns."""
    max_per_session: int = Field(8, ge=1)
    """Jobs running at once per session; more wait ``queued`` (SPEC J1)."""
    max_per_user: int = Field(32, ge=1)
    """Jobs running at once per user (tenant + user) over all their sessions, so one user
    cannot take every server slot; more wait ``queued`` (SPEC J1, E3)."""
    worker_threads: int = Field(32, ge=1)
    """Threads for plain (non-async) job handlers, apart from those of sync calls (SPEC
    E3). A job waiting for one stays ``queued``."""
    threads_per_session: int = Field(8, ge=1)
    """Of ``jobs.worker_threads``, how many one session may hold at once (SPEC E3); a
    handler past its timeout holds its thread until it returns."""
    threads_per_user: int = Field(16, ge=1)
    """Of ``jobs.worker_threads``, how many one user (tenant + user) may hold (SPEC E3)."""
    progress_interval: float = Field(0.25, ge=0)
    """Minimum seconds between two ``job.progress`` events of one job (SPEC J2)."""
    retention: float = Field(7 * 24 * 3600.0, ge=0)
    """Seconds finished jobs stay readable with job.get/job.list (SPEC D2)."""


class SessionsConfig(_Section):
    resume_window: float = Field(120.0, ge=0)
    """Seconds a disconnected session stays resumable (SPEC D2, D3)."""
    max_unacked_events: int = Field(10_000, ge=1)
    """Unacknowledged events kept per session; older ones are dropped (SPEC D2)."""
    max_call_records: int = Field(10_000, ge=0)
    """Finished calls per session whose outcome the session keeps for its own re-sends
    (SPEC I12); an older call_id re-sent still gets its recorded outcome from the
    principal's call ledger within ``calls.call_id_window`` (SPEC I15), never a new run."""
    purge_interval: float = Field(60.0, gt=0)
    """Seconds between purges of expired sessions and old jobs (SPEC D2); a failing
    purge is logged and retried with backoff."""


class StoreConfig(_Section):
    unavailable_after: float = Field(1.0, ge=0)
    """Seconds commits may keep failing (store locked, busy, disk full) before new calls
    are refused ``unavailable`` and ``/readyz`` answers 503 (SPEC D6). Events staged
    meanwhile are held, never sent, and committed when the store recovers."""
    retry_max: float = Field(0.5, gt=0)
    """Longest pause, in seconds, between two attempts to commit a failed batch; the
    pause starts at 5 ms and doubles (SPEC D6)."""
    settle_after: float = Field(0.05, gt=0)
    """SQLite store: seconds from a flush whose events were made durable by one append
    to the store's journal (``toolbus.db-intent``) to the commit of the file it owes,
    one commit for every flush of that time; a read of the file, a full journal or a
    clean stop commits sooner (SPEC D1). Unused on PostgreSQL, which commits each flush."""
    url: str | None = Field(None, pattern=r"^postgres(ql)?://")
    """``None``: the embedded SQLite store in ``data_dir``. A ``postgresql://`` URL: the
    PostgreSQL store, shared by every node pointed at it (SPEC N1; docs/deploy.md). Env:
    ``TOOLBUS_STORE__URL``."""


class NodesConfig(_Section):
    """Several nodes on one PostgreSQL store (SPEC N2-N4; docs/deploy.md). Unused with
    the embedded SQLite store (one node per data folder, SPEC O5)."""

    node_id: str | None = Field(None, min_length=1, max_length=100, pattern=r"^[\x21-\x7e]+$")
    """This process's node id (printable ASCII, no spaces). ``None``: generated at start,
    ``host-pid-random``, so that a restarted process is a new node. Logged at start
    with a PostgreSQL store (``node ... registered``); the SQLite store, one process,
    has no use for it."""
    lease_interval: float = Field(1.0, gt=0)
    """Seconds between two renewals of this node's liveness lease (SPEC N4)."""
    lease_ttl: float = Field(5.0, gt=0)
    """Seconds a lease lasts from its last renewal (the database's clock); must exceed
    ``lease_interval``. Also how long a node that got the database back after losing it
    waits before it judges other nodes dead (SPEC N7)."""

    @model_validator(mode="after")
    def _ttl_outlasts_interval(self) -> NodesConfig:
        if self.lease_ttl <= self.lease_interval:
            raise ValueError("lease_ttl must be greater than lease_interval")
        return self


class LogConfig(_Section):
    level: str = "INFO"
    """Operational log level: DEBUG, INFO, WARNING, ERROR or CRITICAL (any case)."""
    json_logs: bool = True
    """Structured JSON lines on stderr (SPEC O3)."""
    audit_file: Path | None = None
    """Append audit records (SPEC I11) as JSON lines here; default: the data folder."""

    @field_validator("level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.upper() not in _LEVELS:
            raise ValueError(f"unknown log level {value!r}; one of {', '.join(_LEVELS)}")
        return value.upper()


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class Settings(BaseSettings):
    """The whole configuration (SPEC O4). Load with :func:`load_settings`."""

    model_config = SettingsConfigDict(
        env_prefix="TOOLBUS_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )

    data_dir: Path = Path("toolbus-data")
    """Folder for the SQLite store, audit log, dev token and tool data (SPEC O1)."""
    server: ServerConfig = Field(default_factory=ServerConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    catalog: CatalogConfig = Field(default_factory=CatalogConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    calls: CallsConfig = Field(default_factory=CallsConfig)
    jobs: JobsConfig = Field(default_factory=JobsConfig)
    sessions: SessionsConfig = Field(default_factory=SessionsConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    nodes: NodesConfig = Field(default_factory=NodesConfig)
    log: LogConfig = Field(default_factory=LogConfig)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            _UnknownSections(settings_cls),
            _ConfigFile(settings_cls),
        )


ENV_PREFIX = "TOOLBUS_"


class _UnknownSections(PydanticBaseSettingsSource):
    """``TOOLBUS_<SECTION>__<KEY>`` variables whose section is no section (SPEC O4).

    pydantic-settings reads only the variables of known fields, so ``TOOLBUS_SEVER__PORT``
    would be ignored without a word while ``TOOLBUS_SERVER__PROT`` is refused. This
    source hands such a section to the model as it is, and ``extra="forbid"`` refuses it
    as an unknown key like a misspelt key. A ``TOOLBUS_`` name without ``__`` is left
    alone: the tests and benchmarks have their own (``TOOLBUS_TEST_MS``).
    """

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        unknown: dict[str, Any] = {}
        for name, value in os.environ.items():
            upper = name.upper()
            if not upper.startswith(ENV_PREFIX) or "__" not in upper:
                continue
            section, _, key = upper.removeprefix(ENV_PREFIX).lower().partition("__")
            if section and section not in self.settings_cls.model_fields:
                unknown.setdefault(section, {})[key] = value
        return unknown


_PATH_KEYS: tuple[tuple[str, ...], ...] = (
    ("data_dir",),
    ("auth", "token_file"),
    ("auth", "jwt_public_key_file"),
    ("catalog", "tools"),
    ("catalog", "profiles"),
    ("log", "audit_file"),
)
"""Keys holding paths; a relative one in the config file is relative to that file."""


class _ConfigFile(YamlConfigSettingsSource):
    """The YAML config file, with relative paths resolved against the file's folder, so
    ``toolbus serve --config deploy/toolbus.yaml`` works from any working directory."""

    def __call__(self) -> dict[str, Any]:
        data = super().__call__()
        raw = self.yaml_file_path
        if not data or raw is None or not isinstance(raw, str | Path):
            return data
        base = Path(raw).resolve().parent
        for keys in _PATH_KEYS:
            section: Any = data
            for key in keys[:-1]:
                section = section.get(key) if isinstance(section, dict) else None
            if isinstance(section, dict) and keys[-1] in section:
                section[keys[-1]] = _anchor(section[keys[-1]], base)
        return data


def _anchor(value: Any, base: Path) -> Any:
    if isinstance(value, list):
        return [_anchor(item, base) for item in value]
    if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
        return str(base / value)
    if isinstance(value, str):
        return str(Path(value).expanduser())
    return value


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Build the configuration (SPEC O4).

    Args:
        path: a YAML config file, or ``None`` for defaults plus environment.
        **overrides: top-level keys (sections as dicts), highest precedence.

    Returns:
        The frozen settings.

    Raises:
        pydantic.ValidationError: a key is unknown or a value has the wrong type; the
            message names the key.
        FileNotFoundError: ``path`` does not exist.
        IsADirectoryError: ``path`` is a folder.
        yaml.YAMLError: the file is not valid YAML.
        pydantic_settings.SettingsError: an environment variable cannot be parsed.
    """
    if path is None:
        return Settings(**overrides)
    if not path.exists():
        raise FileNotFoundError(path)
    if path.is_dir():
        raise IsADirectoryError(path)

    class FileSettings(Settings):
        model_config = SettingsConfigDict(yaml_file=path)

    return FileSettings(**overrides)


def reference_markdown() -> str:
    """``docs/configuration.md``, generated from the fields above (a test keeps it in step).

    Returns:
        Markdown: one table per section with key, default, environment variable and
        meaning.
    """
    lines = [
        "# Configuration reference",
        "",
        "Generated from `gateway/config.py` (`python -c 'from gateway.config import "
        'reference_markdown as r; print(r(), end="")\' > docs/configuration.md`);',
        "`tests/gateway/test_config.py` fails when this file is out of date.",
        "",
        "toolbus reads one YAML file (`toolbus serve --config FILE`), then environment",
        "variables `TOOLBUS_<SECTION>__<KEY>` override it (SPEC O4). Times are in seconds,",
        "sizes in bytes. Relative paths in the file are relative to the file's folder;",
        "relative paths from the environment or the command line are relative to the",
        "working directory. A list or a mapping set from the environment is written as",
        "JSON (`TOOLBUS_SERVER__ORIGINS='[\"https://a.example\"]'`). A misspelt section or",
        "key is refused with the closest name, in the file and in a variable's name alike",
        "(`TOOLBUS_SEVER__PORT`: `sever: unknown key (did you mean server?)`). Example:",
        "",
        "```yaml",
        "data_dir: /var/lib/toolbus",
        'server: {host: 0.0.0.0, port: 8765, origins: ["https://app.example"]}',
        "auth: {token_file: /etc/toolbus/tokens.yaml}",
        "catalog: {tools: [/etc/toolbus/tools], profiles: [/etc/toolbus/profiles.yaml]}",
        "limits: {invoke_rate: 20}",
        "```",
        "",
        "| key | default | environment | meaning |",
        "| --- | --- | --- | --- |",
        _row("data_dir", Settings.model_fields["data_dir"], "TOOLBUS_DATA_DIR"),
    ]
    for section, info in Settings.model_fields.items():
        model = info.annotation
        if not (isinstance(model, type) and issubclass(model, _Section)):
            continue
        lines += [
            "",
            f"## `{section}`",
            "",
            "| key | default | environment | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for key, field in model.model_fields.items():
            env = f"TOOLBUS_{section.upper()}__{key.upper()}"
            lines.append(_row(f"{section}.{key}", field, env))
    return "\n".join(lines) + "\n"


def _row(key: str, field: Any, env: str) -> str:
    default = field.get_default(call_default_factory=True)
    if isinstance(default, list):
        shown = "[" + ", ".join(_show(v) for v in default) + "]"
    else:
        shown = _show(default)
    text = " ".join((field.description or "").split()).replace("|", "\\|")
    bounds = _bounds(field)
    if bounds:
        text += f" Range: {bounds}."
    return f"| `{key}` | `{shown}` | `{env}` | {text} |"


_BOUND_SIGNS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def _bounds(field: Any) -> str:
    """A field's ``Field(ge=…, gt=…, le=…)`` constraints as text, e.g. ``>= 0, <= 65535``."""
    parts = []
    for item in field.metadata:
        for attr, sign in _BOUND_SIGNS:
            value = getattr(item, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
    return ", ".join(parts)


def _show(value: Any) -> str:
    if isinstance(value, Path) and value.is_absolute() and DEMO_DIR in value.parents:
        return f"<demo>/{value.name}"
    return str(value)
