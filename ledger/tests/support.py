"""Helpers for the ledger's tests."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from ledger.models import ExternalOperation, OperationStatus
from ledger.services import request_fingerprint


def make_operation(
    key: str,
    status: str = OperationStatus.UNKNOWN,
    *,
    system: str = "payments",
    action: str = "refund",
    request: dict[str, Any] | None = None,
    sent_ago: timedelta | None = timedelta(hours=1),
    **fields: Any,
) -> ExternalOperation:
    """An operation in any state, as a fixture (the status is protected: set once, at creation)."""
    request = {"order": key, "amount": "10.00"} if request is None else request
    values: dict[str, Any] = {
        "submitted_at": timezone.now() - sent_ago if sent_ago is not None else None,
        "submit_count": 0 if status == OperationStatus.PENDING else 1,
        **fields,
    }
    return ExternalOperation.objects.create(
        key=key,
        system=system,
        action=action,
        request=request,
        request_hash=request_fingerprint(system=system, action=action, request=request),
        status=status,
        **values,
    )


def snapshot(*operations: ExternalOperation) -> list[tuple[Any, ...]]:
    """What a refusal must leave unchanged."""
    return [
        tuple(
            ExternalOperation.objects.filter(pk=op.pk)
            .values_list("status", "submit_count", "lookup_count", "updated_at", "response", "error", "note")
            .get()
        )
        for op in operations
    ]
