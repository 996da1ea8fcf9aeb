"""The admin page of a refund request shows the customer's status and in-flight operations."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from examples.refunds.services import order_create, refund_request_create
from ledger.models import ExternalOperation, OperationStatus


@pytest.mark.django_db
def test_refund_request_admin_page_lists_operations_needing_reconciliation(client: Client) -> None:
    alice = User.objects.create_user("alice")
    admin = User.objects.create_superuser("root", "root@example.com", "pw")
    order = order_create(number="9001", customer=alice, amount="50.00")
    # No worker here, and the enqueue waits for a commit this test never makes: the run stays queued.
    request, _ = refund_request_create(order=order, customer=alice, amount="10.00")
    ExternalOperation.objects.create(key=request.operation_key, system="payments", action="refund",
                                     status=OperationStatus.UNKNOWN, submit_count=1)
    client.force_login(admin)

    page = client.get(f"/admin/refunds/refundrequest/{request.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "outcome being checked" in text and request.operation_key in text
    assert client.get("/admin/refunds/refundrequest/").status_code == 200
    assert client.get("/admin/refunds/order/").status_code == 200
