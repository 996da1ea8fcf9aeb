"""Adapters: how the ledger talks to one external system, and the typed outcomes they return.

An adapter is registered per system, in every process that performs or reconciles (web, workers,
management commands), typically from an ``AppConfig.ready()``::

    register_adapter("payments", HttpAdapter(base_url=settings.PAYMENTS_URL))

``submit(op)`` sends the operation with ``op.key`` as the provider's idempotency key and says what
happened; ``lookup(op)`` asks the provider what happened to ``op.key``. Neither touches the
database: the services record what they return. An adapter must not raise for an answer it
understands; an exception from ``submit`` is taken as "may have been sent" (unknown).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, Protocol

from ledger.exceptions import UnknownSystem

if TYPE_CHECKING:
    from ledger.models import ExternalOperation


@dataclass(frozen=True)
class Succeeded:
    """The provider did it; ``response`` (JSON) is what ``perform`` returns, now and from storage."""

    response: Any


@dataclass(frozen=True)
class Failed:
    """A definitive rejection: the provider will not do it with this request."""

    reason: str
    detail: Any = None


@dataclass(frozen=True)
class Unknown:
    """From ``submit``: sent, but no usable answer (read timeout, connection lost, 5xx): it may
    have taken effect. From ``lookup``: the lookup itself could not tell (it failed, timed out,
    or the provider says the operation is still processing)."""

    reason: str


@dataclass(frozen=True)
class NoEffect:
    """From ``submit`` only: the provider certainly did not act on it (the connection was never
    made, or it refused before acting, e.g. 429). Sending again with the same key is safe."""

    reason: str


@dataclass(frozen=True)
class NotFound:
    """From ``lookup`` only: the provider has no record of the key, so it never took effect."""


SubmitOutcome = Succeeded | Failed | Unknown | NoEffect
LookupOutcome = Succeeded | Failed | NotFound | Unknown


class Adapter(Protocol):
    @property
    def can_lookup(self) -> bool:
        """False for systems that cannot say what happened to a key: their unknown operations
        wait for a person (the admin's manual resolution). A plain class attribute will do."""

    def submit(self, op: ExternalOperation) -> SubmitOutcome: ...

    def lookup(self, op: ExternalOperation) -> LookupOutcome: ...

    # Optional: ``lookup_many(ops) -> list[LookupOutcome]`` (same order) for a provider that can
    # answer many keys in one request; reconciliation uses it when present (see has_lookup_many),
    # unless a ``can_lookup_many`` attribute says it is not available (any more).


def has_lookup_many(adapter: Adapter) -> bool:
    return callable(getattr(adapter, "lookup_many", None)) and bool(getattr(adapter, "can_lookup_many", True))


_adapters: dict[str, Adapter] = {}
_lock = threading.Lock()


def register_adapter(system: str, adapter: Adapter) -> None:
    """Use ``adapter`` for ``system`` in this process (replacing any earlier one)."""
    if not system or not isinstance(system, str):
        raise ValueError("system must be a non-empty string")
    with _lock:
        _adapters[system] = adapter


def unregister_adapter(system: str) -> None:
    with _lock:
        _adapters.pop(system, None)


def get_adapter(system: str) -> Adapter:
    try:
        return _adapters[system]
    except KeyError:
        raise UnknownSystem(unknown_system_message(system)) from None


def unknown_system_message(system: str) -> str:
    known = ", ".join(sorted(_adapters)) or "none"
    return f"no adapter is registered for system {system!r} (registered: {known})"


def has_adapter(system: str) -> bool:
    return system in _adapters


def record_of(outcome: Succeeded | Failed) -> Any:
    """The provider's record an outcome was read from: a success's response, a failure's detail."""
    return outcome.response if isinstance(outcome, Succeeded) else outcome.detail


def contradiction(op: ExternalOperation, record: Any) -> str | None:
    """What of a provider's record of ``op`` (an answer, a lookup, a webhook) contradicts what we
    sent, in words; None if nothing does. A record names our key, and echoes fields of the request:
    another key, or an echoed field with another value (an amount, a currency), is another
    operation's record (an installation sharing the provider account, ids reused after a restore),
    never our outcome. Fields the record leaves out are not compared."""
    if not isinstance(record, dict):
        return None
    if "key" in record and str(record["key"]) != op.key:
        return f"its key is {str(record['key'])!r}, not {op.key!r}"
    sent = op.request if isinstance(op.request, dict) else {}
    for name, value in sent.items():
        if name in record and not _same_value(record[name], value):
            return f"its {name} is {record[name]!r}, and {value!r} was sent"
    return None


def _same_value(a: Any, b: Any) -> bool:
    """Equal, or the same number written two ways ("90.00" and 90, say)."""
    if a == b:
        return True
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, dict | list) or isinstance(b, dict | list):
        return False
    try:
        return Decimal(str(a)) == Decimal(str(b))
    except (InvalidOperation, ValueError):
        return str(a) == str(b)
