"""Resolving a tool's ``handler: "module:function"`` at load time (SPEC C1).

A handler that fails to import is reported when the catalog loads, not when a model
first calls the tool.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

HANDLER_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
"""``package.module:function`` or ``package.module:Class.method``."""


class HandlerError(ValueError):
    """A handler path is malformed, fails to import, or names no callable."""


class ImportFailed(Exception):
    """Importing a handler or hook module raised; the message names the module and what
    it raised (SPEC C1, O5)."""


def import_guarded(module_name: str) -> Any:
    """Import a module of handlers or hooks, turning whatever it raises into a load error.

    An import can raise anything, including ``SystemExit`` (a module calling
    ``sys.exit()`` at import) or another ``BaseException``; left alone, that would end
    ``toolbus check``/``serve`` silently or kill the hot-reload watcher. Only
    ``KeyboardInterrupt`` passes through, so Ctrl-C still stops a slow import.

    Raises:
        ImportFailed: ``importing 'mod' failed: SystemExit: 3`` and the like.
        KeyboardInterrupt: unchanged.
    """
    try:
        return importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # anything but Ctrl-C: see the docstring (SPEC O5)
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ImportFailed(f"importing {module_name!r} failed: {text}") from exc


def resolve_handler(path: str) -> Callable[..., Any]:
    """Import ``module`` and fetch ``function`` from a ``"module:function"`` path.

    Args:
        path: e.g. ``"gateway.demo.handlers:notes_create"``.

    Returns:
        The callable (plain or coroutine function).

    Raises:
        HandlerError: the path is malformed, the import raises (any exception, reported
            with its type and message), the attribute is missing or not callable.
    """
    if not HANDLER_PATH.match(path):
        raise HandlerError(f"handler {path!r} is not a 'module:function' path")
    module_name, _, attr_path = path.partition(":")
    try:
        target: Any = import_guarded(module_name)
    except ImportFailed as exc:
        raise HandlerError(f"handler {path!r}: {exc}") from exc
    for attr in attr_path.split("."):
        if not hasattr(target, attr):
            raise HandlerError(f"handler {path!r}: {module_name!r} has no attribute {attr_path!r}")
        target = getattr(target, attr)
    if not callable(target):
        raise HandlerError(f"handler {path!r} is not callable")
    return target  # type: ignore[no-any-return]
