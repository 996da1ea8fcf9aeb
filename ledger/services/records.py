"""Operational records: what a colleague needs to answer a customer, redacted, kept for a while."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db.models import QuerySet
from django.utils import timezone

from ledger.conf import conf
from ledger.exceptions import InvalidOperation
from ledger.models import ExternalOperation, OperationalRecord
from ledger.redaction import redact
from ledger.services.common import logger
from workflows.models import WorkflowRun

PURGE_BATCH = 1000


def record_create(
    *,
    request_id: str,
    tool: str,
    run: WorkflowRun | UUID | str | None = None,
    step: str = "",
    observed_at: datetime | None = None,
    response: Any = None,
    approval_pending: bool = False,
    operation: ExternalOperation | None = None,
) -> OperationalRecord:
    """Store one consequential action. ``response`` is redacted (LEDGER REDACT_KEYS, at any depth)
    before it reaches the database; ``observed_at`` is when the data the action relied on was read
    (the order's state, the policy's version), not when the record is written."""
    if not isinstance(request_id, str) or not request_id.strip() or len(request_id) > 255:
        raise InvalidOperation("request_id must be a non-empty string of at most 255 characters")
    if observed_at is not None and timezone.is_naive(observed_at):
        raise InvalidOperation("observed_at must be timezone-aware")
    try:
        json.dumps(response, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidOperation(f"response is not JSON: {exc}") from None
    record = OperationalRecord.objects.create(
        request_id=request_id,
        tool=tool,
        step=step,
        observed_at=observed_at,
        response=redact(response),
        approval_pending=approval_pending,
        operation=operation,
        run_id=run.pk if isinstance(run, WorkflowRun) else run,
    )
    logger.info("record %s: %s %s (approval pending: %s)", record.pk, request_id, tool, approval_pending)
    return record


@dataclass(frozen=True)
class PurgeResult:
    count: int
    cutoff: datetime
    dry_run: bool


def record_purge(
    *, older_than: timedelta | None = None, dry_run: bool = False, now: datetime | None = None
) -> PurgeResult:
    """Delete operational records created before now - ``older_than`` (default LEDGER
    RETENTION_DAYS), and only those. In batches, each its own short transaction, so a large
    purge never holds locks on the whole table."""
    try:
        cutoff = retention_cutoff(older_than, default_days=conf()["RETENTION_DAYS"], now=now)
    except ValueError as exc:
        raise InvalidOperation(str(exc)) from None
    result = purge_in_batches(OperationalRecord.objects.filter(created_at__lt=cutoff), cutoff=cutoff, dry_run=dry_run)
    if not dry_run:
        logger.info("purged %d operational records created before %s", result.count, cutoff.isoformat())
    return result


def retention_cutoff(older_than: timedelta | None, *, default_days: int, now: datetime | None = None) -> datetime:
    """Where a retention purge stops: ``now - older_than`` (default ``default_days`` days).
    ValueError for a period of zero or less (it would delete every record) or one reaching before
    the year 1."""
    older_than = timedelta(days=default_days) if older_than is None else older_than
    if older_than <= timedelta(0):
        raise ValueError("the retention period must be more than zero (it would delete every record)")
    try:
        return (now or timezone.now()) - older_than
    except OverflowError:
        raise ValueError("the retention period reaches before the year 1") from None


def purge_in_batches(expired: QuerySet[Any], *, cutoff: datetime, dry_run: bool) -> PurgeResult:
    """Delete the rows of ``expired`` (those before ``cutoff``) in batches of PURGE_BATCH, each its
    own short transaction, so a large purge never holds locks on the whole table; with ``dry_run``,
    count them. The retention purges of the ledger, the webhooks and the schedules share it."""
    if dry_run:
        return PurgeResult(count=expired.count(), cutoff=cutoff, dry_run=True)
    total = 0
    while ids := list(expired.order_by("pk").values_list("pk", flat=True)[:PURGE_BATCH]):
        # ``expired`` again in the DELETE: a row that changed since the SELECT (a failed webhook
        # delivery an operator made pending again, say) is no longer the purge's to delete.
        deleted, _ = expired.filter(pk__in=ids).delete()
        total += deleted
    return PurgeResult(count=total, cutoff=cutoff, dry_run=False)
