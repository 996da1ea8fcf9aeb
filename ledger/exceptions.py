"""Errors the ledger raises to callers (workflow steps, services above it, the interfaces).

How a workflow step sees them: ``OutcomeUnknown`` (and ``OperationInProgress``,
``ProviderUnavailable``) are ordinary exceptions, so the step retries and the retry reconciles
before it may submit again. ``OperationFailed`` and ``IdempotencyConflict`` are
``NonRetryableError``: retrying with the same key could never change the answer.
"""

from __future__ import annotations

from typing import Any

from workflows.exceptions import IdempotencyConflict as WorkflowsIdempotencyConflict
from workflows.exceptions import NonRetryableError


class LedgerError(Exception):
    """Base class of the ledger's errors; ``code`` is the API's error code."""

    code = "ledger_error"


class IdempotencyConflict(WorkflowsIdempotencyConflict, LedgerError, NonRetryableError):
    """The key was used before for another system, action or request. Nothing was changed.

    A subclass of ``workflows.IdempotencyConflict``: one ``except`` (and the API's 409) covers both.
    """

    code = "idempotency_conflict"


class OutcomeUnknown(LedgerError):
    """The request may or may not have taken effect (a timeout or a lost response after it was
    sent). The operation is ``unknown``; the next ``perform`` with the key looks it up before it
    may submit again, and ``manage.py reconcile`` or a person in the admin can resolve it."""

    code = "outcome_unknown"

    def __init__(self, message: str, *, key: str, reason: str = "") -> None:
        super().__init__(message)
        self.key = key
        self.reason = reason


class OperationInProgress(OutcomeUnknown):
    """Another worker submitted this key moments ago and has not recorded the outcome yet.

    Nothing was sent by this call. Retry later: the stored outcome will answer, or, if that worker
    died, the operation goes stale and the retry looks it up.
    """

    code = "operation_in_progress"


class OperationFailed(LedgerError, NonRetryableError):
    """The external system definitively rejected the operation. The key stays ``failed``: a new
    attempt needs a new key (it is a new request), never a silent retry of this one."""

    code = "operation_failed"

    def __init__(self, message: str, *, key: str, reason: str, detail: Any = None) -> None:
        super().__init__(message)
        self.key = key
        self.reason = reason
        self.detail = detail


class ProviderUnavailable(LedgerError):
    """Nothing reached the external system (a connect error) or it refused before acting (429).

    The operation is back to ``pending``; retrying with the same key is safe.
    """

    code = "provider_unavailable"

    def __init__(self, message: str, *, key: str, reason: str) -> None:
        super().__init__(message)
        self.key = key
        self.reason = reason


class UnknownSystem(LedgerError, NonRetryableError):
    """No adapter is registered for the system (``register_adapter``). Nothing was stored."""

    code = "unknown_system"


class InvalidOperation(LedgerError, NonRetryableError):
    """A key, system, action or request that is not acceptable. Nothing was stored."""

    code = "invalid_operation"


class PerformInTransaction(LedgerError, NonRetryableError):
    """``perform`` was called inside ``transaction.atomic()``. It must commit the ``submitted``
    state before calling out, which an enclosing transaction would prevent (a crash mid-call would
    roll the record of the call back, and a retry would submit again without looking it up)."""

    code = "perform_in_transaction"


class ResolutionRefused(LedgerError):
    """A manual resolution or reconciliation the operation's state (or the caller) does not allow."""

    code = "resolution_refused"

    def __init__(self, message: str, *, status: str = "") -> None:
        super().__init__(message)
        self.status = status
