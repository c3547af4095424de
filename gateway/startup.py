"""Start-up checks and the data-folder lock (SPEC O5).

``toolbus serve`` and ``toolbus check`` share :func:`preflight`: every file ``serve``
loads (catalog and handler modules, hook modules, the token file, the JWT key file) and
the data folder are checked, and each problem is one line naming the file, tool, key
or path. ``serve`` then takes a :class:`DataDirLock` before it touches any state, so a
second server on the same folder is refused at once instead of rewriting the state of
the one already running.

Anything that stops ``serve`` before it listens is a :class:`StartupError` (or a
subclass): the CLI prints its message as is, exits non-zero and shows no traceback.

Exception tree::

    StartupError          serve cannot start; str() names the cause
    └── DataDirInUse      another server holds the data folder's lock
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from pathlib import Path
from typing import IO

from jwt.algorithms import RSAAlgorithm
from jwt.exceptions import InvalidKeyError

from catalog.errors import CatalogError
from catalog.loader import load_catalog
from gateway import hooks
from gateway.catalog_fit import oversized
from gateway.config import Settings
from gateway.tokenfile import TokenFileError, read_token_file

LOCK_NAME = "toolbus.lock"
"""The lock file inside the data folder; it holds the owner's pid, for the message."""


class StartupError(Exception):
    """``serve`` cannot start; the message names the cause (file and tool, key or path).

    Other start-up checks (e.g. the store's integrity check) subclass it, and the CLI
    reports every subclass the same way: one message, exit status 1, no traceback.
    """


class DataDirInUse(StartupError):
    """Another ``toolbus serve`` holds the lock on this data folder (SPEC O5)."""


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def render(problems: list[str]) -> str:
    """One line for one problem; a count and an indented line each for several."""
    if len(problems) == 1:
        return problems[0]
    return "\n".join([f"{len(problems)} problems:", *(f"  {line}" for line in problems)])


def data_dir_problems(path: Path, key: str = "data_dir") -> list[str]:
    """What would stop ``serve`` from using ``path`` as its folder for ``key``, leaving
    nothing behind (for ``check``, SPEC O5).

    Permission bits do not tell (root passes ``os.access`` on ``/proc``, where nothing
    can be created), so this does what ``serve`` will do, once, and undoes it: in a
    missing folder's nearest existing parent it creates and removes a folder; in an
    existing folder, a file.

    Returns:
        ``[]`` or one line such as ``data_dir /x: is a file, not a folder`` or
        ``data_dir /proc/x: cannot create it: No such file or directory`` (the words
        ``serve`` would stop with).
    """
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    where = "" if probe == path else f"{probe} "
    if not probe.is_dir():
        return [f"{key} {path}: {where}is a file, not a folder"]
    if probe == path and not os.access(probe, os.W_OK | os.X_OK):
        return [f"{key} {path}: not writable"]
    try:
        if probe == path:
            tempfile.TemporaryFile(dir=path).close()
        else:
            os.rmdir(tempfile.mkdtemp(prefix=".toolbus-check-", dir=probe))
    except OSError as exc:
        verb = "not writable" if probe == path else "cannot create it"
        return [f"{key} {path}: {verb}: {_why(exc)}"]
    return []


class DataDirLock:
    """An exclusive OS lock (``flock``) on ``data_dir/toolbus.lock`` (SPEC O5).

    The lock belongs to the open file: the kernel drops it when the process exits, even
    on ``kill -9``, so a stale lock file never blocks a restart.

    Args:
        data_dir: the data folder; created when missing.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        """Create the folder if needed and take the lock, or fail at once.

        Raises:
            StartupError: the folder is a file, cannot be created or is not writable.
            DataDirInUse: another process holds the lock.
        """
        where = f"data_dir {self.data_dir}"
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise StartupError(f"{where}: is a file, not a folder") from None
        except OSError as exc:
            raise StartupError(f"{where}: cannot create it: {_why(exc)}") from None
        if not os.access(self.data_dir, os.W_OK | os.X_OK):
            raise StartupError(f"{where}: not writable")
        try:
            handle = open(self.data_dir / LOCK_NAME, "a+", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            raise StartupError(f"{where}: not writable: {_why(exc)}") from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            handle.close()
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DataDirInUse(
                    f"{where}: the data folder is in use by another toolbus serve "
                    f"(pid {owner}); stop it or give this one another data_dir"
                ) from None
            raise StartupError(f"{where}: cannot lock it: {_why(exc)}") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle

    def release(self) -> None:
        """Drop the lock (closing the file drops it). Idempotent."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def hook_problems(settings: Settings) -> list[str]:
    """Import every configured pre- and post-hook; one line per failure (SPEC I6, I10)."""
    problems = []
    for key in ("pre_hooks", "post_hooks"):
        for index, path in enumerate(getattr(settings.calls, key)):
            try:
                hooks.resolve(path)
            except ValueError as exc:
                problems.append(f"calls.{key}[{index}]: {exc}")
    return problems


def auth_problems(settings: Settings) -> list[str]:
    """Read the token file and the JWT public key file, if configured (SPEC S2)."""
    auth = settings.auth
    problems = []
    if auth.token_file is not None:
        try:
            read_token_file(auth.token_file)
        except TokenFileError as exc:
            problems.append(f"auth.token_file: {exc}")
    if auth.jwt_public_key_file is not None:
        try:
            # Parsed, not only read: a file that is not a key would otherwise fail
            # every RS256 hello at run time instead of refusing the start (SPEC O5).
            RSAAlgorithm(RSAAlgorithm.SHA256).prepare_key(
                auth.jwt_public_key_file.read_text(encoding="utf-8")
            )
        except (OSError, UnicodeDecodeError, InvalidKeyError) as exc:
            why = _why(exc) if isinstance(exc, OSError) else "not a PEM RSA public key"
            problems.append(f"auth.jwt_public_key_file {auth.jwt_public_key_file}: {why}")
    return problems


def catalog_problems(settings: Settings) -> list[str]:
    """Load the catalog and import its handlers; one line per issue (SPEC C1, C2), and
    one per profile whose catalog frame exceeds ``server.max_message_bytes`` (SPEC E2)."""
    try:
        catalog = load_catalog(settings.catalog.tools, settings.catalog.profiles)
    except CatalogError as exc:
        return [str(issue) for issue in exc.issues]
    return oversized(catalog, settings.server.max_message_bytes)


def store_problems(settings: Settings) -> list[str]:
    """The store ``serve`` would open, looked at without writing (``toolbus check``, SPEC
    O5, D6, N1): a damaged or unreadable SQLite file at ``data_dir/toolbus.db``
    (:func:`gateway.store.check_file`), or a ``store.url`` database that does not answer,
    lacks its schema, or holds a newer schema version (:func:`gateway.pg_link.probe`).
    One line per problem; ``[]`` when ``serve`` could open it."""
    url = settings.store.url
    if url is not None:
        from gateway.pg_link import probe  # psycopg: only when configured

        problem = probe(url)
        return [] if problem is None else [problem]
    from gateway.store import StoreError, check_file

    try:
        check_file(settings.data_dir / "toolbus.db")
    except StoreError as exc:
        return [str(exc)]
    return []


def preflight(settings: Settings, *, catalog: bool = True, data_dir: bool = True) -> list[str]:
    """Every problem that would stop ``serve`` with these settings (SPEC O5).

    Args:
        settings: the loaded configuration (its own errors are caught earlier).
        catalog: also load the catalog and import its handlers.
        data_dir: also check the data folder (without creating it).

    Returns:
        One line per problem, each naming the file and tool, key or path; ``[]`` when
        ``serve`` would load everything.
    """
    problems = catalog_problems(settings) if catalog else []
    problems += hook_problems(settings) + auth_problems(settings)
    if data_dir:
        problems += data_dir_problems(settings.data_dir)
    audit = settings.log.audit_file
    if audit is not None and audit.is_dir():
        problems.append(f"log.audit_file {audit}: is a folder, not a file")
    elif audit is not None:
        problems += data_dir_problems(audit.parent, "log.audit_file folder")
    return problems
