"""Reads: who may see or resolve operations, which need attention, which to reconcile."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.db.models import Case, IntegerField, Q, QuerySet, Value, When
from django.utils import timezone

from ledger.conf import conf, stale_after
from ledger.models import ExternalOperation, OperationStatus
from workflows.hooks import RunSection
from workflows.models import TERMINAL, WorkflowRun

# Attention ranks, most urgent first; NONE for operations that need nobody.
UNKNOWN_RANK, STALE_RANK, RUN_ENDED_RANK, FAILED_RANK, NONE_RANK = 0, 1, 2, 3, 9
ATTENTION_LABELS = {
    UNKNOWN_RANK: "unknown",
    STALE_RANK: "stale submit",
    RUN_ENDED_RANK: "run ended, not final",
    FAILED_RANK: "failed",
}


def can_see_operations(user: AbstractUser | AnonymousUser) -> bool:
    return bool(user.is_authenticated and user.is_staff and user.has_perm("ledger.view_externaloperation"))


def can_resolve_operations(user: AbstractUser | AnonymousUser) -> bool:
    return bool(user.is_authenticated and user.is_staff and user.has_perm("ledger.resolve_externaloperation"))


def stale_submitted(now: datetime | None = None, age: timedelta | None = None) -> Q:
    """Submitted operations whose worker cannot still be waiting for an answer (see is_stale)."""
    cutoff = (now or timezone.now()) - (stale_after() if age is None else age)
    return Q(status=OperationStatus.SUBMITTED) & (Q(submitted_at__lt=cutoff) | Q(submitted_at__isnull=True))


def with_attention(
    operations: QuerySet[ExternalOperation], *, now: datetime | None = None
) -> QuerySet[ExternalOperation]:
    """Annotated with ``attention_rank``: unknown 0, stale submitted 1, pending or submitted with
    its run ended 2 (nobody but reconcile will settle it), failed 3, others 9."""
    return operations.annotate(
        attention_rank=Case(
            When(status=OperationStatus.UNKNOWN, then=Value(UNKNOWN_RANK)),
            When(stale_submitted(now), then=Value(STALE_RANK)),
            When(
                Q(status__in=[OperationStatus.PENDING, OperationStatus.SUBMITTED], run__status__in=TERMINAL),
                then=Value(RUN_ENDED_RANK),
            ),
            When(status=OperationStatus.FAILED, then=Value(FAILED_RANK)),
            default=Value(NONE_RANK),
            output_field=IntegerField(),
        )
    )


def attention_label(rank: int | None) -> str | None:
    """ "unknown", "stale submit", "failed", or None for an operation that needs nobody."""
    return ATTENTION_LABELS.get(rank) if rank is not None else None


def operation_list(*, status: str | None = None, system: str | None = None) -> QuerySet[ExternalOperation]:
    """Operations, with ``attention_rank``; the caller checks ``can_see_operations`` first."""
    operations = with_attention(ExternalOperation.objects.select_related("resolved_by"))
    if status:
        operations = operations.filter(status=status)
    if system:
        operations = operations.filter(system=system)
    return operations


def failed_by_hand_to_recheck(*, system: str | None = None, now: datetime | None = None) -> QuerySet[ExternalOperation]:
    """Operations a person marked failed after they were sent, within LEDGER RECHECK_RESOLVED_DAYS:
    a provider may act on a request long after our call gave up on it, so reconcile keeps asking."""
    cutoff = (now or timezone.now()) - timedelta(days=conf()["RECHECK_RESOLVED_DAYS"])
    operations = ExternalOperation.objects.filter(
        status=OperationStatus.FAILED, error__reason="resolved_by_hand", submit_count__gt=0, finished_at__gte=cutoff
    )
    if system:
        operations = operations.filter(system=system)
    return operations.order_by("finished_at", "pk")


def is_stale(op: ExternalOperation, *, now: datetime | None = None, age: timedelta | None = None) -> bool:
    """A submitted operation whose worker can no longer be waiting for the answer: the call would
    have timed out long ago (LEDGER STALE_SUBMITTED_SECONDS, or ``age``), so the worker died."""
    if op.status != OperationStatus.SUBMITTED:
        return False
    if op.submitted_at is None:
        return True
    return op.submitted_at < (now or timezone.now()) - (stale_after() if age is None else age)


def sent_and_orphaned(op: ExternalOperation) -> bool:
    """Pending again after a send, its run ended: nobody will send it again, and no lookup can prove
    an earlier send will not still arrive. Reconcile looks it up like an unknown one and never
    abandons it; a person may settle it."""
    return op.status == OperationStatus.PENDING and op.submit_count > 0 and run_ended(op)


def in_doubt(op: ExternalOperation, *, now: datetime | None = None, age: timedelta | None = None) -> bool:
    """Nobody knows whether ``op`` happened and nobody running will find out: unknown, a submit gone
    stale (``is_stale``, with ``age``), or sent and orphaned (``sent_and_orphaned``). Reconcile looks
    these up; a person may settle them by hand."""
    return op.status == OperationStatus.UNKNOWN or is_stale(op, now=now, age=age) or sent_and_orphaned(op)


def resolvable_by_hand(op: ExternalOperation, *, now: datetime | None = None) -> bool:
    """Whether a person may settle ``op`` with a note: whenever its outcome is in doubt."""
    return in_doubt(op, now=now)


def run_ended(op: ExternalOperation) -> bool:
    """The run that performed ``op`` has ended (completed, failed or terminated): it will not send
    or check the operation again. False for an operation performed outside a run."""
    return op.run_id is not None and op.run is not None and op.run.status in TERMINAL


def pending_of_ended_runs() -> Q:
    """Pending operations whose run has ended: nobody will send them (reconcile abandons them)."""
    return Q(status=OperationStatus.PENDING, run__status__in=TERMINAL)


def operations_to_reconcile(
    *, system: str | None = None, older_than: timedelta | None = None, now: datetime | None = None
) -> QuerySet[ExternalOperation]:
    """Unknown operations, stale submitted ones and pending ones of ended runs, oldest submit first.

    Without ``older_than``: every unknown one, and submits older than LEDGER STALE_SUBMITTED_SECONDS.
    With it: unknown ones and submits last sent more than ``older_than`` ago (an operator may
    choose a shorter age than the setting; a submit younger than a call's timeouts may still be
    in flight, and its lookup could then say "not found" for a request still on its way: such a
    "not found" is not believed, see ``ledger.conf.in_flight_window``). Every operation of a run
    that ended stays here until it is final, whoever ended the run.
    """
    now = now or timezone.now()
    unknown = Q(status=OperationStatus.UNKNOWN)
    if older_than is not None:
        unknown &= Q(submitted_at__lt=now - older_than) | Q(submitted_at__isnull=True)
    operations = ExternalOperation.objects.filter(unknown | stale_submitted(now, older_than) | pending_of_ended_runs())
    if system:
        operations = operations.filter(system=system)
    return operations.select_related("run").order_by("submitted_at", "pk")


def run_operations_needing_reconciliation(run: WorkflowRun) -> QuerySet[ExternalOperation]:
    """The run's operations that are not final: submitted or unknown (their effect may or may not
    have happened), and, once the run has ended, pending ones too (nobody but reconcile will
    settle them)."""
    open_states = [OperationStatus.SUBMITTED, OperationStatus.UNKNOWN]
    if run.is_terminal:
        open_states.append(OperationStatus.PENDING)
    return ExternalOperation.objects.filter(run=run, status__in=open_states).order_by("created_at", "id")


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
        "rows": [
            [op.key, op.system, op.action, op.status, op.step, op.created_at.isoformat(timespec="seconds")]
            for op in operations
        ],
    }
