"""The ``toolbus`` command (SPEC O1).

Subcommands:

- ``serve``: run the server (embedded defaults: the bundled demo catalog and profiles,
  SQLite in ``./toolbus-data``, a dev token printed at start when no auth is set up);
- ``check``: validate the catalog and profiles, print every issue, exit 1 on any;
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
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pydantic
import yaml

from catalog.errors import CatalogError
from catalog.exports import EXPORTERS, catalog_version, tool_info
from catalog.loader import load_catalog
from catalog.model import Catalog
from catalog.visibility import Scope, visible_tools
from gateway.config import Settings, load_settings
from protocol.codec import encode_json

FORMATS = ("wire", *EXPORTERS)


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
    except pydantic.ValidationError as exc:
        lines = [f"{where}: {len(exc.errors())} problem(s):"]
        for error in exc.errors(include_url=False):
            key = ".".join(str(part) for part in error["loc"])
            message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
            lines.append(f"  {key}: {message}")
        raise ConfigError("\n".join(lines)) from exc


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file and each key (O4)."""


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the server until SIGTERM/SIGINT, then drain (SPEC S4)."""
    from gateway import logs
    from gateway.auth import write_dev_token
    from gateway.server import Gateway, run

    settings = _settings(args)
    logs.setup(
        settings.log.level,
        settings.log.json_logs,
        settings.log.audit_file or settings.data_dir / "audit.jsonl",
    )
    banner = []
    if settings.auth.token_file is None and not (
        settings.auth.jwt_secret or settings.auth.jwt_public_key_file
    ):
        catalog = load_catalog(settings.catalog.tools, settings.catalog.profiles)
        token, token_file = write_dev_token(settings.data_dir, sorted(catalog.profiles))
        settings = settings.model_copy(
            update={"auth": settings.auth.model_copy(update={"token_file": token_file})}
        )
        banner.append(f"dev token (profiles: {', '.join(sorted(catalog.profiles))}): {token}")

    def started(gateway: Gateway) -> None:
        host = settings.server.host
        print(
            f"toolbus serving on ws://{host}:{gateway.port}/  (subprotocol toolbus.v1)", flush=True
        )
        print(f"console: http://{host}:{gateway.port}/", flush=True)
        for line in banner:
            print(line, flush=True)

    asyncio.run(run(settings, started))
    return 0


def _catalog(args: argparse.Namespace) -> Catalog | None:
    """The configured catalog, or ``None`` after printing every load issue (SPEC C1)."""
    settings = _settings(args)
    try:
        return load_catalog(settings.catalog.tools, settings.catalog.profiles)
    except CatalogError as exc:
        print(exc, file=sys.stderr)
        return None


def cmd_check(args: argparse.Namespace) -> int:
    """Validate catalog and profiles (SPEC C1, C2); print every issue."""
    catalog = _catalog(args)
    if catalog is None:
        return 1
    tools, profiles = len(catalog.tools), len(catalog.profiles)
    print(f"ok: {tools} tool{'s' * (tools != 1)}, {profiles} profile{'s' * (profiles != 1)}")
    return 0


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
        out = EXPORTERS[args.format](tools)
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
        for path in sorted(changed) + sorted(stale):
            print(f"drift: {path}", file=sys.stderr)
        return 1 if changed or stale else 0
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for path in stale:
        path.unlink()
    print(f"wrote {len(files)} files to {root} ({len(changed)} changed, {len(stale)} removed)")
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    """Mint a token, append its SHA-256 to a token file, print the token once (SPEC S2)."""
    from gateway.auth import hash_token, new_token

    path: Path = args.token_file
    data = yaml.safe_load(path.read_text()) if path.exists() else None
    data = data or {"tokens": []}
    token = new_token()
    entry: dict[str, object] = {
        "sha256": hash_token(token),
        "user": args.user,
        "profiles": [p for p in args.profiles.split(",") if p],
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
    serve.set_defaults(func=cmd_serve)

    with_config(sub.add_parser("check", help="validate the catalog and profiles")).set_defaults(
        func=cmd_check
    )

    cat = with_config(sub.add_parser("catalog", help="print a profile's catalog (SPEC C4 formats)"))
    cat.add_argument("--profile", required=True)
    cat.add_argument("--format", choices=FORMATS, default="wire", help="default: wire")
    cat.add_argument("--context", action="append", default=[], metavar="KEY=VALUE")
    cat.add_argument("--origin", default=None, help="the Origin a browser session would have")
    cat.set_defaults(func=cmd_catalog)

    schema = sub.add_parser("schema", help="regenerate schema/ from protocol/")
    schema.add_argument("--out", default="schema")
    schema.add_argument("--check", action="store_true", help="exit 1 if schema/ differs")
    schema.set_defaults(func=cmd_schema)

    token = sub.add_parser("token", help="mint a token into a token file")
    token.add_argument("--user", required=True)
    token.add_argument("--profiles", required=True, help="comma-separated profile names")
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
    except BrokenPipeError:
        # Output piped into `head` and cut short: not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
