"""Resolving operations whose outcome is not known: by asking the provider (``operation_reconcile``,
``operations_reconcile``: the reconcile command and the admin's "reconcile now"), or by a person
with a note (``operation_resolve``: the admin's manual resolution).

Reconciliation never submits: a key the provider never saw goes back to ``pending``, and the
next ``perform`` (the workflow's retry) sends it again with the same key. "Not found" is believed
only once the last send can no longer be in flight (``ledger.conf.in_flight_window``), and never
settles anything on its own once the run has ended: a provider may act on a request long after
our call gave up, so an operation sent even once and left by its run stays in reconcile's work
(looked up each time, found → settled) and needs a person to fail it. Only a pending operation
never sent is failed as abandoned when its run ends. Lookups run outside any transaction; what they found
is recorded with the row locked, and only if nobody moved the operation in between.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from django.db import connection, transaction
from django.utils import timezone

from ledger import hooks
from ledger.adapters import (
    Failed,
    LookupOutcome,
    NotFound,
    Succeeded,
    contradiction,
    get_adapter,
    has_adapter,
    has_lookup_many,
    record_of,
)
from ledger.conf import conf
from ledger.exceptions import ResolutionRefused
from ledger.models import (
    FINAL,
    RECONCILABLE,
    EventKind,
    EventOutcome,
    ExternalOperation,
    OperationEvent,
    OperationStatus,
)
from ledger.selectors import (
    can_resolve_operations,
    failed_by_hand_to_recheck,
    in_doubt,
    is_stale,
    operations_to_reconcile,
    resolvable_by_hand,
    run_ended,
    sent_and_orphaned,
)
from ledger.services.common import (
    LOOKUP_FIELDS,
    abandon,
    ago,
    apply_lookup,
    fire_lookup_hooks,
    lock,
    log_on_commit,
    logger,
    may_still_arrive,
    outcome_detail,
    prepare_lookup,
    record_event,
    safe_lookup,
    safe_lookup_many,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractUser, AnonymousUser

# resolved: the outcome is now known. flagged: it still needs a person. skipped: nothing to do
# yet (already final, or a submit that may still be in flight).
Verdict = Literal["resolved", "flagged", "skipped"]


@dataclass(frozen=True)
class ReconcileResult:
    operation_id: int
    key: str
    system: str
    before: str
    after: str
    verdict: Verdict
    note: str
    dry_run: bool = False


def operations_reconcile(
    *, system: str | None = None, older_than: timedelta | None = None, dry_run: bool = False
) -> list[ReconcileResult]:
    """Reconcile every unknown operation and every stale submitted one (see
    ``selectors.operations_to_reconcile``), oldest submit first; one result per operation.

    One operation's failure (a provider down, an adapter bug) is its own flagged row, never the
    end of the others'.
    """
    results: list[ReconcileResult] = []
    operations = list(operations_to_reconcile(system=system, older_than=older_than))
    batched = [] if dry_run else [op for op in operations if _looked_up_in_batch(op, older_than)]
    in_batch = {op.pk for op in batched}
    for op in operations:  # the rest (dry runs, systems that cannot look up, ...) one by one
        if op.pk not in in_batch:
            results.append(_reconcile_guarded(op.pk, older_than, dry_run))
    results += _reconcile_batch(batched)
    for op in failed_by_hand_to_recheck(system=system):
        if (corrected := _recheck_failed_by_hand(op, dry_run=dry_run)) is not None:
            results.append(corrected)
    return results


def _recheck_failed_by_hand(op: ExternalOperation, *, dry_run: bool) -> ReconcileResult | None:
    """Ask the provider about an operation a person marked failed after it was sent. If the provider
    acted on it after all, the ledger says so: succeeded, with a note for people, the settled hooks
    run (a refund's order is marked) and the row is flagged. Anything else changes nothing and is
    not reported (the person's answer stands until the recheck period ends)."""
    if not has_adapter(op.system) or not get_adapter(op.system).can_lookup:
        return None
    outcome = safe_lookup(get_adapter(op.system), op)  # outside any transaction: a network call
    if not isinstance(outcome, Succeeded):
        return None
    when = op.resolved_at.isoformat(timespec="seconds") if op.resolved_at else "?"
    note = (
        f"marked failed by hand ({when}), but the provider has it as succeeded: corrected; check what "
        "was done on the strength of the failure (a second request paid?)"
    )
    if dry_run:
        return _result(op, OperationStatus.SUCCEEDED, "flagged", f"would be {note}", dry_run=True)
    with transaction.atomic():
        current = lock(op.pk)
        if current.status != OperationStatus.FAILED:
            return None
        return _correct_failed(current, outcome, note)


def _correct_failed(
    current: ExternalOperation, outcome: Succeeded, note: str, *, kind: str = EventKind.LOOKUP
) -> ReconcileResult:
    """The provider has as succeeded what we recorded as failed: it is the truth about the money.
    Succeeded, with ``note`` for people, an event, the settled hooks (a refund's order is marked, so
    its amount counts again) and an error logged; the result is flagged. Call inside atomic() with
    the row locked and the operation failed."""
    current.contradict()
    current.response, current.finished_at, current.note = outcome.response, timezone.now(), note
    current.save()
    record_event(
        current,
        kind=kind,
        outcome=EventOutcome.SUCCEEDED,
        before=OperationStatus.FAILED,
        detail=outcome_detail(outcome),
        note=note,
    )
    hooks.fire_operation_settled(current)
    log_on_commit(logging.ERROR, "%s %s %s: %s", current.system, current.action, current.key, note)
    return _result(current, current.status, "flagged", note, before=OperationStatus.FAILED)


def _reconcile_guarded(operation_id: int, older_than: timedelta | None, dry_run: bool) -> ReconcileResult:
    try:
        return operation_reconcile(operation_id=operation_id, min_age=older_than, dry_run=dry_run)
    except Exception as exc:
        logger.exception("reconcile of operation %s raised", operation_id)
        op = ExternalOperation.objects.get(pk=operation_id)
        return _result(op, op.status, "flagged", f"reconciling raised {type(exc).__name__}: {exc}", dry_run=dry_run)


def _looked_up_in_batch(op: ExternalOperation, older_than: timedelta | None) -> bool:
    """Due for a lookup now, at a system whose adapter can look up (the common case)."""
    return in_doubt(op, age=older_than) and has_adapter(op.system) and get_adapter(op.system).can_lookup


BATCH = 200


def _reconcile_batch(operations: list[ExternalOperation]) -> list[ReconcileResult]:
    """Many operations at once: the lookups concurrently (outside any transaction, changing
    nothing), then what they found recorded a batch per transaction, each row locked and only if
    nobody moved the operation in between (as ``operation_reconcile`` does for one)."""
    if not operations:
        return []
    workers = max(1, min(conf()["RECONCILE_CONCURRENCY"], len(operations)))
    results: list[ReconcileResult] = []
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ledger-lookup") as pool:
        # The lookups of the next batch run while this thread records the previous one.
        pending = [_lookups(pool, operations[i : i + BATCH]) for i in range(0, len(operations), BATCH)]
        for start, outcomes in zip(range(0, len(operations), BATCH), pending):
            results += _record_batch(list(zip(operations[start : start + BATCH], outcomes)))
    return results


def _lookups(pool: ThreadPoolExecutor, batch: list[ExternalOperation]) -> Iterator[LookupOutcome]:
    """The batch's outcomes in order: one request per system whose adapter can look many keys up
    at once, else one lookup per operation, all in the pool."""
    systems = {op.system for op in batch}
    if len(systems) == 1 and has_lookup_many(adapter := get_adapter(next(iter(systems)))):
        return _when_done(pool.submit(safe_lookup_many, adapter, batch))
    return pool.map(lambda op: safe_lookup(get_adapter(op.system), op), batch)


def _when_done(future: Future[list[LookupOutcome]]) -> Iterator[LookupOutcome]:
    """Waits for the batch only when its outcomes are needed, so later batches are in flight."""
    yield from future.result()


def _record_batch(pairs: list[tuple[ExternalOperation, LookupOutcome]]) -> list[ReconcileResult]:
    """One transaction: the rows locked in id order (like any multi-row lock here, so a second
    reconcile cannot deadlock with this one), each updated only if nobody moved it since it was
    read, then written with one UPDATE and one INSERT for the whole batch."""
    now = timezone.now()
    results: list[ReconcileResult] = []
    changed: list[ExternalOperation] = []
    events = []
    with transaction.atomic():
        current = {
            op.pk: op
            for op in ExternalOperation.objects.select_for_update()
            .filter(pk__in=[op.pk for op, _ in pairs])
            .order_by("pk")
        }
        for seen, outcome in pairs:
            op = current[seen.pk]
            if (op.status, op.submit_count) != (seen.status, seen.submit_count):
                results.append(
                    _result(
                        op,
                        op.status,
                        "skipped",
                        f"changed while it was looked up (it was {seen.status}); left as it is",
                        before=seen.status,
                    )
                )
                continue
            note, event = prepare_lookup(op, outcome, now=now, run_ended=run_ended(seen))
            changed.append(op)
            events.append(event)
            results.append(_result(op, op.status, _verdict(op, outcome), note, before=seen.status))
        _save_lookups(changed)
        OperationEvent.objects.bulk_create(events)
        for op, event in zip(changed, events, strict=True):
            fire_lookup_hooks(op, event)
    return results


def _save_lookups(operations: list[ExternalOperation]) -> None:
    """Write what prepare_lookup changed. On PostgreSQL one UPDATE ... FROM (VALUES ...) for the
    whole batch (Django's bulk_update builds a CASE per field per row, which cost more than the
    lookups); elsewhere bulk_update. Call inside atomic() with the rows locked."""
    if not operations:
        return
    if connection.vendor != "postgresql":
        ExternalOperation.objects.bulk_update(operations, LOOKUP_FIELDS)
        return
    table = ExternalOperation._meta.db_table
    row = "(%s::bigint, %s, %s::integer, %s::timestamptz, %s::jsonb, %s::jsonb, %s::timestamptz, %s, %s::timestamptz)"
    params: list[Any] = []
    for op in operations:
        params += [
            op.pk,
            op.status,
            op.lookup_count,
            op.looked_up_at,
            json.dumps(op.response) if op.response is not None else None,
            json.dumps(op.error) if op.error is not None else None,
            op.finished_at,
            op.note,
            op.updated_at,
        ]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE {table} AS o SET status = v.status, lookup_count = v.lookup_count,
                    looked_up_at = v.looked_up_at, response = v.response, error = v.error,
                    finished_at = v.finished_at, note = v.note, updated_at = v.updated_at
                FROM (VALUES {", ".join([row] * len(operations))})
                    AS v(id, status, lookup_count, looked_up_at, response, error, finished_at, note, updated_at)
                WHERE o.id = v.id""",
            params,
        )


def _record_lookup(seen: ExternalOperation, current: ExternalOperation, outcome: LookupOutcome) -> ReconcileResult:
    """Call inside atomic() with ``current`` locked."""
    if (current.status, current.submit_count) != (seen.status, seen.submit_count):
        return _result(
            current,
            current.status,
            "skipped",
            f"changed while it was looked up (it was {seen.status}); left as it is",
            before=seen.status,
        )
    note = apply_lookup(current, outcome, now=timezone.now(), run_ended=run_ended(seen))
    return _result(current, current.status, _verdict(current, outcome), note, before=seen.status)


def _verdict(op: ExternalOperation, outcome: LookupOutcome) -> Verdict:
    """After a lookup: settled, or sent back to pending for its live run, is resolved. Otherwise it
    needs a person, unless the provider said "not found" while the request may still be in flight
    (then it only needs time: the next reconcile looks again)."""
    if op.status in FINAL or (op.status == OperationStatus.PENDING and not run_ended(op)):
        return "resolved"
    if isinstance(outcome, NotFound) and may_still_arrive(op, now=timezone.now()):
        return "skipped"
    return "flagged"


def operation_reconcile(
    *, operation_id: int, min_age: timedelta | None = None, dry_run: bool = False
) -> ReconcileResult:
    """Look one operation up and record what the provider says, if it is unknown or a submit
    older than ``min_age`` (default LEDGER STALE_SUBMITTED_SECONDS). ``dry_run`` looks up (a read
    at the provider) but changes nothing here, and says what it would have done."""
    op = ExternalOperation.objects.select_related("run").get(pk=operation_id)
    now = timezone.now()
    if op.status == OperationStatus.PENDING and run_ended(op) and op.submit_count == 0:
        return _abandon_pending(op, dry_run=dry_run)
    if op.status not in RECONCILABLE and not sent_and_orphaned(op):
        return _result(op, op.status, "skipped", f"nothing to reconcile: it is {op.status}", dry_run=dry_run)
    if op.status == OperationStatus.SUBMITTED and not is_stale(op, now=now, age=min_age):
        return _result(
            op,
            op.status,
            "skipped",
            f"sent {ago(op.submitted_at, now=now)}; may still be in flight, not checked",
            dry_run=dry_run,
        )
    if not has_adapter(op.system):
        return _result(op, op.status, "flagged", f"no adapter for {op.system!r} in this process", dry_run=dry_run)
    adapter = get_adapter(op.system)
    if not adapter.can_lookup:
        return _cannot_look_up(op, dry_run=dry_run)
    outcome = safe_lookup(adapter, op)  # outside any transaction: a network call
    if dry_run:
        after, would, note = _would_be(op, outcome)
        return _result(op, after, would, note, dry_run=True, before=op.status)
    with transaction.atomic():
        return _record_lookup(op, lock(op.pk), outcome)


def operation_report(*, key: str, system: str, outcome: Succeeded | Failed, reported_by: str) -> ReconcileResult | None:
    """An outcome the provider reported on its own (a signed webhook), recorded as a lookup that
    found it would be: the same transitions, event, note and settled hooks as ``reconcile``.

    Call inside atomic(): the caller's transaction records the report too, so both commit or
    neither. Locks the operation's row as every status change does, so a report racing a reconcile
    (or a perform, or a person) gives one outcome: whichever locks second finds it settled, or
    moved, and changes nothing. Settles an unknown or submitted operation at once (a submit still
    in flight then finds it settled and keeps its own answer beside it, see ``_record_submit``), and
    a pending one that was sent before. Leaves a settled one as it is (a provider resends its
    webhooks) and a pending one never sent (nothing can have happened to it), except a failed one
    that was sent and is now reported succeeded: the provider acted after all, so it is corrected to
    succeeded and flagged (``_correct_failed``), as reconcile's recheck of a hand-failed one is. None:
    no operation has this key at this system.
    """
    op = ExternalOperation.objects.select_for_update().filter(key=key, system=system).first()
    if op is None:
        return None
    before = op.status
    if (problem := contradiction(op, record_of(outcome))) is not None:
        # Another operation's record under our key (an installation sharing the provider account,
        # ids reused after a restore): never our outcome. Left as it is, and said.
        note = f"a report by {reported_by} does not match this operation ({problem}): changes nothing"
        logger.warning("operation %s: %s", op.key, note, extra={"event": "operation.report_mismatch", "key": op.key})
        return _result(op, op.status, "skipped", note)
    if op.status == OperationStatus.FAILED and isinstance(outcome, Succeeded) and op.submit_count:
        # A failure we recorded (an earlier report, a lookup, a person) that the provider now
        # contradicts: it did take effect. Believed, and flagged: something may have been done on
        # the strength of the failure (a second refund asked for and paid).
        note = (
            f"recorded as failed ({op.note or 'no note'}), but the provider now reports it succeeded "
            f"(reported by {reported_by}): corrected; check what was done on the strength of the failure "
            "(a second request paid?)"
        )
        return _correct_failed(op, outcome, note)
    if op.status in FINAL:
        return _result(op, op.status, "skipped", f"already {op.status}: the report changes nothing")
    if op.status == OperationStatus.PENDING and op.submit_count == 0:
        return _result(op, op.status, "skipped", "never sent: a report of its outcome is not believed")
    note = apply_lookup(op, outcome, now=timezone.now(), run_ended=run_ended(op), reported_by=reported_by)
    return _result(op, op.status, "resolved", note, before=before)


def _abandon_pending(op: ExternalOperation, *, dry_run: bool) -> ReconcileResult:
    """A pending operation never sent, whose run has ended: nobody will send it. Failed as
    abandoned, so it no longer waits for anyone and whatever it held (a refund's amount) is
    released. Re-checked under the row lock: a restarted run that claimed it in between keeps it."""
    why = "it was never sent and the run that would send it has ended"
    if dry_run:
        return _result(op, OperationStatus.FAILED, "resolved", f"would be abandoned: {why}", dry_run=True)
    with transaction.atomic():
        current = lock(op.pk)
        if current.status != OperationStatus.PENDING or current.submit_count != 0:
            return _result(
                current,
                current.status,
                "skipped",
                "changed since it was read (it was pending)",
                before=OperationStatus.PENDING,
            )
        note = abandon(current, now=timezone.now(), why=why)
    return _result(current, current.status, "resolved", note, before=OperationStatus.PENDING)


def operations_abandon_for_run(run_id: Any) -> int:
    """Abandon the run's pending operations that were never sent (see ``_abandon_pending``);
    returns how many.

    The engine's terminate hook calls it inside ``run_terminate``'s transaction, the run row
    locked: a step body still in flight that has not claimed its operation yet then finds it failed
    (``perform`` locks the row too) and sends nothing, and the amount it held is free at once.
    """
    abandoned = 0
    why = "its run was terminated before it was sent"
    now = timezone.now()
    # Only those never sent: one sent before may still take effect, and stays for reconcile.
    for op in (
        ExternalOperation.objects.select_for_update()
        .filter(run_id=run_id, status=OperationStatus.PENDING, submit_count=0)
        .order_by("pk")
    ):
        abandon(op, now=now, why=why)
        abandoned += 1
    return abandoned


def _cannot_look_up(op: ExternalOperation, *, dry_run: bool) -> ReconcileResult:
    """A system that cannot say what happened: a stale submit becomes unknown (so the admin lists
    it among those needing attention); either way a person has to resolve it."""
    note = f"{op.system} cannot look operations up: resolve it by hand in the admin"
    before = op.status
    if op.status == OperationStatus.SUBMITTED and not dry_run:
        with transaction.atomic():
            current = lock(op.pk)
            if current.status == OperationStatus.SUBMITTED and current.submit_count == op.submit_count:
                current.lose_track()
                current.note = note
                current.save()
                record_event(current, kind=EventKind.LOOKUP, outcome=EventOutcome.UNKNOWN, before=before, note=note)
            op = current
    after = OperationStatus.UNKNOWN if dry_run else op.status
    return _result(op, after, "flagged", note, dry_run=dry_run, before=before)


def _would_be(op: ExternalOperation, outcome: LookupOutcome) -> tuple[str, Verdict, str]:
    if isinstance(outcome, Succeeded):
        return OperationStatus.SUCCEEDED, "resolved", "the provider has it as succeeded"
    if isinstance(outcome, Failed):
        return OperationStatus.FAILED, "resolved", f"the provider has it as failed: {outcome.reason}"
    if isinstance(outcome, NotFound) and may_still_arrive(op, now=timezone.now()):
        return OperationStatus.UNKNOWN, "skipped", "not found yet, but the last send may still reach the provider"
    if isinstance(outcome, NotFound) and run_ended(op):
        return op.status, "flagged", "the provider has no record of it; its run has ended: a person decides"
    if isinstance(outcome, NotFound):
        return OperationStatus.PENDING, "resolved", "the provider never received it: safe to send again"
    return OperationStatus.UNKNOWN, "flagged", f"the lookup could not tell: {outcome.reason}"


def _result(
    op: ExternalOperation, after: str, verdict: Verdict, note: str, *, dry_run: bool = False, before: str | None = None
) -> ReconcileResult:
    return ReconcileResult(
        operation_id=op.pk,
        key=op.key,
        system=op.system,
        before=before or op.status,
        after=after,
        verdict=verdict,
        note=note,
        dry_run=dry_run,
    )


# --- by hand ------------------------------------------------------------------------------------
def operation_resolve(
    *,
    operation_id: int,
    outcome: Literal["succeeded", "failed"],
    note: str,
    user: AbstractUser | AnonymousUser,
    now: datetime | None = None,
) -> ExternalOperation:
    """A person's resolution of an unknown operation, a stale submitted one, or a pending one sent
    before whose run has ended, after checking with the provider some other way. Requires the
    ``ledger.resolve_externaloperation`` permission and a note saying how they know; records who
    and when. Refusals (ResolutionRefused) change nothing.
    """
    note = (note or "").strip()
    if not note:
        raise ResolutionRefused("a note is required: say how you know the outcome")
    if not can_resolve_operations(user):
        raise ResolutionRefused("you may not resolve external operations")
    if outcome not in ("succeeded", "failed"):
        raise ResolutionRefused(f"the outcome must be succeeded or failed, not {outcome!r}")
    now = now or timezone.now()
    username = user.get_username()
    with transaction.atomic():
        op = lock(operation_id)
        before = op.status
        if not resolvable_by_hand(op, now=now):
            raise ResolutionRefused(
                "only unknown operations (or submits gone stale, or pending ones sent before whose run has "
                f"ended) are resolved by hand; this one is {before}",
                status=before,
            )
        # What perform() returns to the run from now on (and a run's owner may read in its step
        # results): the fact, never the note, which is a person's free text for the audit only
        # (resolution_note and the event).
        if outcome == "succeeded":
            op.reconcile_succeeded()
            op.response = {"status": "succeeded", "resolved_by_hand": True}
        else:
            op.reconcile_failed()
            op.error = {"reason": "resolved_by_hand", "detail": None}
        op.resolved_by_id = user.pk
        op.resolved_at = op.finished_at = now
        op.resolution_note = note
        op.note = f"resolved by hand as {outcome} by {username}"
        op.save()
        # The note is free text a person typed: stored for the audit, not logged (no key to redact by).
        record_event(
            op, kind=EventKind.RESOLVE, outcome=outcome, before=before, note=f"{username}: {note}", log_note=False
        )
        hooks.fire_operation_settled(op)
    return op
