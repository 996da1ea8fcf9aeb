"""An order change racing with the workflow raising its approval request (threads on PostgreSQL):
the request never ends up pending for a version that is no longer the order's."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from django.contrib.auth.models import Group
from django.db import transaction

from approvals import decide
from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.types import Proposal
from approvals.waits import _create
from examples.refunds import workflows as refund_workflows
from examples.refunds.models import Order, RefundRequest
from examples.refunds.services import order_change, order_create, refund_request_create
from examples.refunds.workflows import order_proposal
from ledger.adapters import Succeeded, get_adapter, register_adapter, unregister_adapter
from ledger.exceptions import UnknownSystem
from ledger.models import ExternalOperation
from tests.factories import Users
from tests.fixtures import NoEnqueue
from tests.support import thread_of
from workflows.engine import advance
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_change_while_the_request_is_being_raised_supersedes_it(no_enqueue: NoEnqueue, users: Users) -> None:
    # given a refund whose run is about to raise its approval request (no worker: this test is the run)
    alice = users.alice
    order = order_create(number="7001", customer=alice, amount="150.00")
    refund, _ = refund_request_create(order=order, customer=alice, amount="120.00")
    read = threading.Event()

    def load_then_linger() -> Proposal:
        proposal = order_proposal(refund.pk)
        read.set()  # the change starts now, while this step is between its read and its insert
        time.sleep(0.3)
        return proposal

    def request_step() -> None:
        with transaction.atomic():  # as the engine runs an atomic step
            _create(
                str(refund.run_id),
                1,
                "refund approval",
                ("refunds.order", str(order.pk)),
                load_then_linger,
                "refund-approvers",
                3600.0,
                None,
                None,
            )

    def change() -> None:
        read.wait(10)
        order_change(order_id=order.pk, shipping_address={"street": "1 New Road"})

    # when the order changes in the middle of the request step
    threads = [thread_of(request_step), thread_of(change)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)

    # then the request raised for version 1 did not outlive the change: the change waited for the
    # order row, then superseded it, so the run asks again for version 2
    current = Order.objects.get(pk=order.pk).version
    requests = list(ApprovalRequest.objects.filter(subject_type="refunds.order", subject_id=str(order.pk)))
    assert current == 2
    assert [(r.version, r.status) for r in requests] == [("1", ApprovalStatus.SUPERSEDED)]
    assert not [r for r in requests if r.status == ApprovalStatus.PENDING and r.version != str(current)]


class Recorder:
    """The payments adapter of these tests: what would reach the provider, and a success."""

    can_lookup = False

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def submit(self, op: ExternalOperation) -> Succeeded:
        self.sent.append(dict(op.request))
        return Succeeded(response={"id": f"re_{len(self.sent)}", "status": "succeeded", **op.request})

    def lookup(self, op: ExternalOperation) -> Succeeded:
        raise AssertionError("nothing is looked up here: every answer is a success")


def run_of(refund: RefundRequest) -> UUID:
    assert refund.run_id is not None
    return refund.run_id


def result_of(refund: RefundRequest) -> dict[str, Any]:
    result = WorkflowRun.objects.get(pk=run_of(refund)).result
    assert isinstance(result, dict), result
    return result


@pytest.fixture
def provider() -> Iterator[Recorder]:
    recorder = Recorder()
    try:
        previous: Any = get_adapter("payments")
    except UnknownSystem:
        previous = None
    register_adapter("payments", recorder)
    yield recorder
    if previous is None:
        unregister_adapter("payments")
    else:
        register_adapter("payments", previous)


def awaiting_approval(users: Users, number: str, order_amount: str, amount: str) -> tuple[Order, RefundRequest]:
    """A GBP order of alice's and her refund of ``amount``, its run suspended on carol's approval."""
    Group.objects.get_or_create(name="refund-approvers")[0].user_set.add(users.carol)
    order = order_create(number=number, customer=users.alice, amount=order_amount, currency="GBP")
    refund, _ = refund_request_create(order=order, customer=users.alice, amount=amount)
    assert advance(run_of(refund)) == "suspended"
    return order, refund


def test_an_order_changed_after_the_approvals_re_check_is_never_paid_on_its_new_data(
    no_enqueue: NoEnqueue, users: Users, provider: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a refund of £120 approved on version 1 of a GBP order
    order, refund = awaiting_approval(users, "7002", "150.00", "120.00")
    approval = ApprovalRequest.objects.get(run_id=refund.run_id, status=ApprovalStatus.PENDING)
    decide(approval, by=users.carol, approve=True, version="1")

    # when staff change the order's currency right after the approval's re-check (nothing is
    # pending then, so nothing is superseded), before the run pays
    real = refund_workflows.load_snapshot

    def staff_edit_lands_first(request_id: int, *, lock: bool = False) -> dict[str, Any]:
        if not lock and Order.objects.get(pk=order.pk).currency == "GBP":
            order_change(order_id=order.pk, currency="EUR")
        return real(request_id, lock=lock)

    monkeypatch.setattr(refund_workflows, "load_snapshot", staff_edit_lands_first)
    advance(run_of(refund))

    # then nothing was sent (neither the approved GBP refund of an order now in EUR, nor an EUR one
    # nobody approved), and the run says why
    assert provider.sent == []
    result = result_of(refund)
    assert result["outcome"] == "failed" and "the order changed since the refund was checked" in result["reason"]
    assert not ExternalOperation.objects.exists()


def test_without_an_approval_an_order_changed_after_its_check_is_not_paid_either(
    no_enqueue: NoEnqueue, users: Users, provider: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a small refund (no approval needed), and the order's currency changed after the run read it
    order = order_create(number="7003", customer=users.alice, amount="30.00", currency="GBP")
    refund, _ = refund_request_create(order=order, customer=users.alice, amount="10.00")
    real = refund_workflows.check_policy

    def policy_then_edit(snapshot: dict[str, Any]) -> None:
        real(snapshot)
        order_change(order_id=order.pk, currency="EUR")

    monkeypatch.setattr(refund_workflows, "check_policy", policy_then_edit)

    # when the run goes on to pay
    advance(run_of(refund))

    # then it pays nothing, rather than £10 of an order now in euros
    assert provider.sent == []
    assert "the order changed since the refund was checked" in result_of(refund)["reason"]


def test_an_approved_refund_of_an_unchanged_order_is_paid_as_approved(
    no_enqueue: NoEnqueue, users: Users, provider: Recorder
) -> None:
    order, refund = awaiting_approval(users, "7004", "150.00", "120.00")
    decide(ApprovalRequest.objects.get(run_id=refund.run_id), by=users.carol, approve=True, version="1")

    advance(run_of(refund))

    assert provider.sent == [{"order": "7004", "amount": "120.00", "currency": "GBP"}]
    assert result_of(refund)["outcome"] == "refunded"


def test_an_order_cut_below_the_pending_refund_is_not_asked_about_again_and_pays_nothing(
    no_enqueue: NoEnqueue, users: Users, provider: Recorder
) -> None:
    # given a refund of £150 of a £200 order, its approval pending
    order, refund = awaiting_approval(users, "7005", "200.00", "150.00")
    first = ApprovalRequest.objects.get(run_id=refund.run_id, status=ApprovalStatus.PENDING)

    # when the order is cut to £120, which supersedes the pending request and wakes the run
    order_change(order_id=order.pk, amount="120.00")
    advance(run_of(refund))

    # then nobody is asked to approve £150 of it: the run ends, saying why, and nothing was sent
    requests = list(ApprovalRequest.objects.filter(run_id=refund.run_id))
    assert [(r.pk, r.status) for r in requests] == [(first.pk, ApprovalStatus.SUPERSEDED)]
    result = result_of(refund)
    assert result["outcome"] == "failed"
    assert "the refund (150.00) exceeds what order 7005 can still refund (120.00 of 120.00)" in result["reason"]
    assert provider.sent == []


def test_an_order_changed_but_still_able_to_refund_is_asked_about_again(
    no_enqueue: NoEnqueue, users: Users, provider: Recorder
) -> None:
    # given the same, cut to £160 instead: the £150 still fits
    order, refund = awaiting_approval(users, "7006", "200.00", "150.00")

    order_change(order_id=order.pk, amount="160.00")
    assert advance(run_of(refund)) == "suspended"

    # then carol is asked again, for version 2, and her approval pays it
    second = ApprovalRequest.objects.get(run_id=refund.run_id, status=ApprovalStatus.PENDING)
    assert second.version == "2"
    decide(second, by=users.carol, approve=True, version="2")
    advance(run_of(refund))
    assert provider.sent == [{"order": "7006", "amount": "150.00", "currency": "GBP"}]
