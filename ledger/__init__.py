"""The ledger: external side effects done at most once, and what a colleague needs to answer for them.

    from ledger import perform, prepare, OutcomeUnknown, IdempotencyConflict, OperationFailed
    from ledger import wait_for_outcome
    from ledger import register_adapter, HttpAdapter, record_create

The services are imported lazily so that importing this package does not need Django's app
registry to be ready (an app's ready() registers its adapters through it).
"""

from typing import TYPE_CHECKING, Any

from ledger.adapters import (
    Adapter,
    Failed,
    LookupOutcome,
    NoEffect,
    NotFound,
    SubmitOutcome,
    Succeeded,
    Unknown,
    register_adapter,
    unregister_adapter,
)
from ledger.exceptions import (
    IdempotencyConflict,
    InvalidOperation,
    LedgerError,
    OperationFailed,
    OperationInProgress,
    OutcomeUnknown,
    PerformInTransaction,
    ProviderUnavailable,
    UnknownSystem,
)
from ledger.http import HttpAdapter
from ledger.redaction import redact

if TYPE_CHECKING:  # what __getattr__ below returns, for the type checker ("as": exported)
    from ledger.services import operation_perform, operation_prepare
    from ledger.services import record_create as record_create
    from ledger.waits import wait_for_outcome as wait_for_outcome

    perform = operation_perform
    prepare = operation_prepare

_LAZY = {
    "perform": ("ledger.services", "operation_perform"),
    "prepare": ("ledger.services", "operation_prepare"),
    "record_create": ("ledger.services", "record_create"),
    "wait_for_outcome": ("ledger.waits", "wait_for_outcome"),
}

__all__ = [
    "Adapter",
    "Failed",
    "HttpAdapter",
    "IdempotencyConflict",
    "InvalidOperation",
    "LedgerError",
    "LookupOutcome",
    "NoEffect",
    "NotFound",
    "OperationFailed",
    "OperationInProgress",
    "OutcomeUnknown",
    "PerformInTransaction",
    "ProviderUnavailable",
    "SubmitOutcome",
    "Succeeded",
    "Unknown",
    "UnknownSystem",
    "redact",
    "register_adapter",
    "unregister_adapter",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'ledger' has no attribute {name!r}")
