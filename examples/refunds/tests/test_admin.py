"""The admin page of a refund request shows the customer's status and in-flight operations."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.tests.support import waiting_request
from examples.refunds.models import Order, RefundRequest
from examples.refunds.services import (
    StaleOrder,
    order_change,
    order_create,
    refund_request_create,
)
from ledger.models import ExternalOperation, OperationStatus
from tests.factories import Users, login
from tests.support import thread_of
from workflows.models import RunEvent


@pytest.fixture
def admin(db: None) -> User:
    """A superuser: every admin page here is staff's."""
    return User.objects.create_superuser("root", "root@example.com", "pw")


@pytest.mark.django_db
def test_refund_request_admin_page_lists_operations_needing_reconciliation(admin: User, users: Users) -> None:
    alice = users.alice
    order = order_create(number="9001", customer=alice, amount="50.00")
    # No worker here, and the enqueue waits for a commit this test never makes: the run stays queued.
    request, _ = refund_request_create(order=order, customer=alice, amount="10.00")
    ExternalOperation.objects.create(
        key=request.operation_key, system="payments", action="refund", status=OperationStatus.UNKNOWN, submit_count=1
    )
    client = login(admin)

    page = client.get(f"/admin/refunds/refundrequest/{request.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "outcome being checked" in text and request.operation_key in text
    assert client.get("/admin/refunds/refundrequest/").status_code == 200
    assert client.get("/admin/refunds/order/").status_code == 200
    # the salt of its operation key, never shown on these pages, is never filtered on either
    assert client.get(f"/admin/refunds/refundrequest/?key_salt__startswith={request.key_salt[0]}").status_code == 400


@pytest.mark.django_db
def test_an_order_whose_json_is_nested_past_what_the_parser_reads_is_a_field_error(admin: User, users: Users) -> None:
    order = order_create(number="9003", customer=users.alice, amount="15.00", shipping_address={"street": "1 Road"})
    deep = "[" * 2000 + "]" * 2000
    form = {"amount": "15.00", "currency": "GBP", "status": "placed", "items": deep, "shipping_address": deep}

    refused = login(admin).post(f"/admin/refunds/order/{order.pk}/change/", {**form, "seen_version": "1"})

    assert refused.status_code == 200
    assert refused.content.decode().count("Nested more than 100 levels deep.") == 2
    order.refresh_from_db()
    assert (order.version, order.shipping_address) == (1, {"street": "1 Road"})


@pytest.mark.django_db
def test_an_order_edited_in_the_admin_gets_a_new_version_and_its_pending_approval_is_superseded(
    admin: User, users: Users
) -> None:
    # given an order whose refund waits for approval of its version 1
    alice = users.alice
    order = order_create(number="9002", customer=alice, amount="150.00", shipping_address={"street": "1 Old Road"})
    pending = waiting_request(subject_type="refunds.order", subject_id=str(order.pk), version="1")
    client = login(admin)
    url = f"/admin/refunds/order/{order.pk}/change/"
    form = {
        "amount": "150.00",
        "currency": "GBP",
        "status": "placed",
        "items": "[]",
        "shipping_address": '{"street": "1 New Road"}',
        "seen_version": "1",
    }
    assert 'name="seen_version" value="1"' in client.get(url).content.decode()

    # when staff change the address in the admin (number and customer are not editable)
    response = client.post(url, {**form, "number": "666", "customer": admin.pk})

    # then the change went through the service: a new version, and the approval of version 1 is
    # superseded in the same commit, with the event that wakes its run to ask again
    assert response.status_code == 302, response.content.decode()[:2000]
    order.refresh_from_db()
    assert (order.version, order.shipping_address, order.number, order.customer) == (
        2,
        {"street": "1 New Road"},
        "9002",
        alice,
    )
    assert ApprovalRequest.objects.get(pk=pending.pk).status == ApprovalStatus.SUPERSEDED
    assert RunEvent.objects.filter(run=pending.run, type=pending.event_type).count() == 1

    # and saving the form unchanged changes nothing
    assert client.post(url, {**form, "seen_version": "2"}).status_code == 302
    assert Order.objects.get(pk=order.pk).version == 2


@pytest.mark.django_db
def test_a_stale_order_page_is_refused_instead_of_undoing_a_newer_change(admin: User, users: Users) -> None:
    # given a page opened on version 1 of an order, which the refund workflow then marks refunded
    alice = users.alice
    order = order_create(number="9003", customer=alice, amount="50.00")
    client = login(admin)
    url = f"/admin/refunds/order/{order.pk}/change/"
    assert 'name="seen_version" value="1"' in client.get(url).content.decode()
    order_change(order_id=order.pk, status="refunded")

    # when staff save an address edit from that page, its status still showing "placed"
    response = client.post(
        url,
        {
            "amount": "50.00",
            "currency": "GBP",
            "status": "placed",
            "items": "[]",
            "shipping_address": '{"street": "1 New Road"}',
            "seen_version": "1",
        },
    )

    # then the save is refused and the order stays refunded: no second refund becomes possible
    assert response.status_code == 200
    assert "This order changed since the page was opened (it is now version 2)" in response.content.decode()
    order.refresh_from_db()
    assert (order.status, order.version, order.shipping_address) == ("refunded", 2, {})
    # and the service itself refuses a change made against an old version (the race after the form's check)
    with pytest.raises(StaleOrder):
        order_change(order_id=order.pk, expected_version=1, status="placed")
    assert Order.objects.get(pk=order.pk).status == "refunded"


@pytest.mark.django_db(transaction=True)
def test_an_order_changed_between_the_forms_check_and_the_save_is_a_form_error_and_not_logged(
    admin: User,
    monkeypatch: pytest.MonkeyPatch,
    users: Users,
) -> None:
    # given a page on version 1 of an order, and a change committed by someone else just after the
    # form's version check passed, before the admin saves (another connection: a real race)
    from django.contrib.admin.models import LogEntry

    from examples.refunds.admin import OrderForm

    alice = users.alice
    order = order_create(number="9004", customer=alice, amount="50.00")
    client = login(admin)
    url = f"/admin/refunds/order/{order.pk}/change/"
    checked = OrderForm.clean

    def clean_then_someone_else_changes_it(form: OrderForm) -> dict[str, Any]:
        data = checked(form)

        racer = thread_of(lambda: order_change(order_id=order.pk, expected_version=1, amount="40.00"))
        racer.start()
        racer.join()
        return data

    monkeypatch.setattr(OrderForm, "clean", clean_then_someone_else_changes_it)

    # when staff save an address edit from that page
    response = client.post(
        url,
        {
            "amount": "50.00",
            "currency": "GBP",
            "status": "placed",
            "items": "[]",
            "shipping_address": '{"street": "1 New Road"}',
            "seen_version": "1",
        },
    )

    # then the page is shown again with the refusal as the form's error, no success message
    assert response.status_code == 200
    page = response.content.decode()
    assert "Not saved: order 9004 changed since (it is now version 2)" in page
    assert "errornote" in page and "was changed successfully" not in page
    assert not [str(m) for m in get_messages(response.wsgi_request)]
    # and no change is logged, and the order holds the other change only
    assert not LogEntry.objects.filter(object_id=str(order.pk)).exists()
    order.refresh_from_db()
    assert (order.version, order.amount, order.shipping_address) == (2, Decimal("40.00"), {})


@pytest.mark.django_db
def test_a_successful_admin_edit_is_still_logged_and_reported(admin: User, users: Users) -> None:
    from django.contrib.admin.models import LogEntry

    alice = users.alice
    order = order_create(number="9005", customer=alice, amount="50.00")
    client = login(admin)

    response = client.post(
        f"/admin/refunds/order/{order.pk}/change/",
        {
            "amount": "45.00",
            "currency": "GBP",
            "status": "placed",
            "items": "[]",
            "shipping_address": "{}",
            "seen_version": "1",
        },
        follow=True,
    )

    assert "was changed successfully" in response.content.decode()
    assert LogEntry.objects.filter(object_id=str(order.pk)).count() == 1
    assert Order.objects.get(pk=order.pk).version == 2


@pytest.mark.django_db
def test_not_even_a_superuser_deletes_a_refund_request(admin: User, users: Users) -> None:
    """A request holds its order's money (or records that it was paid): deleting it would free the
    amount for another refund."""
    alice = users.alice
    order = order_create(number="9100", customer=alice, amount="50.00")
    request, _ = refund_request_create(order=order, customer=alice, amount="50.00")
    client = login(admin)

    page = client.get(f"/admin/refunds/refundrequest/{request.pk}/delete/")
    bulk = client.post(
        "/admin/refunds/refundrequest/",
        {"action": "delete_selected", "_selected_action": [str(request.pk)], "post": "yes"},
    )

    assert page.status_code == 403
    assert bulk.status_code in (200, 302)
    assert RefundRequest.objects.filter(pk=request.pk).exists()
