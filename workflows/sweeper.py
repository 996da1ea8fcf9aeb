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
from workflows.logs import log_state
from workflows.metrics import RECOVERIES
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
        .values_list("id", "queue", "attempt", "workflow", "wait_step")[:batch]
    )
    if not due:
        return 0
    # The conditions are repeated in the UPDATE: a run that changed since the SELECT is left alone.
    # WorkflowRun.wake in one UPDATE for the batch.
    WorkflowRun.objects.filter(id__in=[row[0] for row in due], status__in=TIMED, wake_at__lte=now).update(
        status=RunStatus.QUEUED, enqueued_at=now, **NO_WAIT
    )
    for run_id, queue, attempt, workflow, step in due:
        enqueue_run(run_id, queue=queue)
        emit_stored_status(run_id)
        log_state(run_id, attempt, workflow, "woken", step=step, reason="timer")
    return len(due)


def _requeue_lost(now: datetime, batch: int) -> int:
    """Runs ready to advance with no live lease, enqueued too long ago: the message or worker is gone."""
    stale = now - timedelta(seconds=conf()["ENQUEUE_GRACE_SECONDS"])
    lost = (
        Q(status__in=CLAIMABLE)
        & (Q(enqueued_at__lt=stale) | Q(enqueued_at__isnull=True))
        & (Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
    )
    runs = list(WorkflowRun.objects.filter(lost).values_list("id", "queue", "status", "attempt", "workflow")[:batch])
    if not runs:
        return 0
    WorkflowRun.objects.filter(lost, id__in=[row[0] for row in runs]).update(enqueued_at=now)
    for run_id, queue, status, attempt, workflow in runs:
        enqueue_run(run_id, queue=queue)
        # A queued run's message was lost; a running one's worker died (its claim counts that
        # recovery, as lease_expired, when a worker takes it).
        reason = "lost_enqueue" if status == RunStatus.QUEUED else "lease_expired"
        if status == RunStatus.QUEUED:
            RECOVERIES.labels(reason).inc()
        log_state(run_id, attempt, workflow, "requeued", reason=reason)
    return len(runs)
