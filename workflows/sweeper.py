"""The sweeper: fires due timers and re-enqueues runs whose worker or enqueue was lost.

Runs from Celery beat every WORKFLOWS_SWEEP_INTERVAL seconds and from ``manage.py workflows sweep``.
Both questions it asks are answered from partial indexes, so finished runs cost it nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from workflows.conf import conf
from workflows.models import CLAIMABLE, NO_WAIT, TIMED, RunStatus, WorkflowRun
from workflows.outbox import emit_stored_status, enqueue_run


@dataclass(frozen=True)
class SweepReport:
    timers_fired: int
    requeued: int
    seconds: float


def sweep(*, now: datetime | None = None, batch: int = 1000) -> SweepReport:
    started = timezone.now()
    now = now or started
    fired = _fire_due_timers(now, batch)
    requeued = _requeue_lost(now, batch)
    return SweepReport(fired, requeued, (timezone.now() - started).total_seconds())


def _fire_due_timers(now: datetime, batch: int) -> int:
    due = list(
        WorkflowRun.objects.filter(status__in=TIMED, wake_at__lte=now)
        .order_by("wake_at")
        .values_list("id", "queue")[:batch]
    )
    if not due:
        return 0
    # The conditions are repeated in the UPDATE: a run that changed since the SELECT is left alone.
    # WorkflowRun.wake in one UPDATE for the batch.
    WorkflowRun.objects.filter(id__in=[run_id for run_id, _ in due], status__in=TIMED, wake_at__lte=now).update(
        status=RunStatus.QUEUED, enqueued_at=now, **NO_WAIT
    )
    for run_id, queue in due:
        enqueue_run(run_id, queue=queue)
        emit_stored_status(run_id)
    return len(due)


def _requeue_lost(now: datetime, batch: int) -> int:
    """Runs ready to advance with no live lease, enqueued too long ago: the message or worker is gone."""
    stale = now - timedelta(seconds=conf()["ENQUEUE_GRACE_SECONDS"])
    lost = (
        Q(status__in=CLAIMABLE)
        & (Q(enqueued_at__lt=stale) | Q(enqueued_at__isnull=True))
        & (Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
    )
    runs = list(WorkflowRun.objects.filter(lost).values_list("id", "queue")[:batch])
    if not runs:
        return 0
    WorkflowRun.objects.filter(lost, id__in=[run_id for run_id, _ in runs]).update(enqueued_at=now)
    for run_id, queue in runs:
        enqueue_run(run_id, queue=queue)
    return len(runs)
