"""``/metrics``: what the database says now, read when Prometheus scrapes, plus the events the
processes counted (``workflows.metrics``, ``ledger.metrics``, ``webhooks.metrics``).

State is read from PostgreSQL at scrape time, never counted in processes: any web process answers
the same, and a restart loses nothing. Each query reads a partial index or a small set (unfinished
runs, due timers, open operations, pending approvals, open turns, later webhook actions not done);
none grows with the finished history (docs/decisions/0019-metrics-and-health.md has their plans).
Events come from every process through prometheus-client's multiprocess mode when
``PROMETHEUS_MULTIPROC_DIR`` is set, else from this process alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import datetime

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Count, Min, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from agents.models import TURN_OPEN, Chunk, Turn, TurnStatus
from approvals.models import ApprovalRequest, ApprovalStatus
from ledger.models import ExternalOperation, OperationStatus
from webhooks.models import ActionState, WebhookDelivery
from workflows.models import NON_TERMINAL, TIMED, RunStatus, WorkflowRun
from workflows.registry import workflow_names

UNSETTLED = [OperationStatus.PENDING, OperationStatus.SUBMITTED, OperationStatus.UNKNOWN]


def _age(now: datetime, since: datetime | None) -> float:
    """Seconds from ``since`` to now; 0 when there is nothing (no row, nothing late)."""
    return max((now - since).total_seconds(), 0.0) if since is not None else 0.0


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def run_metrics(now: datetime) -> Iterator[Metric]:
    runs = GaugeMetricFamily(
        "workflows_runs",
        "Unfinished runs by workflow and status (finished ones: workflows_runs_finished_total).",
        labels=["workflow", "status"],
    )
    counts = {(name, str(status)): 0 for name in workflow_names() for status in NON_TERMINAL}
    rows = WorkflowRun.objects.filter(status__in=NON_TERMINAL).values_list("workflow", "status")
    for workflow, status, n in rows.annotate(n=Count("id")).order_by():
        counts[(workflow, status)] = n
    for (workflow, status), n in sorted(counts.items()):
        runs.add_metric([workflow, status], n)
    yield runs
    due = WorkflowRun.objects.filter(status__in=TIMED, wake_at__lte=now).aggregate(oldest=Min("wake_at"))
    yield gauge(
        "workflows_oldest_due_timer_age_seconds",
        "How late the oldest timer that is due and not fired is (0: none): the sweeper's lag.",
        _age(now, due["oldest"]),
    )
    queued = WorkflowRun.objects.filter(status=RunStatus.QUEUED).aggregate(oldest=Min("enqueued_at"))
    yield gauge(
        "workflows_oldest_queued_run_age_seconds",
        "How long the run queued longest has waited for a worker (0: none queued).",
        _age(now, queued["oldest"]),
    )


def operation_metrics(now: datetime) -> Iterator[Metric]:
    operations = GaugeMetricFamily(
        "ledger_operations",
        "External operations not settled, by status (settled ones: ledger_operation_events_total).",
        labels=["status"],
    )
    counts = {str(status): 0 for status in UNSETTLED}
    for status, n in (
        ExternalOperation.objects.filter(status__in=UNSETTLED).values_list("status").annotate(n=Count("id")).order_by()
    ):
        counts[status] = n
    for status, n in counts.items():
        operations.add_metric([status], n)
    yield operations
    unknown = ExternalOperation.objects.filter(status=OperationStatus.UNKNOWN).aggregate(
        oldest=Min(Coalesce("submitted_at", "created_at"))
    )
    yield gauge(
        "ledger_oldest_unknown_operation_age_seconds",
        "Seconds since the operation whose outcome has been unknown longest was sent (0: none).",
        _age(now, unknown["oldest"]),
    )


def approval_metrics(now: datetime) -> Iterator[Metric]:
    pending = ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING).aggregate(
        n=Count("id"), oldest=Min("created_at"), expiry=Min("expires_at")
    )
    yield gauge("approvals_pending", "Approval requests waiting for a decision.", pending["n"])
    yield gauge(
        "approvals_oldest_pending_age_seconds",
        "Seconds the oldest pending approval request has waited (0: none).",
        _age(now, pending["oldest"]),
    )
    expiry = pending["expiry"]
    yield gauge(
        "approvals_next_expiry_seconds",
        "Seconds until the first pending request expires (negative: overdue, its timer not fired "
        "yet; +Inf: none pending).",
        (expiry - now).total_seconds() if expiry is not None else math.inf,
    )


def turn_metrics(now: datetime) -> Iterator[Metric]:
    turns = GaugeMetricFamily("agents_turns", "Chat turns not ended, by status.", labels=["status"])
    counts = {str(status): 0 for status in TURN_OPEN}
    for status, n in Turn.objects.filter(status__in=TURN_OPEN).values_list("status").annotate(n=Count("id")).order_by():
        counts[status] = n
    for status, n in counts.items():
        turns.add_metric([status], n)
    yield turns
    # Per running turn, its newest chunk (the unique (turn, seq) index, read backwards, one row each).
    newest = Chunk.objects.filter(turn=OuterRef("pk")).order_by("-seq").values("created_at")[:1]
    moved = (
        Turn.objects.filter(status=TurnStatus.RUNNING)
        .annotate(moved=Coalesce(Subquery(newest), "started_at", "created_at"))
        .aggregate(oldest=Min("moved"))
    )
    yield gauge(
        "agents_stream_lag_seconds",
        "Seconds since the stream of the running turn quietest for longest last moved (its newest "
        "chunk, or its start): a stuck turn or model (0: none running).",
        _age(now, moved["oldest"]),
    )


def webhook_metrics(now: datetime) -> Iterator[Metric]:
    """The later actions of webhook deliveries not done: to try (pending) or given up (failed)."""
    actions = GaugeMetricFamily(
        "webhooks_later_actions",
        "Actions of deliveries to sources that act later, not done: pending (to try) or failed.",
        labels=["state"],
    )
    counts = {str(ActionState.PENDING): 0, str(ActionState.FAILED): 0}
    rows = WebhookDelivery.objects.filter(action_state__in=list(counts)).values_list("action_state")
    for state, n in rows.annotate(n=Count("id")).order_by():
        counts[state] = n
    for state, n in counts.items():
        actions.add_metric([state], n)
    yield actions
    due = WebhookDelivery.objects.filter(action_state=ActionState.PENDING, act_after__lte=now)
    yield gauge(
        "webhooks_oldest_overdue_action_age_seconds",
        "Seconds the most overdue pending later action is past its due time: workers down or "
        "behind, or its task lost and not swept yet (0: none overdue).",
        _age(now, due.aggregate(oldest=Min("act_after"))["oldest"]),
    )


class DatabaseCollector(Collector):
    """The gauges read from the database at each scrape; ``durable_database_up`` 0 if it failed."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        try:
            metrics = [
                *run_metrics(now),
                *operation_metrics(now),
                *approval_metrics(now),
                *turn_metrics(now),
                *webhook_metrics(now),
            ]
        except DatabaseError:
            yield gauge("durable_database_up", "1 if the scrape could read the database.", 0)
            return
        yield gauge("durable_database_up", "1 if the scrape could read the database.", 1)
        yield from metrics


class _ThisProcess(Collector):
    """Without PROMETHEUS_MULTIPROC_DIR: this process's own metrics (the default registry)."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def multiprocess_dir() -> str:
    return str(settings.PROMETHEUS_MULTIPROC_DIR)


def exposition() -> bytes:
    """The text Prometheus scrapes (format 0.0.4)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    if multiprocess_dir():
        MultiProcessCollector(registry, path=multiprocess_dir())  # type: ignore[no-untyped-call]  # not annotated
    else:
        registry.register(_ThisProcess())
    return generate_latest(registry)
