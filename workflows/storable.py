"""What PostgreSQL can store of a JSON value, checked in one place.

jsonb and text refuse a NUL character (``\\u0000``) and an unpaired UTF-16 surrogate (``\\ud800``):
JSON and Python strings can hold both, so a value that passed every other check would fail at the
INSERT, as a 500 or a failed step. Nesting is bounded too: Python's JSON encoder and decoder
recurse, so a deep enough value raises RecursionError wherever it is next encoded (the API's
renderer, the jsonb adapter, a step's result).

The walks here are iterative, so that checking a deep value cannot itself hit the recursion limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

# Far deeper than any real payload, far below the interpreter's recursion limit (1,000 frames,
# shared with Django's and DRF's own).
MAX_JSON_DEPTH = 100


def text_problem(text: str) -> str | None:
    """Why PostgreSQL cannot store ``text``, or None."""
    if "\x00" in text:
        return "a NUL character (\\u0000), which cannot be stored"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # only surrogates make UTF-8 encoding fail
            return f"an unpaired surrogate (\\u{ord(text[exc.start]):04x}), which is not valid Unicode"
    return None


def json_problem(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why ``value`` (parsed JSON: dicts, lists, strings, numbers...) cannot be stored, as the end
    of a sentence about it ("contains a NUL character ..."), or None."""
    for item, depth in _walk(value):
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return f"contains {problem}"
        elif depth >= max_depth:  # _walk yields only strings and containers
            return f"is nested more than {max_depth} levels deep"
    return None


def json_too_deep(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> bool:
    return any(not isinstance(item, str) and depth >= max_depth for item, depth in _walk(value))


def _walk(value: Any) -> Iterator[tuple[Any, int]]:
    """Every string (keys included) and container in ``value`` with the number of containers
    around it; scalars that are not strings are skipped."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            yield item, depth
        elif isinstance(item, dict):
            yield item, depth
            stack.extend((key, depth + 1) for key in item)
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list | tuple):
            yield item, depth
            stack.extend((child, depth + 1) for child in item)


def json_loads_strict(text: str | bytes) -> Any:
    """``json.loads`` without Python's extensions: NaN, Infinity and numbers too large for a float
    are not JSON, and PostgreSQL refuses to store them. ValueError for them as for any bad JSON."""
    return json.loads(text, parse_constant=_not_json, parse_float=_finite, parse_int=_whole)


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _whole(text: str) -> int:
    # Python refuses more digits than sys.get_int_max_str_digits() (4,300) with advice for its own
    # programmers ("use sys.set_int_max_str_digits()"): a sender is told what is wrong instead.
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"a whole number of {len(text):,} characters is too large a number") from None


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is too large a number")
    return value
