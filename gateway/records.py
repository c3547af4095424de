"""``@record``: a frozen, slotted dataclass to the type checker, built as fast as a plain one.

A ``@dataclass(frozen=True)`` ``__init__`` sets every field through
``object.__setattr__``, one Python-level call per field. On the bench machine an
eight-field frozen, slotted dataclass took 2.7 us to build against 0.54 us for the
same class unfrozen, and each call builds several records on the loop (its ledger
rows, its I15 check and its intent; issue 13).

:func:`record` gives the class ``@dataclass(slots=True, unsafe_hash=True)`` at run
time: the same fields, ``__init__``, ``repr``, ``__eq__`` and ``__hash__`` (over the
same fields) as ``frozen=True, slots=True``, without the per-field ``__setattr__``. The
immutability is checked statically: :func:`typing.dataclass_transform` with
``frozen_default=True`` makes mypy (``--strict`` in ``scripts/check``) see a frozen
dataclass, so an assignment to a field is a type error where it is written. What is
lost is only the run-time ``FrozenInstanceError`` for code that mypy does not check.

Use it for the store's and the ledger's own records built on the hot path. What code
outside the gateway gets (a handler's :class:`~gateway.context.ToolContext`, a hook's
:class:`~gateway.hooks.CallInfo`), and everything else, keeps ``@dataclass(frozen=True,
slots=True)`` (STYLE.md): a handler or hook is not type-checked with the gateway, and
the gateway reads those records again after the handler ran (a promoted call's job).
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar, dataclass_transform

__all__ = ["record"]

T = TypeVar("T")


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def record(cls: type[T]) -> type[T]:
    """Make ``cls`` a slotted dataclass, frozen to the type checker (see the module).

    Args:
        cls: a class with dataclass field annotations.

    Returns:
        The new slotted class (``dataclasses.dataclass(slots=True)`` builds a new one).
    """
    return dataclasses.dataclass(slots=True, unsafe_hash=True)(cls)
