"""Configuration: one YAML file plus environment overrides (SPEC O4).

Precedence, highest first: keyword arguments (tests, CLI flags), environment variables
``TOOLBUS_<SECTION>__<KEY>`` (e.g. ``TOOLBUS_SERVER__PORT=9000``,
``TOOLBUS_LIMITS__INVOKE_RATE=50``), the YAML file, then the defaults below. Every
default is documented on its field and in ``docs/configuration.md``. Times are in
seconds, sizes in bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

DEMO_DIR = Path(__file__).resolve().parent / "demo"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    """Address to bind; ``0.0.0.0`` for every interface."""
    port: int = 8765
    """TCP port; 0 picks a free one (the bound port is logged and printed)."""
    origins: list[str] = Field(default_factory=list)
    """Origin allowlist for browser connections (SPEC S2). Empty: only the server's own
    origin (``http://host:port``, ``localhost`` and ``127.0.0.1`` forms). Requests without
    an Origin header (non-browser clients) are always allowed: CSWSH needs a browser."""
    max_message_bytes: int = 1 << 20
    """Largest accepted frame or fragmented message (SPEC E2); bigger closes 1009."""
    max_depth: int = 32
    """Deepest JSON nesting accepted in a client message (SPEC E1)."""
    hello_timeout: float = 10.0
    """Seconds a new connection has to send ``hello`` (SPEC S1); else close 1008."""
    heartbeat_interval: float = 20.0
    """Seconds between WebSocket pings (SPEC S3); 0 disables."""
    heartbeat_timeout: float = 20.0
    """Seconds to wait for a pong before the peer is declared dead (SPEC S3)."""
    max_outbound_bytes: int = 8 << 20
    """Bytes queued for one socket before it is closed 1013 as a slow consumer (SPEC D5)."""
    drain_retry_after: float = 1.0
    """``retry_after`` sent in ``reconnect`` on drain (SPEC S4), in seconds."""


class AuthConfig(_Section):
    token_file: Path | None = None
    """YAML token file (SPEC S2): ``tokens: [{sha256, user, profiles, tenant?}]``. With
    neither a token file nor JWT configured, ``serve`` creates a dev token in data_dir."""
    jwt_secret: str | None = None
    """HS256 shared secret for JWT credentials."""
    jwt_public_key_file: Path | None = None
    """PEM public key for RS256 JWT credentials."""
    jwt_audience: str | None = None
    jwt_issuer: str | None = None
    jwt_profiles_claim: str = "profiles"
    """Claim holding the list of profiles a JWT grants; ``sub`` names the user."""


class CatalogConfig(_Section):
    tools: list[Path] = Field(default_factory=lambda: [DEMO_DIR / "tools.yaml"])
    """Tool YAML files or folders (SPEC C1). Default: the bundled demo catalog."""
    profiles: list[Path] = Field(default_factory=lambda: [DEMO_DIR / "profiles.yaml"])
    """Profile YAML files (SPEC C2). Default: the bundled demo profiles."""
    hot_reload: bool = True
    """Watch the files and push new catalogs when they change (SPEC C3)."""
    reload_interval: float = 1.0
    """Seconds between checks of the catalog files' modification times."""


class LimitsConfig(_Section):
    max_inflight_calls: int = 32
    """Calls running or awaiting approval at once, per session (SPEC E2)."""
    invoke_rate: float = 50.0
    """Sustained invokes per second per session (token bucket, SPEC E2)."""
    invoke_burst: int = 100
    """Invokes a session may send at once before the rate applies."""
    max_sessions_per_user: int = 20
    """Live plus resumable sessions one user may hold (SPEC E2)."""
    max_pending_approvals: int = 16
    """Approvals awaiting a decision, per session (SPEC E2)."""
    max_context_bytes: int = 16384
    """Size of a session context as JSON (SPEC S5, E2); hello or context.update past it
    is refused ``context_too_large``."""


class CallsConfig(_Section):
    default_timeout: float = 30.0
    """Run timeout of a sync tool without its own (SPEC I8); 0 disables."""
    approval_timeout: float = 3600.0
    """Seconds an approval may stay pending before it is denied (SPEC A4)."""
    declined_message: str = (
        "The user declined this tool call. Do not retry it; ask the user how to proceed."
    )
    """Text the model gets when a call is declined (SPEC A5)."""
    pre_hooks: list[str] = Field(default_factory=list)
    """``module:function`` pre-execute hooks, in order (SPEC I6)."""
    post_hooks: list[str] = Field(default_factory=list)
    """``module:function`` post-execute hooks, in order (SPEC I10)."""
    worker_threads: int = 32
    """Threads for plain (non-async) handlers (SPEC S3)."""
    audit_param_bytes: int = 1024
    """Parameters are truncated to this many bytes of JSON in audit records (SPEC I11)."""


class JobsConfig(_Section):
    max_concurrent: int = 64
    """Jobs running at once across the server (SPEC J1)."""
    max_per_session: int = 8
    """Jobs running at once per session; more wait ``queued`` (SPEC J1)."""
    progress_interval: float = 0.25
    """Minimum seconds between two ``job.progress`` events of one job (SPEC J2)."""
    retention: float = 7 * 24 * 3600.0
    """Seconds finished jobs stay readable with job.get/job.list (SPEC D2)."""


class SessionsConfig(_Section):
    resume_window: float = 120.0
    """Seconds a disconnected session stays resumable (SPEC D2, D3)."""
    max_unacked_events: int = 10_000
    """Unacknowledged events kept per session; older ones are dropped (SPEC D2)."""
    max_call_records: int = 10_000
    """Finished calls per session whose outcome is kept for idempotent re-sends (SPEC
    I12); an older call_id re-sent is a new call."""


class LogConfig(_Section):
    level: str = "INFO"
    json_logs: bool = True
    """Structured JSON lines on stderr (SPEC O3)."""
    audit_file: Path | None = None
    """Append audit records (SPEC I11) as JSON lines here; default: the data folder."""


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
        return (init_settings, env_settings, _ConfigFile(settings_cls))


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
    """
    if path is None:
        return Settings(**overrides)
    if not path.exists():
        raise FileNotFoundError(path)

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
        "working directory. Example:",
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
    return f"| `{key}` | `{shown}` | `{env}` | {text} |"


def _show(value: Any) -> str:
    if isinstance(value, Path) and value.is_absolute() and DEMO_DIR in value.parents:
        return f"<demo>/{value.name}"
    return str(value)
