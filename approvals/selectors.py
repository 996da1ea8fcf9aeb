"""Reads: who may see and decide which requests, and the decision a workflow receives."""

from __future__ import annotations

from typing import Any, TypedDict

from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from approvals.models import ApprovalRequest, ApprovalStatus

User = AbstractUser | AnonymousUser

DECIDE_ANY = "approvals.decide_any"
VIEW_ALL = "approvals.view_approvalrequest"


def can_decide_any(user: User) -> bool:
    return bool(user.is_authenticated and user.is_active and user.has_perm(DECIDE_ANY))


def can_see_all(user: User) -> bool:
    """Staff with the view permission see every request (they may still not decide)."""
    return can_decide_any(user) or bool(
        user.is_authenticated and user.is_active and user.is_staff and user.has_perm(VIEW_ALL)
    )


def group_names(user: User) -> list[str]:
    if not user.is_authenticated or not user.is_active:
        return []
    return list(user.groups.values_list("name", flat=True))


def is_authorised(user: User, request: ApprovalRequest) -> bool:
    """In the request's approvers group, or allowed to decide any request. Says nothing of four eyes."""
    if not user.is_authenticated or not user.is_active:
        return False
    return can_decide_any(user) or user.groups.filter(name=request.approvers).exists()


def is_requester(user: User, request: ApprovalRequest) -> bool:
    return request.requested_by_id is not None and request.requested_by_id == user.pk


def may_decide_now(user: User, request: ApprovalRequest) -> bool:
    """Whether to offer this user the buttons: pending, authorised, not the requester.

    Only an offer: ``approval_decide`` checks everything again with the row locked.
    """
    return request.is_pending and is_authorised(user, request) and not is_requester(user, request)


def approval_list(*, user: User, status: str | None = None) -> QuerySet[ApprovalRequest]:
    """Requests the user may see: those of their approvers groups, or all (decide_any, or staff
    with the view permission)."""
    requests = ApprovalRequest.objects.all()
    if not can_see_all(user):
        requests = requests.filter(approvers__in=group_names(user))
    if status:
        requests = requests.filter(status=status)
    return requests


def approval_queue(*, status: str) -> QuerySet[ApprovalRequest]:
    """Every request in ``status``, oldest first: the operator's view (``manage.py approvals list``)."""
    return ApprovalRequest.objects.filter(status=status).order_by("created_at", "id")


def approval_get(*, user: User, request_id: int | str) -> ApprovalRequest | None:
    """The request if the user may see it; None both when it does not exist and when it is not theirs."""
    try:
        return approval_list(user=user).get(pk=request_id)
    except (ApprovalRequest.DoesNotExist, ValueError, TypeError, ValidationError):
        return None


def decision_payload(request: ApprovalRequest) -> dict[str, Any]:
    """The decision event's payload: what ``wait_for_approval`` turns into an ApprovalDecision.

    What was decided, never by whom or why: the wait step stores the payload as its result, which
    the run's owner (a customer) reads through the run's API, page and socket. A reviewer's name
    and note are for staff (the request, the decision log); a step that must act on who decided
    reads it in its body (``decision_details``) and keeps it out of its result.

    Built from the row alone, so a repeated decide would build the same payload (the event's
    idempotency key then matches instead of conflicting).
    """
    return {
        "request_id": request.pk,
        "approved": request.status == ApprovalStatus.APPROVED,
        "version": request.version,
        "decided_at": request.decided_at.isoformat() if request.decided_at else None,
    }


class DecisionDetails(TypedDict):
    """Who decided a request, and their note: for a step body that acts on them (not to return)."""

    decided_by_id: int | None
    decided_by: str | None
    note: str


def approved_content(request_id: int) -> dict[str, Any]:
    """What the reviewer of request ``request_id`` approved: the snapshot of the version under review
    (``content``), for a workflow that must act on exactly that, not on a later read of the subject.
    LookupError unless the request was approved."""
    request = ApprovalRequest.objects.filter(pk=request_id, status=ApprovalStatus.APPROVED).first()
    if request is None:
        raise LookupError(f"approval request {request_id} is not an approved one")
    return dict(request.content or {})


def decision_details(request_id: int) -> DecisionDetails:
    """Who decided request ``request_id`` and their note (staff data: a step body that needs them,
    e.g. to record the reviewer on the subject, uses them without returning them, since a step's
    result is shown to the run's owner)."""
    request = ApprovalRequest.objects.select_related("decided_by").get(pk=request_id)
    by = request.decided_by
    return {
        "decided_by_id": request.decided_by_id,
        "decided_by": by.get_username() if by is not None else None,
        "note": request.note,
    }


def supersession_payload(request: ApprovalRequest, *, reason: str, current_version: str = "") -> dict[str, Any]:
    """The wake event's payload when the subject changed under a pending request (no decision)."""
    return {
        "request_id": request.pk,
        "superseded": True,
        "version": request.version,
        "current_version": current_version,
        "reason": reason,
    }


def superseded_by(request: ApprovalRequest) -> ApprovalRequest | None:
    return request.replacements.order_by("id").first()
