"""Helpers of the refund tests: orders, requests with faults armed, waiting for states."""

from __future__ import annotations

import io
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import quote
from uuid import UUID

from django.core.management import call_command
from django.db import transaction

from approvals.models import ApprovalRequest, ApprovalStatus
from examples.refunds.models import Order, OrderStatus, RefundRequest
from examples.refunds.selectors import order_balance, refund_status
from examples.refunds.services import order_create, refund_request_create
from examples.sandbox.process import SandboxProcess
from ledger.models import ExternalOperation, OperationStatus
from tests.support import wait_for, wait_for_terminal

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from examples.refunds.tests.conftest import World

ADDRESS = {"street": "221B Baker Street", "postcode": "NW1 6XE"}


def new_order(customer: Any, number: str, amount: str = "300.00") -> Order:
    return order_create(
        number=number, customer=customer, amount=amount, items=[{"sku": "KETTLE", "qty": 1}], shipping_address=ADDRESS
    )


def ask(
    order: Order,
    amount: str,
    *,
    sandbox: SandboxProcess | None = None,
    faults: tuple[tuple[str, str, int, str], ...] = (),
    **options: Any,
) -> RefundRequest:
    """Request a refund; faults are armed for its key before the run can start (its enqueue
    leaves on commit), so the worker never sees the key unarmed."""
    with transaction.atomic():
        request, _ = refund_request_create(
            order=order, customer=order.customer, amount=amount, reason="broken", options=options
        )
        for fault, on, times, _why in faults:
            assert sandbox is not None
            sandbox.arm(request.operation_key, fault, times=times, on=on)
    return request


def run_of(request: RefundRequest) -> UUID:
    """The id of the request's run (every request a test asks for has one)."""
    assert request.run_id is not None, f"refund request {request.pk} has no run"
    return request.run_id


def status_of(request: RefundRequest) -> str:
    return refund_status(RefundRequest.objects.select_related("order", "run").get(pk=request.pk))


def wait_status(request: RefundRequest, expected: str, timeout: float = 40) -> None:
    wait_for(lambda: status_of(request) == expected, timeout=timeout, what=f"status {expected!r}")


def operation_reaches(request: RefundRequest, status: str, *, timeout: float = 40, interval: float = 0.05) -> None:
    """Wait until the refund's operation at the provider is in ``status``."""
    wait_for(
        lambda: ExternalOperation.objects.filter(key=request.operation_key, status=status).exists(),
        timeout=timeout,
        interval=interval,
        what=f"the refund's operation to be {status}",
    )


def reconcile() -> str:
    """``manage.py reconcile``, as staff or cron run it; its output."""
    out = io.StringIO()
    call_command("reconcile", stdout=out)
    return out.getvalue()


def pending_approval(request: RefundRequest, timeout: float = 40, *, version: str | None = None) -> ApprovalRequest:
    """Once the refund's run has a pending approval request (for ``version``, if given): that request."""
    pending = ApprovalRequest.objects.filter(run_id=request.run_id, status=ApprovalStatus.PENDING)
    if version is not None:
        pending = pending.filter(version=version)
    found: ApprovalRequest = wait_for(
        pending.first, timeout=timeout, what=f"a pending approval{f' of version {version}' if version else ''}"
    )
    return found


def drain_lookup_faults(sandbox: SandboxProcess, key: str) -> None:
    """Use up the armed lookup errors: the provider answers lookups of ``key`` again."""
    for _ in range(200):
        status, _body = sandbox.request("GET", f"/v1/refunds?key={quote(key, safe='')}")
        if status == 200:
            return
    raise AssertionError("the lookup faults did not run out")


def assert_confirmed(
    request: RefundRequest, sandbox: SandboxProcess, timeout: float = 60, *, provider_refunds: int | None = 1
) -> None:
    run = wait_for_terminal(run_of(request), timeout=timeout)
    assert run.status == "completed", (run.status, run.error)
    assert run.result is not None, run.error
    assert run.result["outcome"] == "refunded"
    assert status_of(request) == "confirmed"
    if provider_refunds is not None:
        assert sandbox.stats()["refunds"] == provider_refunds  # exactly that many at the provider
    order = Order.objects.get(pk=request.order_id)
    whole = order_balance(order=order).refunded >= order.amount
    assert order.status == (OrderStatus.REFUNDED if whole else OrderStatus.PARTIALLY_REFUNDED)


def refunded_at_provider(sandbox: SandboxProcess, order_number: str) -> Decimal:
    """What the provider really refunded on an order, by its own list (not our records)."""
    status, body = sandbox.request("GET", "/v1/refunds")
    assert status == 200, body
    return sum((Decimal(r["amount"]) for r in body["refunds"] if r["order"] == order_number), Decimal("0"))


def unknown_refund(
    world: World,
    customer: User,
    number: str,
    order_amount: str,
    amount: str,
    *,
    check_interval: float = 2,
    retry_delay: float = 0.5,
) -> RefundRequest:
    """A refund for ``customer`` that the provider makes, but whose answer is lost; lookups fail until
    drained. Its run's refund step tries five times more, ``retry_delay`` seconds apart at first and
    doubling (15.5 s in all by default), then checks the outcome every ``check_interval`` seconds,
    and when woken."""
    sandbox = world.sandbox
    request = ask(
        new_order(customer, number, order_amount),
        amount,
        sandbox=sandbox,
        faults=(("timeout=3", "create", 1, ""), ("error", "lookup", 100, "")),
        retry_delay_seconds=retry_delay,
        check_interval_seconds=check_interval,
    )
    wait_for(
        lambda: ExternalOperation.objects.filter(key=request.operation_key, status=OperationStatus.UNKNOWN).exists(),
        timeout=40,
        what="the refund's outcome to be unknown",
    )
    return request
