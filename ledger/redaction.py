"""Personal data out of storage and logs: ``redact(value)`` replaces the values of configured keys.

Keys come from ``settings.LEDGER["REDACT_KEYS"]`` and are matched case-insensitively, ignoring
``_``, ``-``, spaces and dots (``cardNumber``, ``Card-Number`` and ``card_number`` are one key), at
any depth of nested objects and lists. Whole keys only: ``email`` does not catch ``email_sent``
(a flag, not personal data); list ``billing_email`` if that is what a provider sends.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any

from ledger.conf import conf

REDACTED = "[redacted]"
_SEPARATORS = re.compile(r"[\s_\-.]+")


@functools.lru_cache(maxsize=4096)  # a record's keys are mostly the same few, over and over
def normalise_key(key: str) -> str:
    return _SEPARATORS.sub("", key).casefold()


@functools.lru_cache(maxsize=16)
def _normalised(keys: tuple[str, ...]) -> frozenset[str]:
    return frozenset(normalise_key(k) for k in keys)


def redact(value: Any, *, keys: Iterable[str] | None = None) -> Any:
    """A copy of ``value`` (JSON-like: dicts, lists, scalars) with the values of personal-data keys
    replaced by ``"[redacted]"``, whatever they held (a nested object too). The input is not changed."""
    return _redact(value, _normalised(tuple(conf()["REDACT_KEYS"] if keys is None else keys)))


def _redact(value: Any, wanted: frozenset[str]) -> Any:
    if isinstance(value, dict):
        return {
            key: REDACTED if isinstance(key, str) and normalise_key(key) in wanted else _redact(item, wanted)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact(item, wanted) for item in value]
    return value
