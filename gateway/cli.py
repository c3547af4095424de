"""The ``toolbus`` command (SPEC O1).

Subcommands:

- ``serve``: run the server (embedded defaults: the bundled demo catalog and profiles,
  SQLite in ``./toolbus-data``, a dev token printed at start when no auth is set up);
- ``check``: validate everything ``serve`` loads (catalog, handler and hook modules,
  token file, data folder), print every issue, exit 1 on any (SPEC O5);
- ``catalog --profile P --format F``: print a profile's catalog as the wire form or an
  export for OpenAI Realtime, OpenAI Chat Completions, Anthropic or MCP (SPEC C4);
- ``schema``: regenerate ``schema/`` from ``protocol/`` (``--check`` fails on drift);
- ``token``: mint a bearer token and add its hash to a token file (SPEC S2);
- ``client``: the interactive terminal client (SPEC K2/K1);
- ``run``: run scripted conversation files against a server (SPEC K3).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import socket
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pydantic
import pydantic_settings
import yaml

from catalog.compat import render_findings
from catalog.errors import CatalogError, did_you_mean
from catalog.exports import (
    EXPORTERS,
    ExportError,
    catalog_version,
    export_findings,
    to_openai_chat,
    tool_info,
)
from catalog.loader import load_catalog
from catalog.model import Catalog
from catalog.visibility import Scope, visible_tools
from gateway.auth import AuthError
from gateway.catalog_fit import oversized
from gateway.config import Settings, load_settings
from gateway.http_front import Origins
from gateway.mcp.probe import probe_mounts
from gateway.startup import DataDirLock, StartupError, preflight, render, store_problems
from gateway.store import StoreError
from gateway.tokenfile import TokenFileError, read_token_file
from protocol.codec import encode_json

FORMATS = ("wire", *EXPORTERS)
logger = logging.getLogger("gateway.cli")


def _settings(args: argparse.Namespace) -> Settings:
    if args.config is not None:
        # Handler modules kept next to the config file import without PYTHONPATH.
        sys.path.insert(0, str(args.config.resolve().parent))
    overrides: dict[str, Any] = {}
    server: dict[str, Any] = {}
    if getattr(args, "host", None):
        server["host"] = args.host
    if getattr(args, "port", None) is not None:
        server["port"] = args.port
    if server:
        overrides["server"] = server
    if getattr(args, "data_dir", None):
        overrides["data_dir"] = args.data_dir
    where = str(args.config) if args.config is not None else "configuration"
    try:
        return load_settings(args.config, **overrides)
    except FileNotFoundError as exc:
        raise ConfigError(f"{where}: no such file") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"{where}: is a folder, not a YAML file") from exc
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {_yaml_problem(exc)}") from exc
    except pydantic_settings.SettingsError as exc:
        # e.g. TOOLBUS_SERVER__ORIGINS=https://a.example: pydantic-settings names only the
        # section; name the variable and what its value must be (SPEC O4).
        named = _unparsable_env()
        raise ConfigError(f"{where}: {named or exc}") from exc
    except pydantic.ValidationError as exc:
        lines = [f"{where}: {len(exc.errors())} problem(s):"]
        for error in exc.errors(include_url=False):
            key = ".".join(str(part) for part in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                message = _unknown_key(error["loc"])
            lines.append(f"  {key}: {message}{_from_env(error['loc'])}")
        raise ConfigError("\n".join(lines)) from exc
    except (TypeError, ValueError) as exc:
        # A YAML document that is not a mapping of sections (a list, a scalar).
        raise ConfigError(f"{where}: must be a mapping of sections (server:, calls:, …)") from exc


def _unknown_key(loc: tuple[int | str, ...]) -> str:
    """``unknown key (did you mean server?)`` for a misspelt section or key (SPEC O4)."""
    fields: dict[str, Any] = Settings.model_fields
    if len(loc) == 2 and str(loc[0]) in fields:
        fields = getattr(fields[str(loc[0])].annotation, "model_fields", {})
    return f"unknown key{did_you_mean(str(loc[-1]), fields)}"


def _from_env(loc: tuple[int | str, ...]) -> str:
    """`` (from TOOLBUS_SERVER__PORT)`` when an environment variable set the key at
    ``loc``, so the message names where the bad value came from (SPEC O4); else ``""``.
    An unknown section names every variable under it (``TOOLBUS_SEVER__PORT``)."""
    parts = [str(part) for part in loc[:2]]
    name = "TOOLBUS_" + "__".join(parts).upper()
    set_names = {key.upper() for key in os.environ}
    if name in set_names:
        return f" (from {name})"
    under = sorted(n for n in set_names if len(parts) == 1 and n.startswith(name + "__"))
    return f" (from {', '.join(under)})" if under else ""


def _unparsable_env() -> str | None:
    """The first ``TOOLBUS_*`` environment variable whose value must be JSON (a section,
    or a key holding a list or a mapping) and is not, with what it should look like;
    ``None`` when there is none (SPEC O4)."""
    import json
    import typing

    sections = Settings.model_fields
    for name, value in sorted(os.environ.items()):
        parts = name.upper().removeprefix("TOOLBUS_").lower().split("__")
        if not name.upper().startswith("TOOLBUS_") or parts[0] not in sections:
            continue
        kind = "a mapping"
        if len(parts) == 2:
            section = sections[parts[0]].annotation
            fields = getattr(section, "model_fields", {})
            if parts[1] not in fields:
                continue
            origin = typing.get_origin(fields[parts[1]].annotation)
            if origin not in (list, tuple, set, frozenset, dict):
                continue
            kind = "a mapping" if origin is dict else "a list"
        elif len(parts) != 1 or not hasattr(sections[parts[0]].annotation, "model_fields"):
            # A plain top-level value (TOOLBUS_DATA_DIR, a path) is no JSON.
            continue
        try:
            json.loads(value)
        except ValueError:
            example = """'["a", "b"]'""" if kind == "a list" else """'{"key": 1}'"""
            return f"{name}: not JSON; {kind} is written as JSON here, e.g. {name}={example}"
    return None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return " ".join(str(exc).split())


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file and each key (O4)."""


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the server until SIGTERM/SIGINT, then drain (SPEC S4).

    Start-up (SPEC O5): the configuration, then the data-folder lock (before any state
    is touched), then every file the server loads; any failure is a
    :class:`StartupError` that :func:`main` prints as one message, exit status 1.
    """
    settings = _settings(args)
    if args.worker_of is not None:
        # A worker of `serve --workers` (SPEC N6): its supervisor holds the data folder.
        from gateway.supervisor import die_with_parent

        die_with_parent(args.worker_of)
        problems = preflight(settings, data_dir=False)
        if problems:
            raise StartupError(render(problems))
        return _serve_locked(settings, worker=True)
    if args.workers > 1 and settings.store.url is None:
        raise StartupError(
            f"--workers {args.workers}: the workers need a shared store (store.url: "
            f"postgresql://...); the embedded SQLite store serves one process"
        )
    if settings.server.reuse_port and settings.store.url is None:
        raise StartupError(
            "server.reuse_port: processes sharing a port need a shared store (store.url: "
            "postgresql://...); the embedded SQLite store serves one process"
        )
    with DataDirLock(settings.data_dir):
        problems = preflight(settings, data_dir=False)
        if problems:
            raise StartupError(render(problems))
        if args.workers > 1:
            return _serve_workers(args, settings)
        return _serve_locked(settings)


def _serve_workers(args: argparse.Namespace, settings: Settings) -> int:
    """``serve --workers N`` (SPEC N6): hold the port, start and supervise N workers
    (:mod:`gateway.supervisor`) until SIGTERM/SIGINT, which each worker drains (S4)."""
    from gateway import logs
    from gateway.supervisor import Supervisor, reserve_port

    logs.setup(settings.log.level, settings.log.json_logs, None)
    settings, banner = _dev_token(settings)
    server = settings.server
    try:
        held, port = reserve_port(server.host, server.port)
    except OSError as exc:
        raise StartupError(_startup_failure(exc, settings)) from exc
    env = dict(os.environ)
    env["TOOLBUS_SERVER__REUSE_PORT"] = "true"
    if settings.auth.token_file is not None:
        env["TOOLBUS_AUTH__TOKEN_FILE"] = str(settings.auth.token_file.resolve())
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--host", server.host]
    argv += ["--port", str(port), "--data-dir", str(settings.data_dir)]
    if args.config is not None:
        argv += ["--config", str(args.config)]
    argv += ["--worker-of", str(os.getpid())]

    def worker(index: int) -> tuple[list[str], dict[str, str]]:
        named = settings.nodes.node_id
        # SPEC N2: every worker is a node of its own; a configured id gets the index.
        return argv, (env | {"TOOLBUS_NODES__NODE_ID": f"{named}-{index}"} if named else env)

    def started() -> None:
        host = server.host
        print(
            f"toolbus serving on ws://{host}:{port}/  (subprotocol toolbus.v1, "
            f"{args.workers} workers)",
            flush=True,
        )
        print(f"console: http://{host}:{port}/", flush=True)
        origins = Origins(server)
        origins.port = port
        for line in [*banner, *origins.notice()]:
            print(line, flush=True)

    with held:
        return asyncio.run(Supervisor(worker, args.workers, started).run())


def _dev_token(settings: Settings) -> tuple[Settings, list[str]]:
    """With neither a token file nor JWT configured, a dev token in the data folder: the
    settings naming its token file, and the banner line showing it (SPEC O1)."""
    if settings.auth.token_file is not None or (
        settings.auth.jwt_secret or settings.auth.jwt_public_key_file
    ):
        return settings, []
    from gateway.auth import write_dev_token

    catalog = load_catalog(settings.catalog.tools, settings.catalog.profiles)
    token, token_file = write_dev_token(settings.data_dir, sorted(catalog.profiles))
    settings = settings.model_copy(
        update={"auth": settings.auth.model_copy(update={"token_file": token_file})}
    )
    return settings, [f"dev token (profiles: {', '.join(sorted(catalog.profiles))}): {token}"]


def _serve_locked(settings: Settings, worker: bool = False) -> int:
    """Serve in this process; a worker of ``--workers`` prints only its first banner
    line, which tells its supervisor it listens."""
    from gateway import logs
    from gateway.server import Gateway, run

    try:
        logs.setup(
            settings.log.level,
            settings.log.json_logs,
            settings.log.audit_file or settings.data_dir / "audit.jsonl",
        )
    except OSError as exc:
        raise StartupError(f"log.audit_file: cannot open it: {exc.strerror or exc}") from None
    settings, banner = _dev_token(settings)
    listening = False

    def started(gateway: Gateway) -> None:
        nonlocal listening
        listening = True
        host = settings.server.host
        print(
            f"toolbus serving on ws://{host}:{gateway.port}/  (subprotocol toolbus.v1)", flush=True
        )
        if worker:
            return
        print(f"console: http://{host}:{gateway.port}/", flush=True)
        for line in [*banner, *gateway.parts.origins.notice()]:
            print(line, flush=True)

    try:
        asyncio.run(run(settings, started))
    except Exception as exc:
        if listening or isinstance(exc, StartupError):
            raise
        raise StartupError(_startup_failure(exc, settings)) from exc
    return 0


_BIND_ERRORS = {
    errno.EADDRINUSE: ("server.port", "address already in use"),
    errno.EACCES: ("server.port", "permission denied (ports below 1024 need privileges)"),
    errno.EADDRNOTAVAIL: ("server.host", "no such address on this machine"),
}
"""A bind failure's errno -> (the config key at fault, what went wrong)."""


def _startup_failure(exc: Exception, settings: Settings) -> str:
    """One line for an exception that stopped the server before it listened (SPEC O5).

    The traceback goes to the log at DEBUG only: the message names the cause."""
    logger.debug("start-up failed", exc_info=exc)
    server = settings.server
    if isinstance(exc, OSError) and exc.errno in _BIND_ERRORS:
        key, why = _BIND_ERRORS[exc.errno]
        value = server.port if key == "server.port" else server.host
        return f"{key} {value}: cannot listen on {server.host}:{server.port}: {why}"
    if isinstance(exc, socket.gaierror):
        # A host name that does not resolve (errno is a resolver code, not an OS one).
        why = exc.strerror or str(exc)
        return f"server.host {server.host}: cannot listen on {server.host}:{server.port}: {why}"
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    if isinstance(exc, sqlite3.Error):
        return f"store {settings.data_dir / 'toolbus.db'}: {exc}"
    if isinstance(exc, AuthError):
        return f"auth: {exc}"
    if isinstance(exc, StoreError):
        return str(exc)  # SPEC D6, F32: names the file, the damage and the way out
    if isinstance(exc, CatalogError):
        return render([str(issue) for issue in exc.issues])
    return f"{type(exc).__name__}: {exc}"


def _catalog(args: argparse.Namespace) -> Catalog | None:
    """The configured catalog, or ``None`` after printing every load issue (SPEC C1)."""
    settings = _settings(args)
    try:
        return load_catalog(settings.catalog.tools, settings.catalog.profiles)
    except CatalogError as exc:
        print(exc, file=sys.stderr)
        return None


def cmd_check(args: argparse.Namespace) -> int:
    """Validate everything ``serve`` would load (SPEC C1, C2, O5): the catalog and its
    handler modules, hook modules, the token and JWT key files, the data folder, the
    store (read, never written: SPEC D6, N1); and every export (C4). Print every issue.

    Every problem found in one run (SPEC O5) is one ``error:`` line on stderr and the
    exit code is 1: catalog issues, then hook, token-file, data-folder and store problems, then
    export findings no format rule lets toolbus adapt, then MCP mount problems (the
    mounts are probed even when other parts of the catalog have issues). Adapted export
    findings, token-file entries naming a profile the catalog lacks, and each mount's
    tools print as ``note:`` / ``mcp ...`` lines on stdout.
    """
    settings = _settings(args)
    # SPEC O5: everything `serve` loads besides the catalog (hooks, token file, data
    # folder); a problem there fails the check too, listed with the catalog's issues.
    problems = preflight(settings, catalog=False) + store_problems(settings)
    catalog: Catalog | None = None
    try:
        catalog = load_catalog(settings.catalog.tools, settings.catalog.profiles)
        mounts = catalog.mounts
    except CatalogError as exc:
        problems = [str(issue) for issue in exc.issues] + problems
        mounts = exc.mounts
    if catalog is not None:
        for line in _foreign_profiles(settings.auth.token_file, catalog):
            print(line)
        # SPEC E2: every profile's catalog frame fits the size welcome announces.
        problems += oversized(catalog, settings.server.max_message_bytes)
        # SPEC C4 (case F18): every export must be one its provider accepts.
        findings = export_findings(catalog.tools.values())
        sources = {name: tool.source for name, tool in catalog.tools.items()}
        for line in render_findings(findings, sources):
            if line.startswith("note"):
                print(line)
            else:
                problems.append(line.removeprefix("error: "))
    # SPEC M1: connect to each mounted MCP server and say what it would load.
    notes, failures, mounted = probe_mounts(mounts)
    for line in notes:
        print(line)
    problems += failures
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    if problems or catalog is None:
        return 1
    tools, profiles = len(catalog.tools) + mounted, len(catalog.profiles)
    print(f"ok: {tools} tool{'s' * (tools != 1)}, {profiles} profile{'s' * (profiles != 1)}")
    return 0


def _foreign_profiles(token_file: Path | None, catalog: Catalog) -> list[str]:
    """A ``note:`` line per token-file entry naming a profile the catalog lacks (SPEC
    C2: such a session gets an empty catalog). Not an error: the catalog may gain the
    profile by a hot reload. A file that does not read is preflight's problem."""
    if token_file is None:
        return []
    try:
        entries = read_token_file(token_file)
    except TokenFileError:
        return []
    return [
        f"note: token file {token_file}: tokens.{i} (user {entry.user}): profile "
        f"{name!r} is not in the catalog; its sessions would get no tools"
        for i, entry in enumerate(entries)
        for name in entry.profiles
        if name not in catalog.profiles
    ]


def cmd_catalog(args: argparse.Namespace) -> int:
    """Print a profile's catalog in a model-facing format (SPEC C3, C4)."""
    catalog = _catalog(args)
    if catalog is None:
        return 1
    if args.profile not in catalog.profiles:
        print(
            f"unknown profile {args.profile!r}; known: {', '.join(sorted(catalog.profiles))}",
            file=sys.stderr,
        )
        return 1
    context = dict(pair.split("=", 1) for pair in args.context)
    tools = visible_tools(catalog, catalog.profile(args.profile), Scope(context, args.origin))
    if args.format == "wire":
        out: object = {"version": catalog_version(tools), "tools": [tool_info(t) for t in tools]}
    else:
        strict = args.strict and args.format == "openai-chat"
        findings = export_findings(tools, [args.format], strict=strict)
        sources = {tool.name: tool.source for tool in tools}
        for line in render_findings(findings, sources):
            print(line, file=sys.stderr)
        try:
            out = to_openai_chat(tools, strict=True) if strict else EXPORTERS[args.format](tools)
        except ExportError:
            return 1  # never print a list the provider would reject whole (SPEC C4, F18)
    sys.stdout.write(encode_json(out).decode() + "\n")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    """Regenerate ``schema/`` from the wire models, or check it (``--check``)."""
    from protocol.jsonschema import render_files

    root = Path(args.out)
    files = {root / Path(name).relative_to("schema"): data for name, data in render_files().items()}
    existing = {p for p in root.rglob("*.json")} if root.exists() else set()
    stale = existing - set(files)
    changed = [p for p, data in files.items() if not p.exists() or p.read_bytes() != data]
    if args.check:
        if not root.is_dir():
            # The repository's schema/ is relative to where the command runs.
            print(
                f"toolbus schema --check: no folder {root} here (run it in the repository "
                "root, or give --out)",
                file=sys.stderr,
            )
            return 1
        for path in sorted(changed):
            print(f"{'differs' if path.exists() else 'missing'}: {path}", file=sys.stderr)
        for path in sorted(stale):
            print(f"not generated: {path}", file=sys.stderr)
        return 1 if changed or stale else 0
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for path in stale:
        path.unlink()
    print(f"wrote {len(files)} files to {root} ({len(changed)} changed, {len(stale)} removed)")
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    """Mint a token, append its SHA-256 to a token file, print the token once (SPEC S2).

    Every profile named must be in the configured catalog (``--config``, else the
    embedded demo catalog) unless ``--any-profile`` is given: a session of a profile the
    catalog lacks gets no tools (SPEC C2, fail closed), so a typo would show only there.
    Exit 1, the file unchanged, on a token file ``serve`` would refuse, an unknown
    profile or a catalog that does not load.
    """
    from gateway.auth import hash_token, new_token

    path: Path = args.token_file
    if path.exists():
        try:
            read_token_file(path)  # never append to a file serve would refuse (SPEC O5)
        except TokenFileError as exc:
            print(exc, file=sys.stderr)
            return 1
    profiles = [p for p in args.profiles.split(",") if p]
    if not profiles:
        print("toolbus token: --profiles names no profile", file=sys.stderr)
        return 1
    if not args.any_profile:
        catalog = _catalog(args)
        if catalog is None:
            print(
                "toolbus token: the catalog did not load (--any-profile mints without it)",
                file=sys.stderr,
            )
            return 1
        unknown = [p for p in profiles if p not in catalog.profiles]
        if unknown:
            # A session of such a profile would get an empty catalog (SPEC C2: fail closed).
            print(
                f"toolbus token: unknown profile{'s' * (len(unknown) > 1)} "
                f"{', '.join(map(repr, unknown))}; the catalog has: "
                f"{', '.join(sorted(catalog.profiles))} (--any-profile mints it anyway)",
                file=sys.stderr,
            )
            return 1
    data = yaml.safe_load(path.read_text()) if path.exists() else None
    data = data or {"tokens": []}
    token = new_token()
    entry: dict[str, object] = {
        "sha256": hash_token(token),
        "user": args.user,
        "profiles": profiles,
    }
    if args.tenant:
        entry["tenant"] = args.tenant
    data["tokens"].append(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    path.chmod(0o600)
    print(token)
    return 0


def _delegate(module: str, argv: Sequence[str]) -> int:
    import importlib

    main = importlib.import_module(module).main
    return int(main(list(argv)))


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def parser() -> argparse.ArgumentParser:
    """The argument parser of ``toolbus`` (SPEC O1)."""
    top = argparse.ArgumentParser(
        prog="toolbus", description="A WebSocket gateway between realtime agents and their tools."
    )
    sub = top.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--config",
            type=Path,
            help="YAML config file (env TOOLBUS_<SECTION>__<KEY> overrides it)",
        )
        return p

    serve = with_config(sub.add_parser("serve", help="run the server"))
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="TCP port (default 8765; 0 = any free port)")
    serve.add_argument("--data-dir", type=Path, help="folder for SQLite, audit log, dev token")
    serve.add_argument(
        "--workers",
        type=_positive,
        default=1,
        help="server processes sharing the port (SO_REUSEPORT, Linux) and the store; "
        "more than 1 needs store.url (PostgreSQL)",
    )
    serve.add_argument("--worker-of", type=int, help=argparse.SUPPRESS)
    serve.set_defaults(func=cmd_serve)

    with_config(sub.add_parser("check", help="validate the catalog and profiles")).set_defaults(
        func=cmd_check
    )

    cat = with_config(sub.add_parser("catalog", help="print a profile's catalog (SPEC C4 formats)"))
    cat.add_argument("--profile", required=True)
    cat.add_argument("--format", choices=FORMATS, default="wire", help="default: wire")
    cat.add_argument("--context", action="append", default=[], metavar="KEY=VALUE")
    cat.add_argument("--origin", default=None, help="the Origin a browser session would have")
    cat.add_argument(
        "--strict",
        action="store_true",
        help="openai-chat: send strict: true for each tool whose schema fits strict mode",
    )
    cat.set_defaults(func=cmd_catalog)

    schema = sub.add_parser("schema", help="regenerate schema/ from protocol/")
    schema.add_argument("--out", default="schema", help="the folder (default: ./schema)")
    schema.add_argument("--check", action="store_true", help="exit 1 if schema/ differs")
    schema.set_defaults(func=cmd_schema)

    token = with_config(sub.add_parser("token", help="mint a token into a token file"))
    token.add_argument("--user", required=True)
    token.add_argument(
        "--profiles", required=True, help="comma-separated profile names, each in the catalog"
    )
    token.add_argument(
        "--any-profile",
        action="store_true",
        help="mint for profiles the catalog does not have (yet); the catalog is not loaded",
    )
    token.add_argument("--tenant")
    token.add_argument("--token-file", type=Path, required=True)
    token.set_defaults(func=cmd_token)

    sub.add_parser("client", help="interactive client (toolbus client --help)", add_help=False)
    sub.add_parser("run", help="run scripted conversations (toolbus run --help)", add_help=False)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``toolbus`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "client":
            return _delegate("toolbus.interactive", argv[1:])
        if argv and argv[0] == "run":
            return _delegate("toolbus.script", argv[1:])
        args = parser().parse_args(argv)
        return int(args.func(args))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    except StartupError as exc:
        # SPEC O5: the message names the cause; a traceback would bury it.
        print(f"toolbus: cannot start: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # Output piped into `head` and cut short: not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
