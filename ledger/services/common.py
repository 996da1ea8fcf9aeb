"""What the ledger's services share: the row lock, staleness, the audit trail and redacted logging."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from ledger import hooks
from ledger.adapters import Adapter, Failed, LookupOutcome, NoEffect, NotFound, SubmitOutcome, Succeeded, Unknown
from ledger.conf import in_flight_window
from ledger.metrics import OPERATION_EVENTS
from ledger.models import FINAL, EventKind, EventOutcome, ExternalOperation, OperationEvent, OperationStatus
from ledger.redaction import redact

# One logger for the whole ledger, so an operator can route it; it only ever sees redacted data.
logger = logging.getLogger("ledger")


def log_on_commit(
    level: int, message: str, *args: Any, count: tuple[str, str, str] | None = None, **kwargs: Any
) -> None:
    """Log ``message`` (and count the event ``count``: system, kind, status) once the current
    transaction commits, at once outside one. What the ledger logs and counts is what it recorded:
    a settlement its transaction rolls back (a webhook's replay, a failed action, a raised step)
    leaves no line and no count behind. The arguments are taken now, as they are now."""

    def emit() -> None:
        logger.log(level, message, *args, **kwargs)
        if count is not None:
            OPERATION_EVENTS.labels(*count).inc()

    transaction.on_commit(emit, robust=True)


def lock(operation_id: int) -> ExternalOperation:
    """The operation, its row locked until the transaction ends. Call inside atomic().

    Every status change takes this lock first, so two workers (or a worker and the reconcile
    command, or a person in the admin) never decide from the same stale read.
    """
    return ExternalOperation.objects.select_for_update().get(pk=operation_id)


def outcome_code(outcome: SubmitOutcome | LookupOutcome) -> str:
    return {
        Succeeded: EventOutcome.SUCCEEDED,
        Failed: EventOutcome.FAILED,
        Unknown: EventOutcome.UNKNOWN,
        NoEffect: EventOutcome.NO_EFFECT,
        NotFound: EventOutcome.NOT_FOUND,
    }[type(outcome)]


def outcome_detail(outcome: SubmitOutcome | LookupOutcome) -> Any:
    """What an outcome says, as JSON (unredacted: callers redact before storing or logging)."""
    if isinstance(outcome, Succeeded):
        return {"response": outcome.response}
    if isinstance(outcome, Failed):
        return {"reason": outcome.reason, "detail": outcome.detail}
    if isinstance(outcome, Unknown | NoEffect):
        return {"reason": outcome.reason}
    return None


def safe_lookup(adapter: Adapter, op: ExternalOperation) -> LookupOutcome:
    """The adapter's lookup; a bug in it is an Unknown with the reason, never a crash of the
    reconciliation of every other operation."""
    try:
        return adapter.lookup(op)
    except Exception as exc:  # any failure to look up means "we still do not know"
        logger.exception("lookup of %s at %s raised", op.key, op.system)
        return Unknown(f"the lookup raised {type(exc).__name__}: {exc}")


def safe_lookup_many(adapter: Adapter, ops: list[ExternalOperation]) -> list[LookupOutcome]:
    """``adapter.lookup_many``; a bug in it is Unknown for each, never a crash."""
    try:
        outcomes: list[LookupOutcome] = adapter.lookup_many(ops)  # type: ignore[attr-defined]
    except Exception as exc:
        logger.exception("batch lookup of %d operations at %s raised", len(ops), ops[0].system if ops else "?")
        return [Unknown(f"the lookup raised {type(exc).__name__}: {exc}")] * len(ops)
    if len(outcomes) != len(ops):
        return [Unknown("the batch lookup answered for another number of operations")] * len(ops)
    return outcomes


def record_event(
    op: ExternalOperation,
    *,
    kind: str,
    outcome: str,
    before: str,
    detail: Any = None,
    note: str = "",
    log_note: bool = True,
) -> OperationEvent:
    """Append to the operation's audit trail (detail redacted) and log the same, redacted."""
    event = build_event(op, kind=kind, outcome=outcome, before=before, detail=detail, note=note, log_note=log_note)
    event.save()
    return event


def build_event(
    op: ExternalOperation,
    *,
    kind: str,
    outcome: str,
    before: str,
    detail: Any = None,
    note: str = "",
    log_note: bool = True,
) -> OperationEvent:
    """``record_event`` without the INSERT (the caller saves it, e.g. in a bulk_create)."""
    detail = redact(detail)
    event = OperationEvent(
        operation=op,
        kind=kind,
        outcome=outcome,
        status_before=before,
        status_after=op.status,
        detail=detail,
        note=note,
    )
    level = logging.WARNING if op.status == OperationStatus.UNKNOWN or outcome == EventOutcome.UNKNOWN else logging.INFO
    # The line says what happened, never what was sent or answered (the event keeps that, redacted).
    log_on_commit(
        level,
        "%s %s %s: %s answered %s; %s → %s%s",
        op.system,
        op.action,
        op.key,
        kind,
        outcome,
        before,
        op.status,
        f" ({note})" if note and log_note else "",
        extra={
            "event": f"operation.{op.status}" if op.status != before else f"operation.{kind}",
            "operation_key": op.key,
            "system": op.system,
            "action": op.action,
            "kind": kind,
            "outcome": outcome,
            "status": op.status,
            "status_before": before,
            "run_id": str(op.run_id) if op.run_id else None,
            "step": op.step or None,
        },
        count=(op.system, kind, op.status),
    )
    return event


LOOKUP_FIELDS = ["status", "lookup_count", "looked_up_at", "response", "error", "finished_at", "note", "updated_at"]


def may_still_arrive(op: ExternalOperation, *, now: datetime) -> bool:
    """Whether the last send of ``op`` may still reach the provider and take effect (see
    ``ledger.conf.in_flight_window``): until then a lookup's "not found" proves nothing."""
    return op.submitted_at is not None and op.submitted_at > now - in_flight_window()


def apply_lookup(
    op: ExternalOperation, outcome: LookupOutcome, *, now: datetime, run_ended: bool = False, reported_by: str = ""
) -> str:
    note, event = prepare_lookup(op, outcome, now=now, run_ended=run_ended, reported_by=reported_by)
    op.save()
    event.save()
    fire_lookup_hooks(op, event)
    return note


def fire_lookup_hooks(op: ExternalOperation, event: OperationEvent) -> None:
    """After a lookup's result (``event``, from ``prepare_lookup``) is written: settled, wake its run
    and call the hooks; found never received (pending again), wake its run to send it again."""
    if op.status in FINAL:
        hooks.fire_operation_settled(op)
    elif op.status == OperationStatus.PENDING and event.status_before != OperationStatus.PENDING:
        hooks.fire_operation_reopened(op)


def prepare_lookup(
    op: ExternalOperation,
    outcome: LookupOutcome,
    *,
    now: datetime,
    run_ended: bool = False,
    reported_by: str = "",
) -> tuple[str, OperationEvent]:
    """Record what a lookup found and return a note for people. Call inside atomic() with the row
    locked (``lock``), the operation unknown, stale submitted, or pending after a send with its run
    ended (``run_ended``).

    Found → succeeded or failed. Not found → believed only once the last send can no longer be in
    flight (``may_still_arrive``): before that it stays unknown, to be looked up again later; after
    it, pending, so that the run's next perform sends it again with the same key (the provider
    answers that from its own record if the first send does arrive after all). When the run has
    ended nobody will send it, and "not found" is not proof that no send will ever arrive (a
    provider may act on a request long after our call gave up): it stays as it is, for a person to
    decide (``operation_resolve``). The lookup could not tell → an unknown operation stays unknown;
    a stale submitted one becomes unknown, so it shows among those that need attention.

    ``reported_by``: the provider told us on its own (a signed webhook, ``operation_report``)
    rather than answering our lookup; recorded the same way, the note naming who reported it.
    """
    before = op.status
    if not reported_by:
        op.lookup_count += 1
        op.looked_up_at = now
    if isinstance(outcome, Succeeded):
        op.reconcile_succeeded()
        op.response, op.error, op.finished_at = outcome.response, None, now
        note = "the provider has it as succeeded"
    elif isinstance(outcome, Failed):
        op.reconcile_failed()
        op.error, op.finished_at = {"reason": outcome.reason, "detail": outcome.detail}, now
        note = f"the provider has it as failed: {outcome.reason}"
    elif isinstance(outcome, NotFound) and may_still_arrive(op, now=now):
        if op.status == OperationStatus.SUBMITTED:
            op.lose_track()
        assert op.submitted_at is not None  # may_still_arrive says so
        sent, trusted = op.submitted_at, op.submitted_at + in_flight_window()
        note = (
            f"not found yet, but it may still reach the provider (sent {sent.isoformat(timespec='seconds')}; "
            f'"not found" is believed from {trusted.isoformat(timespec="seconds")})'
        )
    elif isinstance(outcome, NotFound) and run_ended:
        if op.status == OperationStatus.SUBMITTED:
            op.lose_track()
        note = (
            "the provider has no record of it, but it was sent and its run has ended, so nobody will send "
            "it again: a person decides (mark it failed once sure it can never arrive)"
        )
    elif isinstance(outcome, NotFound):
        op.reconcile_not_found()
        note = "the provider never received it, so it never took effect: safe to send again"
    else:
        if op.status == OperationStatus.SUBMITTED:
            op.lose_track()
        note = f"the lookup could not tell: {outcome.reason}"
    # (A pending operation whose lookup finds nothing stays pending: sent before, its run ended.)
    if reported_by:
        note = f"{note} (reported by {reported_by})"
    op.note = note
    op.updated_at = now  # set here too for bulk_update, which skips auto_now
    event = build_event(
        op,
        kind=EventKind.LOOKUP,
        outcome=outcome_code(outcome),
        before=before,
        detail=outcome_detail(outcome),
        note=note,
    )
    return note, event


def abandon(op: ExternalOperation, *, now: datetime, why: str) -> str:
    """Fail a pending operation that was never sent and that nobody will send: the key is spent,
    and a new attempt is a new request with a new key. Call inside atomic() with the row locked,
    having checked ``submit_count == 0`` on it; saves it, records the event and runs the settled
    hooks. Returns the note."""
    assert op.submit_count == 0, "an operation sent before is never abandoned: a person decides"
    op.abandon()
    op.error, op.finished_at = {"reason": "abandoned", "detail": why}, now
    op.note = f"abandoned: {why}"
    op.save()
    record_event(op, kind=EventKind.ABANDON, outcome=EventOutcome.FAILED, before=OperationStatus.PENDING, note=op.note)
    hooks.fire_operation_settled(op)
    return op.note


def ago(when: datetime | None, *, now: datetime | None = None) -> str:
    if when is None:
        return "at an unknown time"
    seconds = int(((now or timezone.now()) - when).total_seconds())
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60}m ago"
    if seconds < 172800:
        return f"{seconds // 3600}h ago"
    return f"{seconds // 86400}d ago"
