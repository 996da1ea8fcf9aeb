"""Reads: what a customer is told about a refund request, and what a run left in flight."""
from __future__ import annotations

from typing import TYPE_CHECKING

from django.db.models import QuerySet

from approvals.models import ApprovalRequest, ApprovalStatus
from examples.refunds.models import RefundRequest
from ledger.models import ExternalOperation, OperationStatus
from workflows.models import RunStatus, WorkflowRun

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

# What the customer reads, in words (DESIGN.md section 7).
BEING_PREPARED = "being prepared"
AWAITING_APPROVAL = "awaiting approval"
SUBMITTED = "submitted"
CONFIRMED = "confirmed"
BEING_CHECKED = "outcome being checked"
REJECTED = "rejected"
EXPIRED = "expired"
NOT_COMPLETED = "could not be completed"

IN_FLIGHT = (OperationStatus.SUBMITTED, OperationStatus.UNKNOWN)


def refund_status(refund_request: RefundRequest) -> str:
    """The request's state in words, from the ledger operation first (it is the money), then the
    approval, then the run."""
    op = ExternalOperation.objects.filter(key=refund_request.operation_key).first()
    if op is not None:
        return {
            OperationStatus.SUCCEEDED: CONFIRMED,
            OperationStatus.UNKNOWN: BEING_CHECKED,
            OperationStatus.SUBMITTED: SUBMITTED,
            OperationStatus.FAILED: NOT_COMPLETED,
        }.get(OperationStatus(op.status), SUBMITTED if op.submit_count else BEING_PREPARED)
    run = refund_request.run
    if run is None:
        return BEING_PREPARED
    approval = ApprovalRequest.objects.filter(run=run).order_by("-created_at", "-pk").first()
    if approval is not None:
        if approval.status == ApprovalStatus.PENDING:
            return AWAITING_APPROVAL
        if approval.status == ApprovalStatus.REJECTED:
            return REJECTED
        if approval.status == ApprovalStatus.EXPIRED:
            return EXPIRED
    if run.status in (RunStatus.FAILED, RunStatus.TERMINATED):
        return NOT_COMPLETED
    outcome = run.result.get("outcome") if isinstance(run.result, dict) else None
    if outcome in (REJECTED, EXPIRED):
        return str(outcome)
    if outcome == "failed":
        return NOT_COMPLETED
    return BEING_PREPARED


def run_pending_operations(run: WorkflowRun) -> QuerySet[ExternalOperation]:
    """The run's refund operations still submitted or unknown: after a terminate, what someone
    must reconcile (``manage.py reconcile`` or the admin) before telling the customer anything."""
    keys = [r.operation_key for r in RefundRequest.objects.filter(run=run).select_related("order")]
    return ExternalOperation.objects.filter(key__in=keys, status__in=IN_FLIGHT).order_by("created_at")


def refund_request_get(*, user: AbstractBaseUser | AnonymousUser, request_id: int) -> RefundRequest | None:
    """The customer's own request; None for anyone else's (an API answers 404, never 403)."""
    if not user.is_authenticated:
        return None
    return RefundRequest.objects.select_related("order", "run").filter(pk=request_id, customer_id=user.pk).first()


def refund_requests_for(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[RefundRequest]:
    """The customer's own requests, newest first (their home page); none for anyone signed out."""
    if not user.is_authenticated:
        return RefundRequest.objects.none()
    return (RefundRequest.objects.select_related("order", "run").filter(customer_id=user.pk)
            .order_by("-created_at", "-pk"))
