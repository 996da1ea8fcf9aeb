"""Writes: raising, deciding, expiring, superseding and cancelling approval requests.

Lock order, everywhere: the run row first, then the request row(s).
- ``run_send_event`` (the decision's event) locks the run row;
- ``run_terminate`` holds the run row when its hook calls ``cancel_for_run``;
- the workflow's own steps (request, expire, re-check) lock the run row before the request, and
  their StepResult insert takes a key-share lock on it anyway.
A decision that locked the request first and then waited for the run could deadlock with any of
these; with one order they simply queue.

Each service is one transaction. The only thing that leaves the database, the Celery enqueue that
wakes the run, is deferred to commit by ``run_send_event`` (workflows.outbox.on_commit).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict
from uuid import UUID

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.db import models, transaction
from django.db.models import F, Q
from django.utils import timezone

from approvals.exceptions import ApprovalRefused, RefusalCode
from approvals.models import (
    APPROVERS_MAX,
    NAME_MAX,
    NOTE_MAX,
    SUBJECT_ID_MAX,
    SUBJECT_TYPE_MAX,
    VERSION_MAX,
    ApprovalRequest,
    ApprovalStatus,
    DecisionAction,
    DecisionChannel,
    DecisionLog,
    DecisionResult,
)
from approvals.selectors import decision_payload, is_authorised, is_requester, superseded_by, supersession_payload
from approvals.types import Proposal
from ledger.redaction import redact
from workflows.exceptions import InvalidPayload, NonRetryableError
from workflows.models import TERMINAL, WorkflowRun
from workflows.outbox import on_commit
from workflows.services import check_json_size, run_send_event

logger = logging.getLogger("approvals")

Subject = models.Model | tuple[str, str | int]


# --- input checks (before anything is written) ---------------------------------------------------
def subject_ref(subject: Subject) -> tuple[str, str]:
    """``(type, id)`` of a subject: a saved model instance gives ``("app_label.model", str(pk))``;
    a pair ``(type, id)`` is taken as it is (for subjects that are not rows of this database)."""
    if isinstance(subject, models.Model):
        if subject.pk is None:
            raise ValueError(f"the subject {subject!r} is not saved: it has no id to name")
        return subject._meta.label_lower, str(subject.pk)
    if (
        isinstance(subject, tuple)
        and len(subject) == 2
        and isinstance(subject[0], str)
        and subject[0]
        and isinstance(subject[1], str | int)
        and not isinstance(subject[1], bool)
    ):
        subject_type, subject_id = subject[0], str(subject[1])
        if len(subject_type) > SUBJECT_TYPE_MAX or not subject_id or len(subject_id) > SUBJECT_ID_MAX:
            raise ValueError(f"subject {subject!r}: type up to {SUBJECT_TYPE_MAX} characters, id 1 to {SUBJECT_ID_MAX}")
        return subject_type, subject_id
    raise TypeError(f"subject must be a saved model instance or a (type, id) pair, not {subject!r}")


def check_request(*, name: str, approvers: str, proposal: Proposal) -> None:
    """What the workflow asks for is well-formed, or ValueError / InvalidPayload (not retried)."""
    if not isinstance(name, str) or not name or len(name) > NAME_MAX:
        raise ValueError(f"the approval's name must be 1 to {NAME_MAX} characters, not {name!r}")
    if not isinstance(approvers, str) or not approvers or len(approvers) > APPROVERS_MAX:
        raise ValueError(f"approvers must be a group name of 1 to {APPROVERS_MAX} characters, not {approvers!r}")
    if len(proposal.version) > VERSION_MAX:
        raise ValueError(f"the version is {len(proposal.version)} characters; the limit is {VERSION_MAX}")
    check_json_size(proposal.content, what="approval content")


def check_decision_input(*, version: Any, note: Any) -> None:
    if not isinstance(version, str) or not version:
        raise InvalidPayload("version must be the non-empty version string the reviewer saw")
    if not isinstance(note, str) or len(note) > NOTE_MAX:
        raise InvalidPayload(f"note must be a string of at most {NOTE_MAX} characters")


# --- raising a request (inside the workflow's atomic step) ---------------------------------------
class CreatedRequest(TypedDict):
    """The request step's result (JSON): what the wait step needs."""

    request_id: int
    version: str
    expires_at: str


def approval_request_create(
    *,
    run_id: UUID | str,
    attempt: int,
    step_name: str,
    subject: tuple[str, str],
    proposal: Proposal,
    approvers: str,
    timeout: timedelta,
    requested_by_id: int | None = None,
    replaces_id: int | None = None,
) -> ApprovalRequest:
    """Create a pending request. Call inside the request step's atomic(): the row and the step's
    result commit together, so a replay finds the step done and never creates a second row."""
    check_request(name=step_name, approvers=approvers, proposal=proposal)
    # The run row first, as everywhere. A terminate that got the lock first has committed by the
    # time this reads the run, so no request is created; one that comes later waits for this
    # commit, then its hook finds the new request and cancels it. No request outlives its run.
    run = WorkflowRun.objects.select_for_update().get(pk=run_id)
    if run.is_terminal:
        raise NonRetryableError(f"the run is {run.status}: no approval is requested for it")
    if requested_by_id is not None and not get_user_model().objects.filter(pk=requested_by_id).exists():
        requested_by_id = None  # deleted since the run started: the foreign key would fail at commit
    return ApprovalRequest.objects.create(
        run=run,
        attempt=attempt,
        step_name=step_name,
        subject_type=subject[0],
        subject_id=subject[1],
        # Reviewers decide on what the workflow shows them, never on personal data: whatever a
        # workflow puts under a key the ledger redacts (address, email, phone, card ...) is not kept.
        version=proposal.version,
        summary=proposal.summary,
        content=redact(proposal.content),
        approvers=approvers,
        requested_by_id=requested_by_id,
        replaces_id=replaces_id,
        expires_at=timezone.now() + timeout,
    )


# --- deciding ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Decided:
    """``decide``'s answer. ``created`` is False when the same decision had been made already
    (a double click): ``request`` is then the established result and no event was sent."""

    request: ApprovalRequest
    created: bool
    event_id: int | None = None


def _lock(request_id: int) -> tuple[ApprovalRequest, WorkflowRun]:
    """The request and its run, both locked, run first (see the module's docstring). Call inside
    atomic(). ApprovalRequest.DoesNotExist if there is no such request."""
    run_id = ApprovalRequest.objects.filter(pk=request_id).values_list("run_id", flat=True).get()
    run = WorkflowRun.objects.select_for_update().get(pk=run_id)
    return ApprovalRequest.objects.select_for_update().get(pk=request_id), run


def check_decision(
    *,
    request: ApprovalRequest,
    run: WorkflowRun,
    by: AbstractUser | AnonymousUser,
    approve: bool,
    version: str,
) -> bool:
    """The checks of a decision, in order, on locked rows. True: make the decision. False: the same
    decision was made already (answer with it). Otherwise raises ApprovalRefused."""

    def refused(code: RefusalCode, message: str, replacement: ApprovalRequest | None = None) -> ApprovalRefused:
        return ApprovalRefused(
            code,
            message,
            status=request.status,
            version=request.version,
            superseded_by=replacement.pk if replacement else None,
        )

    # Who first: someone who may not decide learns nothing about the request's state.
    if not is_authorised(by, request):
        raise refused(
            RefusalCode.NOT_AUTHORISED,
            f"{by} is not in the approvers group {request.approvers!r} and may not decide every request",
        )
    if is_requester(by, request):
        raise refused(RefusalCode.FOUR_EYES, "you requested this action: another reviewer must decide it")
    target = ApprovalStatus.APPROVED if approve else ApprovalStatus.REJECTED
    if request.status == target and version == request.version:
        return False
    if request.status != ApprovalStatus.PENDING:
        replacement = superseded_by(request) if request.status == ApprovalStatus.SUPERSEDED else None
        message = f"the request is {request.status}; it takes no more decisions"
        if replacement is not None:
            message += f": review the current version ({replacement.version}, request {replacement.pk})"
        raise refused(RefusalCode.NOT_PENDING, message, replacement)
    if version != request.version:
        raise refused(
            RefusalCode.STALE_VERSION,
            f"review the current version: this request is for version {request.version!r}, not {version!r}",
        )
    if run.is_terminal or run.attempt != request.attempt:
        what = f"is {run.status}" if run.is_terminal else f"was restarted (attempt {run.attempt})"
        raise refused(RefusalCode.RUN_FINISHED, f"the run that asked for this approval {what}")
    if request.is_overdue():
        raise refused(
            RefusalCode.EXPIRED, f"the request expired at {request.expires_at.isoformat()}; it takes no more decisions"
        )
    return True


def approval_decide(
    *,
    request_id: int,
    by: AbstractUser | AnonymousUser,
    approve: bool,
    version: str,
    note: str = "",
    channel: str = DecisionChannel.PYTHON,
) -> Decided:
    """Approve or reject a request, in one transaction with the event that wakes its run.

    Refusals raise ApprovalRefused and change nothing but the log, which records every attempt.
    ApprovalRequest.DoesNotExist if there is no such request; InvalidPayload for bad input.
    """
    check_decision_input(version=version, note=note)
    action = DecisionAction.APPROVE if approve else DecisionAction.REJECT
    try:
        return _decide(
            request_id=request_id, by=by, approve=approve, version=version, note=note, channel=channel, action=action
        )
    except ApprovalRefused as refusal:
        # After the decision's transaction rolled back: the refusal is on the record, nothing else.
        _log(
            request_id,
            actor=by,
            action=action,
            version=version,
            result=DecisionResult.REFUSED,
            code=refusal.code,
            message=str(refusal),
            note=note,
            channel=channel,
        )
        raise


def _decide(
    *,
    request_id: int,
    by: AbstractUser | AnonymousUser,
    approve: bool,
    version: str,
    note: str,
    channel: str,
    action: str,
) -> Decided:
    with transaction.atomic():
        # Both rows stay locked to the commit: of ten concurrent decisions one transitions; the
        # others wait here and then see its result (repeated, or refused naming the state).
        request, run = _lock(request_id)
        if not check_decision(request=request, run=run, by=by, approve=approve, version=version):
            _log(
                request.pk,
                actor=by,
                action=action,
                version=version,
                result=DecisionResult.REPEATED,
                message=f"already {request.status}",
                note=note,
                channel=channel,
            )
            return Decided(request=request, created=False)
        transition = request.approve if approve else request.reject
        transition(by_id=by.pk, note=note, at=timezone.now())
        request.save()
        # Inside this transaction: the event row commits with the decision, and its enqueue is
        # deferred to that commit. The key makes the event unique even if this were ever replayed.
        event, _ = run_send_event(
            run_id=run.id,
            type=request.event_type,
            payload=decision_payload(request),
            idempotency_key=request.event_key,
            system=True,
        )
        _log(
            request.pk,
            actor=by,
            action=action,
            version=version,
            result=DecisionResult.ACCEPTED,
            note=note,
            channel=channel,
        )
    return Decided(request=request, created=True, event_id=event.pk)


def _log(
    request_id: int,
    *,
    actor: AbstractUser | AnonymousUser | None,
    action: str,
    version: str,
    result: str,
    code: str = "",
    message: str = "",
    note: str = "",
    channel: str = DecisionChannel.SYSTEM,
) -> None:
    known = actor is not None and actor.is_authenticated
    # One log line per entry, after the commit (a refusal's entry is written after its rollback):
    # what was done to which request, never by whom (a person) or with which note.
    extra = {"event": f"approval.{action}", "approval_id": request_id, "result": result, "reason": code or None}
    on_commit(
        lambda: logger.info(
            "approval request %s: %s %s%s", request_id, action, result, f" ({code})" if code else "", extra=extra
        )
    )
    DecisionLog.objects.create(
        request_id=request_id,
        actor_id=actor.pk if known and actor is not None else None,
        actor_name=actor.get_username() if known and actor is not None else "",
        action=action,
        version=version,
        result=result,
        code=code,
        message=message,
        note=note,
        channel=channel,
    )


# --- what the workflow does to its own request ---------------------------------------------------
class Expiry(TypedDict):
    """The expire step's result: ``decision`` is set when a decision won the race with the timer."""

    status: str
    decision: dict[str, Any] | None


def approval_expire(*, request_id: int) -> Expiry:
    """The wait timed out: move the request to expired, unless it was decided meanwhile (then the
    decision wins and is returned). Idempotent; runs inside the workflow's atomic expire step."""
    with transaction.atomic():
        request, _ = _lock(request_id)
        if request.status == ApprovalStatus.PENDING:
            request.expire()
            request.save()
            _log(
                request.pk,
                actor=None,
                action=DecisionAction.EXPIRE,
                version=request.version,
                result=DecisionResult.ACCEPTED,
                message=f"no decision by {request.expires_at.isoformat()}",
            )
            return {"status": request.status, "decision": None}
        decided = request.status in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED)
        return {"status": request.status, "decision": decision_payload(request) if decided else None}


class Recheck(TypedDict):
    """The re-check step's result."""

    changed: bool
    approved_version: str
    current_version: str


def approval_recheck(*, request_id: int, current: Proposal) -> Recheck:
    """After an approval: if the subject's current version is not the approved one, supersede the
    request (the workflow then raises a new one for ``current``). Inside the workflow's atomic step."""
    with transaction.atomic():
        request, _ = _lock(request_id)
        changed = current.version != request.version
        if changed and request.status in (ApprovalStatus.APPROVED, ApprovalStatus.PENDING):
            request.supersede()
            request.save()
            _log(
                request.pk,
                actor=None,
                action=DecisionAction.SUPERSEDE,
                version=current.version,
                result=DecisionResult.ACCEPTED,
                message=f"the subject changed from version {request.version} to {current.version}",
            )
        return {"changed": changed, "approved_version": request.version, "current_version": current.version}


def approval_supersede_pending(*, subject: tuple[str, str], reason: str, current_version: str = "") -> list[int]:
    """The subject changed: supersede its pending requests now, each in one transaction with the
    event that wakes its run (``approve_current`` then raises a request for the new version).

    Call it inside the transaction that changes the subject, so the change and the supersession
    commit together: a reviewer's tab still showing the old version is refused from that commit on
    ("the request is superseded"), instead of its decision being accepted and undone at the
    re-check. Returns the ids superseded. A request whose run has ended or moved on to a later
    attempt is left to cancellation, one past its expiry to the expiry.
    """
    if not isinstance(reason, str) or len(reason) > NOTE_MAX:
        raise InvalidPayload(f"reason must be a string of at most {NOTE_MAX} characters")
    superseded: list[int] = []
    pending = ApprovalRequest.objects.filter(
        subject_type=subject[0], subject_id=subject[1], status=ApprovalStatus.PENDING
    )
    with transaction.atomic():
        for request_id in pending.order_by("id").values_list("pk", flat=True):
            request, run = _lock(request_id)  # run first, as everywhere
            if request.status != ApprovalStatus.PENDING or run.is_terminal or run.attempt != request.attempt:
                continue
            if request.is_overdue():
                continue  # its time is up: it ends as expired (the run's timer), not revived as a new request
            request.supersede()
            request.save()
            run_send_event(
                run_id=run.id,
                type=request.event_type,
                idempotency_key=request.event_key,
                payload=supersession_payload(request, reason=reason, current_version=current_version),
                system=True,
            )
            message = f"the subject changed: {reason}" if reason else "the subject changed"
            _log(
                request.pk,
                actor=None,
                action=DecisionAction.SUPERSEDE,
                version=current_version or request.version,
                result=DecisionResult.ACCEPTED,
                message=message,
            )
            superseded.append(request.pk)
    return superseded


# --- cancellation ----------------------------------------------------------------------------------
def cancel_for_run(run_id: UUID | str) -> int:
    """Cancel the pending requests the run no longer waits for: all of them once it has ended
    (terminated, failed, completed), those of earlier attempts after a restart. Returns how many.

    Called by the engine's terminate hook (``cancel_for_terminated_run``); a restart hook would call
    it the same way, inside run_restart's transaction after ``run.save()``: the run row is then
    already locked by the caller (locking it again here is a no-op) and this reads the run's new
    status and attempt. Also safe on its own (the sweep).
    """
    with transaction.atomic():
        run = WorkflowRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            return 0
        stale = ApprovalRequest.objects.select_for_update().filter(run=run, status=ApprovalStatus.PENDING)
        if not run.is_terminal:
            stale = stale.filter(attempt__lt=run.attempt)
        why = f"the run is {run.status}" if run.is_terminal else f"the run was restarted (attempt {run.attempt})"
        cancelled = 0
        for request in stale.order_by("id"):
            request.cancel()
            request.save()
            _log(
                request.pk,
                actor=None,
                action=DecisionAction.CANCEL,
                version=request.version,
                result=DecisionResult.ACCEPTED,
                message=why,
            )
            cancelled += 1
    return cancelled


def cancel_for_terminated_run(run: WorkflowRun) -> None:
    """``workflows.hooks.on_run_terminated`` (registered in ApprovalsConfig.ready): run_terminate
    calls it inside its transaction, after saving the run, with the run row locked."""
    cancel_for_run(run.id)


def cancel_orphans() -> int:
    """The sweep: cancel pending requests whose run has ended or moved on to a later attempt.

    What the terminate hook does not see: a run restarted (no hook yet) or failed while a request
    was pending. ``manage.py approvals sweep`` and the ``approvals.sweep`` task run it.
    """
    orphaned = (
        ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING)
        .filter(Q(run__status__in=TERMINAL) | Q(attempt__lt=F("run__attempt")))
        .order_by()
        .values_list("run_id", flat=True)
        .distinct()
    )
    return sum(cancel_for_run(run_id) for run_id in list(orphaned))
