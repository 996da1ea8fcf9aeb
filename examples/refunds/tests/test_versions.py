"""An order change racing with the workflow raising its approval request (threads on PostgreSQL):
the request never ends up pending for a version that is no longer the order's."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.types import Proposal
from approvals.waits import _create
from examples.refunds.models import Order
from examples.refunds.services import order_change, order_create, refund_request_create
from examples.refunds.workflows import order_proposal
from tests.factories import Users
from tests.fixtures import NoEnqueue

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
        try:
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
        finally:
            connection.close()

    def change() -> None:
        try:
            read.wait(10)
            order_change(order_id=order.pk, shipping_address={"street": "1 New Road"})
        finally:
            connection.close()

    # when the order changes in the middle of the request step
    threads = [threading.Thread(target=request_step), threading.Thread(target=change)]
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
