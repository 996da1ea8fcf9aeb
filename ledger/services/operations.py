"""``operation_perform`` (``ledger.perform``): one external side effect per key, at most once.

The shape of every perform, and why:

1. In one transaction: insert the key if new, lock its row, refuse a reused key with another
   request, and decide from the stored state. Succeeded answers from storage; failed raises; a
   fresh submitted (another worker is calling right now) raises ``OperationInProgress``; pending
   is claimed (→ submitted) and **committed** before anything is sent, so a crash mid-call leaves
   a record that the call may have happened.
2. Unknown, or submitted by a worker that died mid-call (stale): look the key up at the provider
   first, outside any transaction. Found → resolved from the provider's answer. Not found → it
   never took effect: claimed and sent again. The lookup could not tell → still unknown.
3. The call itself runs outside any transaction (a lock held across a slow provider would stall
   every other worker on that key, and a transaction open across the call could not have
   committed step 1). Its outcome is recorded in a second transaction, with the row locked again.

Exceptions are raised only after the transaction that recorded the reason has committed: each
step returns a plan (answer, send, look up, or refuse with an error) and the caller acts on it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from ledger import hooks
from ledger.adapters import Adapter, Failed, NoEffect, SubmitOutcome, Succeeded, Unknown, get_adapter
from ledger.exceptions import (
    IdempotencyConflict,
    InvalidOperation,
    LedgerError,
    OperationFailed,
    OperationInProgress,
    OutcomeUnknown,
    PerformInTransaction,
    ProviderUnavailable,
)
from ledger.models import FINAL, EventKind, EventOutcome, ExternalOperation, OperationStatus
from ledger.selectors import is_stale
from ledger.services.common import (
    ago,
    apply_lookup,
    lock,
    log_on_commit,
    logger,
    outcome_code,
    outcome_detail,
    record_event,
    safe_lookup,
)
from workflows.context import current_step
from workflows.exceptions import InvalidPayload
from workflows.services import check_payload


@dataclass(frozen=True)
class Answer:
    response: Any


@dataclass(frozen=True)
class Send:
    op: ExternalOperation  # claimed: submitted, committed, ours to send


@dataclass(frozen=True)
class LookUp:
    op: ExternalOperation  # unknown or stale submitted: ask the provider before anything else


@dataclass(frozen=True)
class Refuse:
    error: LedgerError  # raised once the transaction that recorded why has committed


Plan = Answer | Send | LookUp | Refuse


def operation_perform(*, key: str, system: str, action: str, request: dict[str, Any]) -> Any:
    """Do ``action`` at ``system`` once for ``key``; return the provider's response (JSON).

    Preconditions: call outside any transaction (it commits before calling out), with an adapter
    registered for ``system``. Raises IdempotencyConflict (key reused with another system, action
    or request; nothing changed), OperationFailed (definitively rejected; the key is spent),
    OutcomeUnknown (it may or may not have happened; the next perform looks it up first),
    OperationInProgress (another worker is sending it now) or ProviderUnavailable (nothing
    happened; retrying is safe).
    """
    if connection.in_atomic_block:
        raise PerformInTransaction(
            "perform() must run outside transaction.atomic(): it commits the 'submitted' state before "
            "calling out (in a workflow, do not use step.do(..., atomic=True) for it)"
        )
    check_operation(key=key, system=system, action=action, request=request)
    adapter = get_adapter(system)  # before any write: an unknown system stores nothing
    plan = _open(key=key, system=system, action=action, request=request, can_lookup=adapter.can_lookup)
    if isinstance(plan, LookUp):
        plan = _look_up_first(plan.op, adapter)
    if isinstance(plan, Send):
        plan = _send(plan.op, adapter)
    if isinstance(plan, Refuse):
        raise plan.error
    assert isinstance(plan, Answer), plan
    return plan.response


def check_operation(*, key: str, system: str, action: str, request: Any) -> None:
    """Valid input or InvalidOperation, before anything is stored."""
    for what, value, limit in (("key", key, 255), ("system", system, 100), ("action", action, 100)):
        if not isinstance(value, str) or not value.strip():
            raise InvalidOperation(f"{what} must be a non-empty string")
        if len(value) > limit:
            raise InvalidOperation(f"{what} is {len(value)} characters; the limit is {limit}")
    try:
        check_payload(request, what="request")
    except InvalidPayload as exc:
        raise InvalidOperation(str(exc)) from None


def request_fingerprint(*, system: str, action: str, request: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of what the key stands for: key order does not matter."""
    text = json.dumps([system, action, request], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


# --- 1. open: insert or lock, compare, decide ---------------------------------------------------
def operation_prepare(*, key: str, system: str, action: str, request: dict[str, Any]) -> ExternalOperation:
    """Record ``action`` at ``system`` for ``key`` as ``pending`` without sending it: the operation
    exists from the caller's commit on, and ``perform`` with the same arguments later sends it.

    Call inside the caller's transaction, next to the checks that decide the effect may happen (a
    refund checks the order's balance with the order row locked): the intent and the decision then
    commit together, so whatever counts operations sees this one from that commit on. Returns the
    operation (an existing one as it is); IdempotencyConflict for the key with another request.
    """
    check_operation(key=key, system=system, action=action, request=request)
    with transaction.atomic():  # a savepoint inside the caller's transaction
        op = _insert_and_lock(key=key, system=system, action=action, request=request)
    if op.request_hash != request_fingerprint(system=system, action=action, request=request):
        raise _conflict(op)
    return op


def _insert_and_lock(*, key: str, system: str, action: str, request: dict[str, Any]) -> ExternalOperation:
    """The key's operation, inserted if new, its row locked. Call inside atomic()."""
    context = current_step()  # called from a step body: remember which run and step
    # INSERT ... ON CONFLICT DO NOTHING: when another perform inserted this key and has not
    # committed yet, PostgreSQL makes this insert wait for it, then do nothing; the locking read
    # below then sees that row (already claimed), never a second one.
    ExternalOperation.objects.bulk_create(
        [
            ExternalOperation(
                key=key,
                system=system,
                action=action,
                request=request,
                request_hash=request_fingerprint(system=system, action=action, request=request),
                run_id=context.run_id if context else None,
                step=context.step if context else "",
            )
        ],
        ignore_conflicts=True,
    )
    return ExternalOperation.objects.select_for_update().get(key=key)


def _conflict(op: ExternalOperation) -> IdempotencyConflict:
    return IdempotencyConflict(
        f"operation key {op.key!r} was used for {op.system} {op.action} with another request; "
        "nothing was changed or sent"
    )


def _open(*, key: str, system: str, action: str, request: dict[str, Any], can_lookup: bool) -> Plan:
    with transaction.atomic():
        op = _insert_and_lock(key=key, system=system, action=action, request=request)
        if op.request_hash != request_fingerprint(system=system, action=action, request=request):
            return Refuse(_conflict(op))
        return _decide(op, can_lookup=can_lookup)


def _decide(op: ExternalOperation, *, can_lookup: bool) -> Plan:
    """From the stored state, with the row locked."""
    now = timezone.now()
    if op.status == OperationStatus.SUCCEEDED:
        return Answer(op.response)
    if op.status == OperationStatus.FAILED:
        return Refuse(_failed(op))
    if op.status == OperationStatus.PENDING:
        return Send(_claim(op, now=now))
    if op.status == OperationStatus.SUBMITTED and not is_stale(op, now=now):
        return Refuse(_in_progress(op, now=now))
    # Unknown, or submitted by a worker that died before recording the answer.
    if can_lookup:
        return LookUp(op)
    if op.status == OperationStatus.SUBMITTED:
        before = op.status
        op.lose_track()
        op.note = "its worker stopped before recording an answer, and the system cannot look it up"
        op.save()
        record_event(op, kind=EventKind.LOOKUP, outcome=EventOutcome.UNKNOWN, before=before, note=op.note)
    return Refuse(
        OutcomeUnknown(
            f"the outcome of {op.action} {op.key!r} at {op.system} is unknown and {op.system} cannot look "
            "operations up: a person must resolve it (admin, External operations)",
            key=op.key,
            reason=op.note,
        )
    )


def _claim(op: ExternalOperation, *, now: datetime) -> ExternalOperation:
    """pending → submitted, with the row locked; the caller's commit makes the claim visible."""
    op.submit()
    op.submit_count += 1
    op.submitted_at = now
    op.note = ""
    op.save()
    log_on_commit(logging.INFO, "%s %s %s: claimed for submit #%d", op.system, op.action, op.key, op.submit_count)
    return op


# --- 2. look up before sending again ------------------------------------------------------------
def _look_up_first(op: ExternalOperation, adapter: Adapter) -> Plan:
    outcome = safe_lookup(adapter, op)  # outside any transaction: a network call
    with transaction.atomic():
        current = lock(op.pk)
        if (current.status, current.submit_count) != (op.status, op.submit_count):
            # Another worker, the reconcile command or a person moved it while we asked: theirs
            # stands. Pending means nothing took effect (and we hold the lock): ours to send.
            if current.status == OperationStatus.PENDING:
                return Send(_claim(current, now=timezone.now()))
            return _settled(current)
        apply_lookup(current, outcome, now=timezone.now())
        if current.status == OperationStatus.PENDING:
            return Send(_claim(current, now=timezone.now()))  # not found: never happened, send it
        return _settled(current)


def _settled(op: ExternalOperation) -> Plan:
    """What to tell the caller about an operation someone else just moved (row locked)."""
    if op.status == OperationStatus.SUCCEEDED:
        return Answer(op.response)
    if op.status == OperationStatus.FAILED:
        return Refuse(_failed(op))
    if op.status == OperationStatus.SUBMITTED:
        return Refuse(_in_progress(op, now=timezone.now()))
    if op.status == OperationStatus.PENDING:
        # Only after a late answer: a lookup said "never received" while our submit was in
        # flight. No call out from here; the caller retries, and the next perform sends with the
        # same idempotency key, which the provider answers from its own record.
        return Refuse(
            OutcomeUnknown(
                f"{op.system}'s answers about {op.key!r} disagree (see its events); try again",
                key=op.key,
                reason="answers disagree",
            )
        )
    return Refuse(_unknown(op))


# --- 3. send, then record the outcome -----------------------------------------------------------
def _send(op: ExternalOperation, adapter: Adapter) -> Plan:
    """Call the provider (no transaction open: the claim is committed) and record what it said."""
    try:
        outcome = adapter.submit(op)
    except BaseException as exc:
        # An adapter bug, a step timeout (SIGALRM) or a shutdown mid-call: the request may have
        # gone out. Record unknown, so the next attempt looks it up instead of sending blind.
        try:
            _record_submit(op, Unknown(f"the call was interrupted: {type(exc).__name__}: {exc}"))
        except Exception:
            logger.exception("%s: could not record an interrupted submit; it stays submitted", op.key)
        raise
    return _record_submit(op, outcome)


def _record_submit(op: ExternalOperation, outcome: SubmitOutcome) -> Plan:
    with transaction.atomic():
        current = lock(op.pk)
        before = current.status
        if before == OperationStatus.FAILED and isinstance(outcome, Succeeded):
            # Recorded failed meanwhile (a webhook, a lookup, a person), and now the provider's own
            # answer to our submit says it did it: the truth about the money. Corrected and
            # flagged, as a report of success after a failure is (operation_report): its amount
            # counts again, and whatever was done on the strength of the failure is for a person.
            from ledger.services.reconciliation import _correct_failed  # it imports from here

            note = (
                f"recorded as failed ({current.note or 'no note'}), but the submit's own answer, arriving "
                "after, says it succeeded: corrected; check what was done on the strength of the failure"
            )
            _correct_failed(current, outcome, note, kind=EventKind.SUBMIT)
            return _settled(current)
        if before != OperationStatus.SUBMITTED or current.submit_count != op.submit_count:
            # Settled while the provider answered: its webhook often comes before its answer to
            # the submit, and a reconcile or a person may act once the submit has gone stale. That
            # record stands; this answer is kept beside it. An answer that says the same, or
            # nothing (unknown), is the ordinary race; one that contradicts it is for a person.
            said = outcome_code(outcome)
            agrees = isinstance(outcome, Unknown) or said == before
            note = f"the submit's answer ({said}) arrived after the operation was already {before}"
            record_event(
                current,
                kind=EventKind.SUBMIT,
                outcome=said,
                before=before,
                detail=outcome_detail(outcome),
                note=note,
            )
            if not agrees:  # (the event's own line says the rest)
                log_on_commit(logging.ERROR, "%s %s: %s; compare the events", current.system, current.key, note)
            return _settled(current)
        plan = _apply_submit(current, outcome, now=timezone.now())
        record_event(
            current,
            kind=EventKind.SUBMIT,
            outcome=outcome_code(outcome),
            before=before,
            detail=outcome_detail(outcome),
            note=current.note,
        )
        if current.status in FINAL:
            hooks.fire_operation_settled(current)
        return plan


def _apply_submit(op: ExternalOperation, outcome: SubmitOutcome, *, now: datetime) -> Plan:
    if isinstance(outcome, Succeeded):
        op.succeed()
        op.response, op.finished_at = outcome.response, now
        op.save()
        return Answer(op.response)
    if isinstance(outcome, Failed):
        op.fail()
        op.error, op.finished_at = {"reason": outcome.reason, "detail": outcome.detail}, now
        op.note = f"rejected: {outcome.reason}"
        op.save()
        return Refuse(_failed(op))
    if isinstance(outcome, NoEffect):
        op.release()
        op.note = f"not acted on: {outcome.reason}"
        op.save()
        return Refuse(
            ProviderUnavailable(
                f"{op.system} did not act on {op.action} {op.key!r} ({outcome.reason}); nothing happened, "
                "retrying with the same key is safe",
                key=op.key,
                reason=outcome.reason,
            )
        )
    op.lose_track()
    op.note = outcome.reason
    op.save()
    return Refuse(_unknown(op))


# --- the errors callers see ---------------------------------------------------------------------
def _failed(op: ExternalOperation) -> OperationFailed:
    error = op.error if isinstance(op.error, dict) else {}
    reason = str(error.get("reason") or "failed")
    return OperationFailed(
        f"{op.system} rejected {op.action} {op.key!r}: {reason}. The key is spent: a new attempt is a new "
        "request with a new key",
        key=op.key,
        reason=reason,
        detail=error.get("detail"),
    )


def _unknown(op: ExternalOperation) -> OutcomeUnknown:
    return OutcomeUnknown(
        f"the outcome of {op.action} {op.key!r} at {op.system} is unknown ({op.note or 'no answer'}); "
        "the next perform looks it up before sending again",
        key=op.key,
        reason=op.note,
    )


def _in_progress(op: ExternalOperation, *, now: datetime) -> OperationInProgress:
    return OperationInProgress(
        f"{op.action} {op.key!r} was sent to {op.system} {ago(op.submitted_at, now=now)} and its answer is not "
        "recorded yet; nothing was sent now, try again later",
        key=op.key,
        reason="in progress",
    )
