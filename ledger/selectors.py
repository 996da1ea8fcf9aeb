"""Reads: who may see or resolve operations, which need attention, which to reconcile."""
from __future__ import annotations

from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.db.models import Case, IntegerField, Q, QuerySet, Value, When
from django.utils import timezone

from ledger.conf import stale_after
from ledger.models import ExternalOperation, OperationStatus
from workflows.hooks import RunSection
from workflows.models import WorkflowRun

# Attention ranks, most urgent first; NONE for operations that need nobody.
UNKNOWN_RANK, STALE_RANK, FAILED_RANK, NONE_RANK = 0, 1, 2, 9
ATTENTION_LABELS = {UNKNOWN_RANK: "unknown", STALE_RANK: "stale submit", FAILED_RANK: "failed"}


def can_see_operations(user: AbstractUser | AnonymousUser) -> bool:
    return bool(user.is_authenticated and user.is_staff and user.has_perm("ledger.view_externaloperation"))


def can_resolve_operations(user: AbstractUser | AnonymousUser) -> bool:
    return bool(user.is_authenticated and user.is_staff and user.has_perm("ledger.resolve_externaloperation"))


def stale_submitted(now: datetime | None = None, age: timedelta | None = None) -> Q:
    """Submitted operations whose worker cannot still be waiting for an answer (see is_stale)."""
    cutoff = (now or timezone.now()) - (stale_after() if age is None else age)
    return Q(status=OperationStatus.SUBMITTED) & (Q(submitted_at__lt=cutoff) | Q(submitted_at__isnull=True))


def with_attention(operations: QuerySet[ExternalOperation], *, now: datetime | None = None
                   ) -> QuerySet[ExternalOperation]:
    """Annotated with ``attention_rank``: unknown 0, stale submitted 1, failed 2, others 9."""
    return operations.annotate(
        attention_rank=Case(
            When(status=OperationStatus.UNKNOWN, then=Value(UNKNOWN_RANK)),
            When(stale_submitted(now), then=Value(STALE_RANK)),
            When(status=OperationStatus.FAILED, then=Value(FAILED_RANK)),
            default=Value(NONE_RANK),
            output_field=IntegerField(),
        )
    )


def attention_label(rank: int | None) -> str | None:
    """"unknown", "stale submit", "failed", or None for an operation that needs nobody."""
    return ATTENTION_LABELS.get(rank) if rank is not None else None


def operation_list(*, status: str | None = None, system: str | None = None) -> QuerySet[ExternalOperation]:
    """Operations, with ``attention_rank``; the caller checks ``can_see_operations`` first."""
    operations = with_attention(ExternalOperation.objects.select_related("resolved_by"))
    if status:
        operations = operations.filter(status=status)
    if system:
        operations = operations.filter(system=system)
    return operations


def operations_to_reconcile(
    *, system: str | None = None, older_than: timedelta | None = None, now: datetime | None = None
) -> QuerySet[ExternalOperation]:
    """Unknown operations and stale submitted ones, oldest submit first.

    Without ``older_than``: every unknown one, and submits older than LEDGER STALE_SUBMITTED_SECONDS.
    With it: unknown ones and submits last sent more than ``older_than`` ago (an operator may
    choose a shorter age than the setting; a submit younger than a call's timeouts may still be
    in flight, and its lookup could then say "not found" for a request still on its way).
    """
    now = now or timezone.now()
    unknown = Q(status=OperationStatus.UNKNOWN)
    if older_than is not None:
        unknown &= Q(submitted_at__lt=now - older_than) | Q(submitted_at__isnull=True)
    operations = ExternalOperation.objects.filter(unknown | stale_submitted(now, older_than))
    if system:
        operations = operations.filter(system=system)
    return operations.order_by("submitted_at", "pk")


def run_operations_needing_reconciliation(run: WorkflowRun) -> QuerySet[ExternalOperation]:
    """The run's operations still submitted or unknown: their effect may or may not have happened."""
    return ExternalOperation.objects.filter(
        run=run, status__in=[OperationStatus.SUBMITTED, OperationStatus.UNKNOWN]
    ).order_by("created_at", "id")


def run_section(run: WorkflowRun) -> RunSection | None:
    """``workflows.hooks.register_run_section``: shown on the run's page and admin page."""
    operations = list(run_operations_needing_reconciliation(run))
    if not operations:
        return None
    return {
        "title": "External operations needing reconciliation",
        "note": "Their outcome is not known yet: `manage.py reconcile` or the admin (External operations) "
                "settles them; until then do not tell the customer it happened or did not.",
        "columns": ["key", "system", "action", "status", "step", "since"],
        "rows": [[op.key, op.system, op.action, op.status, op.step, op.created_at.isoformat(timespec="seconds")]
                 for op in operations],
    }
