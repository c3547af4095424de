"""What a tool handler receives besides its arguments (SPEC I5).

A handler is ``handler(params, ctx)``: ``params`` is the validated argument object the
model sent, ``ctx`` a :class:`ToolContext` filled by the server. Identity (session,
user, profile, project) reaches the handler only through ``ctx``, never from the
model's arguments, so a model cannot act as someone else by inventing an argument.

A handler may be a plain function (run in a worker thread, SPEC S3) or a coroutine
function (run on the event loop). It returns any JSON value; a non-object is wrapped
as ``{"value": ...}`` (SPEC I8). An async tool's object result may carry ``summary``
(str) and ``artifacts`` (list of objects), which ``job.done`` lifts out (SPEC J4).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ProgressFn = Callable[[float | None, str | None], None]

_MAKING = threading.Lock()
"""Guards the first making of a :class:`Cancellation`'s condition."""


class Cancellation(threading.Event):
    """A :class:`threading.Event` whose lock and condition are made when first needed.

    Every call gets one (:attr:`ToolContext.cancelled`) and almost none is ever set or
    waited on: a plain ``threading.Event`` costs about 2 us to make (its
    ``Condition``), about 1 % of a no-op call's server time (issue 13). This one makes
    its condition on the first :meth:`set`, :meth:`clear` or :meth:`wait` (under a
    module lock, so two threads get the same one); :meth:`is_set` reads the flag only.
    It is a ``threading.Event`` in every other way (the inherited methods use the
    condition through :attr:`_cond`).
    """

    def __init__(self) -> None:  # no Event.__init__: the condition comes when needed
        self._flag = False
        self._made: threading.Condition | None = None

    @property  # Event.__init__ assigns this attribute; here it is made on first use
    def _cond(self) -> threading.Condition:
        made = self._made
        if made is None:
            with _MAKING:
                if self._made is None:
                    self._made = threading.Condition(threading.Lock())
                made = self._made
        return made


def check_progress(fraction: object, message: object) -> None:
    """Refuse a progress note the wire cannot carry as given (SPEC J2, I16).

    Raises:
        ValueError: ``fraction`` is not ``None`` or a finite number (``NaN`` and
            ``Infinity`` would reach the client as ``null``), or ``message`` is not
            ``None`` or a string. Raised in the handler that called ``progress``;
            a finite fraction outside [0, 1] is clamped, not refused.
    """
    if fraction is not None and (
        isinstance(fraction, bool)
        or not isinstance(fraction, int | float)
        or not math.isfinite(fraction)
    ):
        raise ValueError(f"progress: fraction must be a finite number or None, not {fraction!r}")
    if message is not None and not isinstance(message, str):
        kind = type(message).__name__
        raise ValueError(f"progress: message must be a string or None, not {kind}")


def no_progress(fraction: float | None, message: str | None) -> None:
    """Progress sink of calls that are not jobs: progress has nowhere to go (the note is
    still checked, so a handler's mistake shows the same way in a call and in a job)."""
    check_progress(fraction, message)


def no_recheck() -> None:
    """The re-check of a context with no session behind it (tests, tools called directly)."""


class ProgressRelay:
    """A progress sink that can be pointed at a job later (SPEC I14, J2): a sync call
    promoted to a job keeps the context its handler already holds, so the context's
    ``progress`` must be able to start reaching the job then."""

    __slots__ = ("target",)

    def __init__(self) -> None:
        self.target: ProgressFn = no_progress

    def __call__(self, fraction: float | None, message: str | None = None) -> None:
        self.target(fraction, message)


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Server-side facts about one call, injected into its handler (SPEC I5).

    Attributes:
        session_id: the calling session.
        user: the authenticated user.
        profile: the profile the session runs under.
        context: the session context (SPEC S5), e.g. ``project_id``, ``origin``.
        call_id: the client's id for this call.
        tool: the tool's name.
        data_dir: a folder the server owns, for tools that keep state on disk.
        job_id: the job running this call, or ``None`` for a plain sync call.
        cancelled: set when the call is cancelled (SPEC I8); a plain handler running in
            a thread should check it in long loops, since a thread cannot be interrupted.
        progress: ``progress(fraction, message)`` reports job progress (SPEC J2);
            ``fraction`` in [0, 1] or ``None``. Safe to call from any thread; a no-op
            outside jobs; rate-limited by the server. Raises ``ValueError`` for a
            fraction that is not a finite number (``NaN``, ``Infinity``) or a message
            that is not a string (SPEC I16).
        tenant: the authenticated tenant, or ``None`` (SPEC S2).
        recheck: server-internal: raises :class:`gateway.authority.Lapse` when the call's
            authority lapsed since its gates were checked (SPEC A7);
            :func:`gateway.execute.run_handler` calls it right before the handler starts.
    """

    session_id: str
    user: str
    profile: str
    context: Mapping[str, str]
    call_id: str
    tool: str
    data_dir: Path
    job_id: str | None = None
    cancelled: threading.Event = field(default_factory=Cancellation)
    progress: ProgressFn = no_progress
    tenant: str | None = None
    recheck: Callable[[], None] = field(default=no_recheck, repr=False, compare=False)

    @property
    def principal(self) -> str:
        """Whose data this is: ``tenant/user``, or ``user`` without a tenant. Key stored
        data by this, not by ``user`` alone: two tenants may both have an ``alice``."""
        return f"{self.tenant}/{self.user}" if self.tenant else self.user

    @property
    def project_id(self) -> str | None:
        """The session's ``project_id`` context key, or ``None`` when no project is linked."""
        return self.context.get("project_id")
