"""The refund process end to end: real workers, PostgreSQL, Redis and the sandbox provider over HTTP."""

from __future__ import annotations

import io
import json
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db.models import F
from django.test import Client
from rest_framework.test import APIClient

from approvals import ApprovalRefused, RefusalCode, decide
from approvals.models import ApprovalRequest, ApprovalStatus
from examples.refunds.models import Order, RefundRequest
from examples.refunds.selectors import run_pending_operations
from examples.refunds.services import order_change
from examples.refunds.tests.conftest import World
from examples.refunds.tests.support import (
    ask,
    assert_confirmed,
    drain_lookup_faults,
    new_order,
    pending_approval,
    status_of,
    wait_status,
)
from ledger.models import ExternalOperation, OperationalRecord, OperationStatus
from tests.factories import Users
from tests.support import wait_for, wait_for_status, wait_for_terminal
from workflows import terminate
from workflows.models import StepResult

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_small_refund_needs_no_approval_and_is_recorded_without_personal_data(world: World, users: Users) -> None:
    order = new_order(users.alice, "1001", amount="80.00")
    request = ask(order, "20.00")

    assert_confirmed(request, world.sandbox)
    assert not ApprovalRequest.objects.filter(run_id=request.run_id).exists()
    record = OperationalRecord.objects.get(request_id=f"refund-request:{request.pk}")
    assert (record.tool, record.step, record.approval_pending) == ("payments.refund", "refund", False)
    assert record.run_id == request.run_id and record.observed_at is not None
    assert record.operation is not None and record.operation.key == request.operation_key
    text = json.dumps(record.response)
    assert "Baker Street" not in text and "NW1" not in text
    assert "shipping_address" not in record.response["order"]  # never copied out of the order
    assert record.response["provider"]["amount"] == "20.00"
    assert Order.objects.get(pk=order.pk).version == 2  # marking it refunded is a change


def test_large_refund_waits_for_approval_then_is_confirmed(world: World, users: Users) -> None:
    order = new_order(users.alice, "1042")
    request = ask(order, "120.00")

    approval = pending_approval(request)
    wait_status(request, "awaiting approval")
    assert approval.summary == "Refund £120.00 on order 1042"
    assert (approval.approvers, approval.version) == ("refund-approvers", "1")
    assert approval.content["refund_amount"] == "120.00"
    assert world.sandbox.stats()["refunds"] == 0

    decide(approval, by=users.carol, approve=True, version=approval.version)
    assert_confirmed(request, world.sandbox)


def test_rejected_refund_completes_as_rejected(world: World, users: Users) -> None:
    request = ask(new_order(users.alice, "1043"), "150.00")
    approval = pending_approval(request)
    decide(approval, by=users.carol, approve=False, version=approval.version, note="no")
    run = wait_for_terminal(request.run_id)  # type: ignore[arg-type]
    assert (run.status, run.result["outcome"]) == ("completed", "rejected")
    assert status_of(request) == "rejected"
    assert world.sandbox.stats()["refunds"] == 0


def test_timeout_leaves_outcome_unknown_until_reconcile_confirms_one_refund(world: World, users: Users) -> None:
    sandbox = world.sandbox
    # The provider stores the refund, then answers too late; its lookups fail until drained.
    request = ask(
        new_order(users.alice, "1100", "50.00"),
        "30.00",
        sandbox=sandbox,
        faults=(("timeout=3", "create", 1, ""), ("error", "lookup", 100, "")),
        retry_delay_seconds=0.2,
        check_interval_seconds=3,
    )
    key = request.operation_key

    wait_for(
        lambda: StepResult.objects.filter(run_id=request.run_id, name__startswith="check outcome").exists(),
        timeout=60,
        what="the run to check the outcome periodically",
    )
    assert ExternalOperation.objects.get(key=key).status == OperationStatus.UNKNOWN
    assert status_of(request) == "outcome being checked"

    drain_lookup_faults(sandbox, key)
    out = io.StringIO()
    call_command("reconcile", stdout=out)
    assert ExternalOperation.objects.get(key=key).status == OperationStatus.SUCCEEDED, out.getvalue()

    assert_confirmed(request, sandbox)


def test_worker_killed_inside_the_provider_call_refunds_once(world: World, users: Users) -> None:
    sandbox = world.sandbox
    # The provider takes 0.8 s before it stores the refund: long enough to kill the worker mid-call.
    request = ask(
        new_order(users.alice, "1200", "50.00"),
        "25.00",
        sandbox=sandbox,
        faults=(("delay=0.8", "create", 1, ""),),
        retry_delay_seconds=1,
    )
    key = request.operation_key
    wait_for(
        lambda: ExternalOperation.objects.filter(key=key, status=OperationStatus.SUBMITTED).exists(),
        timeout=40,
        interval=0.01,
        what="the refund to be in flight",
    )
    world.workers.replace()  # SIGKILL the process group, then a fresh worker (with beat)

    assert_confirmed(request, sandbox, timeout=90)
    op = ExternalOperation.objects.get(key=key)
    assert op.lookup_count >= 1  # recovery asked the provider before anything else


def test_an_order_change_supersedes_the_pending_approval_at_once(world: World, users: Users) -> None:
    sandbox = world.sandbox
    order = new_order(users.alice, "1300")
    request = ask(order, "150.00")
    first = pending_approval(request)
    assert first.version == "1"

    # the order changes while carol reviews version 1: her request is superseded in that commit
    order_change(order_id=order.pk, items=[{"sku": "KETTLE", "qty": 2}])
    assert ApprovalRequest.objects.get(pk=first.pk).status == ApprovalStatus.SUPERSEDED
    with pytest.raises(ApprovalRefused) as late:
        decide(first, by=users.carol, approve=True, version="1")  # her page still shows version 1
    assert late.value.code == RefusalCode.NOT_PENDING
    # the run asks again, for the version that is current
    second = pending_approval(request, version="2")
    assert second.replaces_id == first.pk and second.content["items"] == [{"sku": "KETTLE", "qty": 2}]
    assert status_of(request) == "awaiting approval"
    assert sandbox.stats()["refunds"] == 0  # nothing refunded on the old version

    decide(second, by=users.carol, approve=True, version="2")
    assert_confirmed(request, sandbox)


def test_approval_of_an_old_version_is_not_acted_on(world: World, users: Users) -> None:
    sandbox = world.sandbox
    order = new_order(users.alice, "1350")
    request = ask(order, "150.00")
    first = pending_approval(request)
    assert first.version == "1"

    # the order changes without the service (another system writing to the table), so nothing
    # supersedes the pending request; carol approves the version 1 her page shows
    Order.objects.filter(pk=order.pk).update(shipping_address={"street": "1 New Road"}, version=F("version") + 1)
    decide(first, by=users.carol, approve=True, version="1")
    # the workflow's re-check finds version 2, supersedes the approval and asks again
    second = pending_approval(request, version="2")
    first.refresh_from_db()
    assert first.status == ApprovalStatus.SUPERSEDED
    assert status_of(request) == "awaiting approval"
    with pytest.raises(ApprovalRefused):
        decide(second, by=users.carol, approve=True, version="1")  # stale page: refused
    assert sandbox.stats()["refunds"] == 0  # nothing refunded on the old version

    decide(second, by=users.carol, approve=True, version="2")
    assert_confirmed(request, sandbox)


def test_terminated_run_shows_its_in_flight_refund_until_reconciled(world: World, users: Users) -> None:
    sandbox = world.sandbox
    request = ask(
        new_order(users.alice, "1400", "50.00"),
        "10.00",
        sandbox=sandbox,
        faults=(("timeout=3", "create", 1, ""), ("error", "lookup", 100, "")),
        retry_delay_seconds=1,
    )
    key = request.operation_key
    wait_for(
        lambda: ExternalOperation.objects.filter(key=key, status=OperationStatus.UNKNOWN).exists(),
        timeout=40,
        what="the refund's outcome to be unknown",
    )
    terminate(request.run_id)  # type: ignore[arg-type]
    run = wait_for_status(request.run_id, "terminated")  # type: ignore[arg-type]

    assert [op.key for op in run_pending_operations(run)] == [key]
    assert status_of(request) == "outcome being checked"
    # the operation knows the run and step that performed it, and the run's page and its admin
    # page list it as needing reconciliation, for staff: not on the customer's page
    operation = ExternalOperation.objects.get(key=key)
    assert (operation.run_id, operation.step) == (run.id, "refund")
    alice, carol = Client(), Client()
    alice.force_login(users.alice)
    carol.force_login(users.carol)
    page = carol.get(f"/runs/{run.id}/").content.decode()
    admin_page = carol.get(f"/admin/workflows/workflowrun/{run.id}/change/").content.decode()
    for html in (page, admin_page):
        assert "External operations needing reconciliation" in html and key in html
    assert "External operations needing reconciliation" not in alice.get(f"/runs/{run.id}/").content.decode()

    drain_lookup_faults(sandbox, key)
    call_command("reconcile", stdout=io.StringIO())
    assert list(run_pending_operations(run)) == []
    assert status_of(request) == "confirmed"  # the money went out, though the run was stopped
    assert sandbox.stats()["refunds"] == 1
    assert "External operations needing reconciliation" not in carol.get(f"/runs/{run.id}/").content.decode()


def test_api_requests_a_refund_idempotently_and_shows_it_to_its_owner_only(world: World, users: Users) -> None:
    new_order(users.alice, "1500", "60.00")
    alice, mallory = APIClient(), APIClient()
    alice.force_authenticate(users.alice)
    mallory.force_authenticate(users.mallory)
    url = "/api/orders/1500/refunds"

    first = alice.post(url, {"amount": "15.00", "reason": "late"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 201, first.json()
    again = alice.post(url, {"amount": "15.00", "reason": "late"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])
    conflict = alice.post(url, {"amount": "16.00", "reason": "late"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "idempotency_conflict"
    too_much = alice.post(url, {"amount": "61.00"}, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert too_much.status_code == 409 and too_much.json()["error"]["code"] == "balance_exceeded"
    assert RefundRequest.objects.count() == 1

    refund_id = first.json()["id"]
    shown = alice.get(f"/api/refunds/{refund_id}")
    assert shown.status_code == 200
    assert shown.json()["order"] == "1500" and Decimal(shown.json()["amount"]) == Decimal("15.00")
    assert shown.json()["status"] in {"being prepared", "submitted", "confirmed"}
    assert mallory.get(f"/api/refunds/{refund_id}").status_code == 404
    assert mallory.post(url, {"amount": "1.00"}, format="json").status_code == 404
    assert APIClient().get(f"/api/refunds/{refund_id}").status_code == 401

    request = RefundRequest.objects.get(pk=refund_id)
    assert_confirmed(request, world.sandbox)
    assert alice.get(f"/api/refunds/{refund_id}").json()["status"] == "confirmed"
