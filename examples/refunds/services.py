"""Writes: orders (every change bumps the version) and refund requests (which start the workflow).

Money rule: what an order's refund requests have refunded or may still refund never exceeds the
order's amount (``selectors.order_balance``). Two writes change that balance, and both decide with
the order row locked: ``refund_request_create`` (a new request holds its amount) and
``refund_reserve`` (the refund step records its ledger operation just before sending it). Lock
order: the order row, then the run row (as ``order_change`` and the approval's proposal take them).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals import supersede_pending
from examples.refunds.models import Order, OrderStatus, RefundRequest, request_ids_in
from examples.refunds.selectors import OrderBalance, order_balance
from ledger import prepare, record_create
from ledger.models import ExternalOperation, OperationalRecord, OperationStatus
from workflows import NonRetryableError
from workflows import services as workflow_services
from workflows.exceptions import IdempotencyConflict
from workflows.models import TERMINAL, WorkflowRun

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from agents.models import Agent

WORKFLOW = "refund"
REFUND_TOOL = "payments.refund"  # the operational record's tool
CHANGEABLE = frozenset({"amount", "currency", "items", "shipping_address", "status"})
# Payload keys a caller (tests, the demo) may set to shorten the workflow's waits.
OPTIONS = frozenset({"approval_timeout_seconds", "retry_delay_seconds", "check_interval_seconds"})


def order_create(
    *,
    number: str,
    customer: User,
    amount: Decimal | str,
    currency: str = "GBP",
    items: list[Any] | None = None,
    shipping_address: dict[str, Any] | None = None,
) -> Order:
    return Order.objects.create(
        number=number,
        customer=customer,
        amount=Decimal(amount),
        currency=currency,
        items=items or [],
        shipping_address=shipping_address or {},
    )


class StaleOrder(ValueError):
    """The order is no longer at the version the change was made against."""


def order_change(*, order_id: int, expected_version: int | None = None, **changes: Any) -> Order:
    """Apply ``changes`` and bump the version, with the row locked (two changes never share a version).

    ``expected_version``: the version the change was made against (a page, a form); StaleOrder if
    the order has moved on since, and nothing changes. A refund approval pending on the order is
    superseded in the same commit, and its run asks again for the new version: a reviewer's page
    still showing the old version is refused from then on.
    """
    unknown = set(changes) - CHANGEABLE
    if unknown:
        raise ValueError(f"cannot change {', '.join(sorted(unknown))} of an order")
    with transaction.atomic():
        order = Order.objects.select_for_update().get(pk=order_id)
        if expected_version is not None and order.version != expected_version:
            raise StaleOrder(
                f"order {order.number} changed since (it is now version {order.version}); "
                "reload it and make the change again"
            )
        for field, value in changes.items():
            setattr(order, field, Decimal(value) if field == "amount" else value)
        order.version += 1
        order.save()
        supersede_pending(
            order, reason=f"the order's {', '.join(sorted(changes))} changed", current_version=str(order.version)
        )
    return order


def order_mark_refunded(*, order_id: int) -> Order:
    """After a refund succeeded: refunded once the provider confirmed the whole amount, else
    partially refunded. A change like any other (a new version), with the row locked."""
    with transaction.atomic():
        order = Order.objects.select_for_update().get(pk=order_id)
        balance = order_balance(order=order)
        status = OrderStatus.REFUNDED if balance.refunded >= order.amount else OrderStatus.PARTIALLY_REFUNDED
        return order_change(order_id=order_id, status=status)


def parse_amount(value: Any) -> Decimal:
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise ValidationError({"amount": "not a number"}) from None
    if not amount.is_finite() or amount <= 0 or amount.as_tuple().exponent < -2:  # type: ignore[operator]
        raise ValidationError({"amount": "a positive amount with at most two decimal places"})
    return amount


def refund_request_create(
    *,
    order: Order,
    customer: User,
    amount: Decimal | str,
    reason: str = "",
    idempotency_key: str | None = None,
    options: dict[str, Any] | None = None,
    agent: Agent | None = None,
) -> tuple[RefundRequest, bool]:
    """Ask for a refund of ``amount`` on ``order`` (the customer's own) and start its workflow.

    ``agent``: the chat the customer asked in (the support agent's tool); the run then reports the
    request's state to it, in words, each time the state changes.

    Returns (request, created). The same Idempotency-Key with the same order, amount and reason
    returns the existing request; with anything else raises IdempotencyConflict. ValidationError
    for an amount that is not a positive amount of pence; BalanceExceeded (a ValidationError) when
    it is more than the order still has to refund: what was refunded and what other
    requests may still refund (sent, unknown, awaiting approval) count, decided with the order row
    locked, so two requests sent together cannot both take the same money.
    """
    value = parse_amount(amount)
    key = idempotency_key or ""
    if key:
        existing = RefundRequest.objects.filter(customer=customer, idempotency_key=key).first()
        if existing is not None:
            return _same(existing, order=order, amount=value, reason=reason), False
    if order.customer_id != customer.pk:
        raise Order.DoesNotExist("no such order")
    extra = {k: v for k, v in (options or {}).items() if k in OPTIONS}
    try:
        with transaction.atomic():
            check_open_requests(customer=customer)
            locked = Order.objects.select_for_update().get(pk=order.pk)
            if key:
                # A request with this key may have committed while we waited for the lock (a retry
                # sent together with the original): the answer is that request, not "no money left".
                existing = RefundRequest.objects.filter(customer=customer, idempotency_key=key).first()
                if existing is not None:
                    return _same(existing, order=order, amount=value, reason=reason), False
            check_refundable(locked, value, order_balance(order=locked))
            request = RefundRequest.objects.create(
                order=locked, customer=customer, amount=value, reason=reason, idempotency_key=key, agent=agent
            )
            if agent is not None:
                extra["agent"] = agent.pk
            # The run and its request commit together: no request without its run.
            run, _ = workflow_services.run_start(
                workflow=WORKFLOW,
                payload={"request_id": request.pk, "order": locked.number, **extra},
                idempotency_key=f"refund-request:{request.pk}",
                owner=customer,
            )
            request.run = run
            request.save(update_fields=["run"])
    except IntegrityError:
        # Two requests with one key at once: the other committed first; answer as for a replay.
        existing = RefundRequest.objects.filter(customer=customer, idempotency_key=key).first()
        if not key or existing is None:
            raise
        return _same(existing, order=order, amount=value, reason=reason), False
    return request, True


class BalanceExceeded(ValidationError):
    """The amount is more than the order still has to refund: a refusal because of the order's
    state (the API's 409), not of the request's form (400)."""


def check_refundable(order: Order, amount: Decimal, balance: OrderBalance) -> None:
    """BalanceExceeded unless ``amount`` fits what the order still has to refund."""
    if balance.refundable <= 0 and balance.refunded >= order.amount:
        raise BalanceExceeded({"order": "this order is already refunded"})
    if amount > balance.refundable:
        raise BalanceExceeded(
            {
                "amount": (
                    f"at most {balance.refundable} of this order's {order.amount} can still be refunded "
                    f"({balance.refunded} refunded, {balance.in_flight} in requests still being handled)"
                )
            }
        )


class TooManyOpenRequests(Exception):
    """The customer has REFUND_MAX_OPEN_REQUESTS refund requests in progress (the API's 429)."""


def check_open_requests(*, customer: User) -> None:
    """TooManyOpenRequests past REFUND_MAX_OPEN_REQUESTS requests whose runs have not finished.
    Call inside the transaction that creates the request: the customer's row is locked (customer,
    then order, then run), so requests sent together are counted one after the other."""
    limit = int(settings.REFUND_MAX_OPEN_REQUESTS)
    if not limit:
        return
    requests = RefundRequest.objects.filter(customer=customer).exclude(run__status__in=TERMINAL)
    open_requests = workflow_services.count_with_user_locked(customer, requests)
    if open_requests >= limit:
        raise TooManyOpenRequests(
            f"you have {open_requests} refund requests in progress (the limit is {limit}); "
            "ask for more once some have been handled"
        )


class RefundRefused(NonRetryableError):
    """The refund step found it may not pay: the order's balance no longer allows it, or its run
    was stopped before it sent anything."""


def refund_reserve(*, request_id: int, key: str, request: dict[str, Any]) -> None:
    """Record the request's refund as a pending ledger operation, if the order's balance allows it.

    The refund step calls it right before ``ledger.perform``. Under the order's row lock it checks
    again what every other request refunded or may still refund, and that the run was not stopped
    (the run row locked too: a terminate either came first, and nothing is reserved, or waits for
    this commit, and finds the operation to abandon). From this commit on the operation holds the
    amount whatever becomes of the run. Idempotent: an operation already reserved is kept as it is
    (a retry of the step). Raises RefundRefused, also when ``request`` (what would be sent) no longer
    matches the order: its number or currency changed since it was checked and approved.
    """
    with transaction.atomic():
        refund = RefundRequest.objects.get(pk=request_id)
        order = Order.objects.select_for_update().get(pk=refund.order_id)
        if ExternalOperation.objects.filter(key=key).exists():
            return  # reserved by an earlier try of this step: it holds the amount already
        run = (
            WorkflowRun.objects.select_for_update().filter(pk=refund.run_id).first()
            if refund.run_id is not None
            else None
        )
        if run is None or run.is_terminal:
            raise RefundRefused("the refund was stopped before it was sent")
        # What is sent is what was checked (and approved): an order whose number or currency changed
        # since, or a request for another amount, is refused here, under the lock, before anything
        # is sent, rather than paid on data nobody checked.
        sent = (str(request.get("order")), str(request.get("currency")), str(request.get("amount")))
        if sent != (order.number, order.currency, str(refund.amount)):
            raise RefundRefused(
                f"the order changed since the refund was checked: it would send {sent[2]} {sent[1]} on order "
                f"{sent[0]}, and the order is now {order.number} in {order.currency}; nothing was sent, ask again"
            )
        try:
            check_refundable(order, refund.amount, order_balance(order=order, exclude_request_id=refund.pk))
        except ValidationError as exc:
            raise RefundRefused("; ".join(exc.messages)) from None
        prepare(key=key, system="payments", action="refund", request=request)


def _same(existing: RefundRequest, *, order: Order, amount: Decimal, reason: str) -> RefundRequest:
    if (existing.order_id, existing.amount, existing.reason) != (order.pk, amount, reason):
        raise IdempotencyConflict(
            f"Idempotency-Key {existing.idempotency_key!r} was used for another refund request "
            f"({existing.pk}); nothing was changed"
        )
    return existing


def refund_settled(op: ExternalOperation) -> None:
    """``ledger.hooks.on_operation_settled``: a refund that succeeded after its run had ended (it
    was terminated while the outcome was unknown, then reconcile or a person found it paid).

    The run would have stored the operational record and marked the order; it never will, so this
    does, in the transaction that settles the operation: the order then says what happened to it.
    A run still going records its own outcome when it reads it. Order row, then run rows
    (``order_change`` supersedes pending approvals), as everywhere here.
    """
    if (op.system, op.action, op.status) != ("payments", "refund", OperationStatus.SUCCEEDED):
        return
    candidates = RefundRequest.objects.select_related("order", "run").filter(pk__in=request_ids_in(op.key))
    refund = next((r for r in candidates if r.operation_key == op.key), None)
    if refund is None or (refund.run is not None and not refund.run.is_terminal):
        return
    if refund_recorded(request_id=refund.pk, order_id=refund.order_id):
        return  # recorded already, by its run
    record_create(
        request_id=refund_record_id(refund.pk),
        run=refund.run_id,
        step="reconcile",
        tool=REFUND_TOOL,
        observed_at=op.finished_at,
        approval_pending=False,
        operation=op,
        response={
            "provider": op.response,
            "order": {
                "order": refund.order.number,
                "refund_amount": str(refund.amount),
                "settled_after_the_run_ended": True,
            },
        },
    )
    refund_mark_recorded(request_id=refund.pk, order_id=refund.order_id)
    refund_tell_chat(refund)


def refund_recorded(*, request_id: int, order_id: int) -> bool:
    """Inside atomic(): with the order's row locked, whether request ``request_id``'s refund was
    recorded and its order marked already. A refund is, once: a run restarted after it finished (or
    after reconcile settled its refund) finds it so and adds nothing, nor another version of the
    order, however long after (the request's ``recorded_at`` is never purged; the record is).
    A record without the mark is one a release before the mark wrote."""
    Order.objects.select_for_update().filter(pk=order_id).exists()
    if RefundRequest.objects.filter(pk=request_id, recorded_at__isnull=False).exists():
        return True
    return OperationalRecord.objects.filter(request_id=refund_record_id(request_id), tool=REFUND_TOOL).exists()


def refund_mark_recorded(*, request_id: int, order_id: int) -> None:
    """Inside atomic(), after ``refund_recorded`` said no: the operational record is written and the
    order marked refunded, and the request remembers it."""
    RefundRequest.objects.filter(pk=request_id).update(recorded_at=timezone.now())
    order_mark_refunded(order_id=order_id)


def refund_record_id(request_id: int) -> str:
    """The operational record's ``request_id`` for a refund request."""
    return f"refund-request:{request_id}"


def refund_tell_chat(refund: RefundRequest) -> None:
    """Tell the chat the request was asked in (if any) its state as ``refund_status`` reads it now,
    for the states its run could not report itself. Inside atomic(): the agent's row is locked."""
    if refund.agent_id is None:
        return
    from examples.chat import chat_report
    from examples.refunds.selectors import refund_status

    entry = {
        "order": refund.order.number,
        "amount": str(refund.amount),
        "currency": refund.order.currency,
        "status": refund_status(refund),
    }
    chat_report(refund.agent_id, "refunds", str(refund.pk), entry)


def refund_run_ended_early(run: WorkflowRun) -> None:
    """``workflows.hooks.on_run_failed`` and ``on_run_terminated`` (registered in RefundsConfig.ready):
    a refund's run that ended without reaching its last report (the engine failed it, staff
    terminated it) still tells the chat where the request stands: "could not be completed", or
    "outcome being checked" while a payment it sent is unsettled (reconcile then tells the rest)."""
    if run.workflow != "refund":
        return
    refund = RefundRequest.objects.select_related("order", "run").filter(run=run).first()
    if refund is not None:
        refund_tell_chat(refund)
