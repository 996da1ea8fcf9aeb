"""Reads: what a customer is told about a refund request, what a run left in flight, and how much
of an order is refunded or may still be."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Literal

from django.conf import settings
from django.db.models import QuerySet

from approvals.models import ApprovalRequest, ApprovalStatus
from examples.refunds.models import Order, RefundRequest, operation_key
from ledger.models import ExternalOperation, OperationStatus
from workflows.models import RunStatus, WorkflowRun

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

# What the customer reads, in words (the API, the home page and the admin show these).
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
        if op.status == OperationStatus.PENDING and op.submit_count:
            # Sent before and pending again: sent once more by its run, or, if the run has ended,
            # an earlier send may still take effect until reconcile or a person settles it.
            ended = refund_request.run is None or refund_request.run.is_terminal
            return BEING_CHECKED if ended else SUBMITTED
        return {
            OperationStatus.SUCCEEDED: CONFIRMED,
            OperationStatus.UNKNOWN: BEING_CHECKED,
            OperationStatus.SUBMITTED: SUBMITTED,
            OperationStatus.FAILED: NOT_COMPLETED,
        }.get(OperationStatus(op.status), BEING_PREPARED)
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


# --- the order's money: what is refunded, and what may still be ---------------------------------
Hold = Literal["refunded", "in_flight", "released"]


@dataclass(frozen=True)
class OrderBalance:
    """An order's amount and what its refund requests did or may still do with it."""

    amount: Decimal
    refunded: Decimal  # the provider confirmed it
    in_flight: Decimal  # sent, unknown, or not decided yet: it may still be paid

    @property
    def refundable(self) -> Decimal:
        """What a new request may still ask for."""
        return self.amount - self.refunded - self.in_flight


def needs_approval(*, balance: OrderBalance, amount: Decimal) -> bool:
    """Whether a request of ``amount`` on an order with ``balance`` (its other requests) waits for
    a person: judged per order, not per request, so what the order's other requests refunded or may
    still refund counts too, and splitting a refund into pieces below the limit avoids no reviewer."""
    return balance.refunded + balance.in_flight + amount > Decimal(str(settings.REFUND_APPROVAL_LIMIT))


def refund_hold(*, operation_status: str | None, run: WorkflowRun | None) -> Hold:
    """What one request does to its order's balance.

    The ledger operation decides once it exists (created by the refund step under the order's
    lock, before anything is sent): succeeded is refunded, failed (rejected, or abandoned because
    it was never sent) is released, anything else may still pay. Without an operation the request
    holds its amount while its run may still get there (waiting for approval, checking the policy),
    and releases it once the run has ended (rejected, expired, refused, terminated): an ended run
    can no longer create the operation (``services.refund_reserve`` checks the run under the same
    locks). A restarted run holds again from its restart, and re-checks the balance before it pays.
    """
    if operation_status == OperationStatus.SUCCEEDED:
        return "refunded"
    if operation_status == OperationStatus.FAILED:
        return "released"
    if operation_status is not None:
        return "in_flight"
    return "in_flight" if run is not None and not run.is_terminal else "released"


def order_balance(*, order: Order, exclude_request_id: int | None = None) -> OrderBalance:
    """The order's balance from every refund request on it (but ``exclude_request_id``).

    To decide on it, call inside atomic() with the order row locked (``select_for_update``): every
    change to what the requests hold (a new request, a refund step reserving its operation) takes
    that lock first, so two decisions never both spend the same money.
    """
    requests = RefundRequest.objects.filter(order=order).select_related("run").order_by("pk")
    if exclude_request_id is not None:
        requests = requests.exclude(pk=exclude_request_id)
    keys = {operation_key(order.number, r.pk, r.key_salt): r for r in requests}
    statuses = dict(ExternalOperation.objects.filter(key__in=keys).values_list("key", "status"))
    none = Decimal("0.00")  # with the amounts' two places: a message says "0.00 refunded", not "0"
    totals: dict[Hold, Decimal] = {"refunded": none, "in_flight": none, "released": none}
    for key, request in keys.items():
        totals[refund_hold(operation_status=statuses.get(key), run=request.run)] += request.amount
    return OrderBalance(amount=order.amount, refunded=totals["refunded"], in_flight=totals["in_flight"])


def run_pending_operations(run: WorkflowRun) -> QuerySet[ExternalOperation]:
    """The run's refund operations not final yet: after a terminate, what someone must reconcile
    (``manage.py reconcile`` or the admin) before telling the customer anything."""
    keys = [r.operation_key for r in RefundRequest.objects.filter(run=run).select_related("order")]
    # Once the run has ended, a pending one too: nobody but reconcile will settle it.
    open_states = [*IN_FLIGHT, OperationStatus.PENDING] if run.is_terminal else list(IN_FLIGHT)
    return ExternalOperation.objects.filter(key__in=keys, status__in=open_states).order_by("created_at")


def order_get(*, user: AbstractBaseUser | AnonymousUser, number: str) -> Order | None:
    """The customer's own order; None for anyone else's (an API answers 404, never 403)."""
    if not user.is_authenticated:
        return None
    return Order.objects.filter(number=number, customer_id=user.pk).first()


def refund_request_get(*, user: AbstractBaseUser | AnonymousUser, request_id: int) -> RefundRequest | None:
    """The customer's own request; None for anyone else's (an API answers 404, never 403)."""
    if not user.is_authenticated:
        return None
    return RefundRequest.objects.select_related("order", "run").filter(pk=request_id, customer_id=user.pk).first()


def refund_requests_for(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[RefundRequest]:
    """The customer's own requests, newest first (their home page); none for anyone signed out."""
    if not user.is_authenticated:
        return RefundRequest.objects.none()
    return (
        RefundRequest.objects.select_related("order", "run").filter(customer_id=user.pk).order_by("-created_at", "-pk")
    )
