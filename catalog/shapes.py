"""The catalog files' shapes as pydantic models, and their errors in the catalog's words.

Tool definitions (:mod:`catalog.tooldefs`), profiles (:mod:`catalog.profiles`) and the
top level of both kinds of file (:mod:`catalog.loader`) are pydantic v2 models with
``extra="forbid"``. Each field's type carries the sentence a bad value earns
(:func:`says`), so :func:`problems` turns a :class:`pydantic.ValidationError` into the
issue texts ``toolbus check`` has always printed (SPEC C1, C2)::

    dangerus: unknown key (did you mean dangerous?); allowed: capability, ...
    timeout: must be zero or positive
    description: required

What pydantic cannot say stays code beside the models: combinations of keys, JSON
Schema validity of ``parameters``, references between tools and profiles.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    ValidationError,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

from catalog.errors import unknown_key

Message = str | Callable[[Any], str]
"""A bad value's sentence, fixed or built from the value (without the key name)."""

CUSTOM = "catalog"
"""The pydantic error type of every sentence this module raises."""


def refuse(text: str, *, whole: bool = False) -> PydanticCustomError:
    """A validation error whose message is ``text`` as is (no template expansion).

    Args:
        text: the sentence, without the key name (which :func:`problems` prepends).
        whole: ``text`` already names where the problem is (``tools.t: ...``); it is
            reported as is.
    """
    return PydanticCustomError(CUSTOM, "{text}", {"text": text, "whole": whole})


def says(message: Message, **by_type: str) -> WrapValidator:
    """Replace whatever pydantic says about a field's value with the catalog's sentence.

    Args:
        message: the sentence (or a function of the bad value giving it).
        by_type: a pydantic error type (``greater_than``, ...) -> a sentence for it.

    Returns:
        A validator to put in the field's ``Annotated`` type.
    """

    def wrap(value: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            if first["type"] == CUSTOM:
                raise refuse(first["msg"], whole=_whole(first)) from None
            text = by_type.get(first["type"], message)
            raise refuse(text if isinstance(text, str) else text(value)) from None

    return WrapValidator(wrap)


def _whole(error: Any) -> bool:
    return bool(error.get("ctx", {}).get("whole"))


def checked(check: Callable[[Any], Any], bad: type[ValueError]) -> WrapValidator:
    """A field validated by ``check`` (a semantic check raising ``bad`` with the sentence)."""

    def wrap(value: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            return handler(check(value))
        except bad as exc:
            raise refuse(str(exc)) from None

    return WrapValidator(wrap)


NON_EMPTY = "must be a non-empty string"

Text = Annotated[str, StringConstraints(strict=True, pattern=r"\S"), says(NON_EMPTY)]
"""A string with something besides whitespace in it."""

OptionalText = Annotated[
    Annotated[str, StringConstraints(strict=True, pattern=r"\S")] | None, says(NON_EMPTY)
]
""":data:`Text`, or null for "not set"."""

Flag = Annotated[bool, Strict(), says("must be true or false")]

Names = Annotated[
    list[Annotated[str, StringConstraints(strict=True, min_length=1)]],
    Strict(),
    says("must be a list of non-empty strings"),
]
"""A YAML list of non-empty strings (a tuple or set is refused, as YAML never gives one)."""

Seconds = Annotated[
    Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0)] | None,
    says("must be a number of seconds or null", greater_than_equal="must be zero or positive"),
]
Positive = Annotated[
    Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0)] | None,
    says("must be a number of seconds or null", greater_than="must be positive"),
]


class Shape(BaseModel):
    """Base of every catalog shape: unknown keys are errors, values are not coerced."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def allowed_keys(cls) -> list[str]:
        """The keys a document may use (aliases where a field has one)."""
        return [field.alias or name for name, field in cls.model_fields.items()]


@dataclass(frozen=True, slots=True)
class Problem:
    """One translated error: the key it concerns (``""``: the whole document) and text."""

    key: str
    text: str
    missing: bool = False
    unknown: bool = False


def problems(
    exc: ValidationError,
    shape: type[Shape],
    *,
    not_mapping: str,
    unknown: Callable[[str, Iterable[str]], str] = unknown_key,
) -> list[Problem]:
    """The catalog's issue texts for a failed :meth:`Shape.model_validate`.

    Args:
        exc: the error pydantic raised.
        shape: the model that was validated (its keys feed the did-you-mean).
        not_mapping: the text when the document is not a mapping at all.
        unknown: builds the text for an unknown key from the key and the allowed keys.

    Returns:
        One :class:`Problem` per error, each text starting with its key.
    """
    found: list[Problem] = []
    for error in exc.errors(include_url=False):
        loc = error["loc"]
        key = str(loc[0]) if loc else ""
        kind = error["type"]
        if not loc:
            found.append(Problem("", not_mapping))
        elif kind in ("extra_forbidden", "invalid_key"):
            found.append(Problem(key, unknown(key, shape.allowed_keys()), unknown=True))
        elif kind == "missing":
            found.append(Problem(key, f"{key}: required", missing=True))
        elif kind == CUSTOM and _whole(error):
            found.append(Problem(key, error["msg"]))
        else:
            found.append(Problem(key, f"{key}: {error['msg']}"))
    return found


def in_document_order(found: list[Problem], raw: Mapping[Any, Any]) -> list[str]:
    """Texts ordered as a person reads the file: missing keys first, then by key position."""
    position = {str(key): index for index, key in enumerate(raw)}
    ordered = sorted(found, key=lambda p: (not p.missing, position.get(p.key, -1)))
    return [p.text for p in ordered]
