"""Matchers and ``${name}`` substitution of scripted conversations (SPEC K3).

:func:`match` checks a received message against an ``expect`` pattern: a literal
(equality), ``{regex: ...}``, ``{any: true}``, ``{absent: true}``,
``{contains: pattern}`` or ``{capture: name}``; nested objects match as subsets, lists
element by element. :func:`substitute` replaces ``${name}`` by captured values and
raises :class:`StepFailed` for a name nothing captured.
"""

from __future__ import annotations

import re
from typing import Any, Final

from protocol.codec import encode_json

MATCHER_KEYS: Final = frozenset({"regex", "any", "capture", "absent", "contains"})
_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_MISSING: Final = object()


class StepFailed(Exception):
    """A step did not get what it expected; the message says expected vs got."""


def substitute(value: Any, captures: dict[str, Any]) -> Any:
    """Replace ``${name}`` references by captured values, recursively.

    A string that is exactly one reference takes the captured value with its type
    (an integer stays an integer); a reference inside a longer string is formatted in.

    Raises:
        StepFailed: a reference to a name nothing captured.
    """
    if isinstance(value, dict):
        return {k: substitute(v, captures) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, captures) for v in value]
    if not isinstance(value, str):
        return value
    whole = _REF.fullmatch(value)
    if whole:
        return _lookup(whole.group(1), captures)
    return _REF.sub(lambda ref: str(_lookup(ref.group(1), captures)), value)


def _lookup(name: str, captures: dict[str, Any]) -> Any:
    if name not in captures:
        raise StepFailed(f"${{{name}}} was never captured (known: {sorted(captures)})")
    return captures[name]


def _is_matcher(pattern: Any) -> bool:
    return isinstance(pattern, dict) and bool(pattern) and set(pattern) <= MATCHER_KEYS


def match(pattern: Any, value: Any, captures: dict[str, Any], where: str = "") -> str | None:
    """Match ``value`` against ``pattern``; ``None`` when it matches, else why not.

    Captures found on the way are added to ``captures`` (pass a scratch dict and keep it
    only on success).
    """
    if _is_matcher(pattern):
        return _match_matcher(pattern, value, captures, where)
    if isinstance(pattern, dict):
        if not isinstance(value, dict):
            return f"{where or '/'}: expected an object, got {short(value)}"
        for key, sub in pattern.items():
            found = value.get(key, _MISSING)
            if found is _MISSING:
                if _is_matcher(sub) and sub.get("absent") is True:
                    continue
                return f"{where}/{key}: missing"
            problem = match(sub, found, captures, f"{where}/{key}")
            if problem:
                return problem
        return None
    if isinstance(pattern, list):
        if not isinstance(value, list) or len(value) != len(pattern):
            return f"{where or '/'}: expected a list of {len(pattern)}, got {short(value)}"
        for i, (sub, item) in enumerate(zip(pattern, value, strict=True)):
            problem = match(sub, item, captures, f"{where}/{i}")
            if problem:
                return problem
        return None
    if _equal(pattern, value):
        return None
    return f"{where or '/'}: expected {short(pattern)}, got {short(value)}"


def _equal(a: Any, b: Any) -> bool:
    # JSON has no int/float distinction worth failing a script on (1 == 1.0), but
    # true is not 1.
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _match_matcher(
    pattern: dict[str, Any], value: Any, captures: dict[str, Any], where: str
) -> str | None:
    at = where or "/"
    if pattern.get("absent") is True:
        return f"{at}: expected absent, got {short(value)}"
    if "regex" in pattern and not (isinstance(value, str) and re.search(pattern["regex"], value)):
        return f"{at}: {short(value)} does not match /{pattern['regex']}/"
    if "contains" in pattern:
        if not isinstance(value, list):
            return f"{at}: expected a list, got {short(value)}"
        for item in value:
            scratch: dict[str, Any] = {}
            if match(pattern["contains"], item, scratch, at) is None:
                captures.update(scratch)
                break
        else:
            return f"{at}: no element matches {short(pattern['contains'])}"
    if "capture" in pattern:
        captures[str(pattern["capture"])] = value
    return None


def short(value: Any, limit: int = 160) -> str:
    """``value`` as JSON (a string as its repr), cut to ``limit`` characters for reports."""
    text = encode_json(value).decode() if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
