"""The refund process end to end: real workers, PostgreSQL, Redis and the sandbox provider over HTTP."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.db import transaction
from django.db.models import F

from approvals import ApprovalRefused, RefusalCode, decide
from approvals.models import ApprovalRequest, ApprovalStatus
from examples.refunds.models import Order, RefundRequest
from examples.refunds.selectors import run_pending_operations
from examples.refunds.services import order_change, refund_request_create
from examples.refunds.tests.conftest import World
from examples.refunds.tests.support import (
    ask,
    assert_confirmed,
    drain_lookup_faults,
    new_order,
    operation_reaches,
    pending_approval,
    reconcile,
    refunded_at_provider,
    run_of,
    status_of,
    wait_status,
)
from ledger.models import ExternalOperation, OperationalRecord, OperationStatus
from tests.factories import Users, api_login, login
from tests.support import wait_for, wait_for_status, wait_for_terminal
from workflows import terminate
from workflows.models import StepResult, WorkflowRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# The provider stores the refund, then answers too late; its lookups fail until drained.
ANSWER_LOST = (("timeout=3", "create", 1, ""), ("error", "lookup", 100, ""))
NEEDS_RECONCILIATION = "External operations needing reconciliation"


def checks_the_outcome(request: RefundRequest) -> None:
    """Wait until the refund's run has started checking the outcome of its refund periodically."""
    wait_for(
        lambda: StepResult.objects.filter(run_id=request.run_id, name__startswith="check outcome").exists(),
        timeout=60,
        what="the run to check the outcome periodically",
    )


def terminated(request: RefundRequest) -> WorkflowRun:
    terminate(run_of(request))
    return wait_for_status(run_of(request), "terminated")


def lists_for_reconciliation(html: str, key: str) -> bool:
    return NEEDS_RECONCILIATION in html and key in html


def test_small_refund_needs_no_approval_and_is_confirmed(world: World, users: Users) -> None:
    # given an £80 order
    order = new_order(users.alice, "1001", amount="80.00")

    # when alice asks for £20 of it back, under the approval limit
    request = ask(order, "20.00")

    # then the provider refunds it without anyone approving it, and the order is marked refunded
    assert_confirmed(request, world.sandbox)
    assert not ApprovalRequest.objects.filter(run_id=request.run_id).exists()
    assert Order.objects.get(pk=order.pk).version == 2  # marking it refunded is a change


def test_a_request_is_paid_where_the_provider_holds_another_databases_refund_under_its_number(
    world: World, users: Users
) -> None:
    # given a request for £10 of an order, and the provider holding a refund of £10 of an order of
    # that number under the key of the same request number: another database's (a fresh one, or a
    # backup restored, numbers its requests again), made before this request's run can start
    order = new_order(users.alice, "1060", amount="50.00")
    with transaction.atomic():
        request, _ = refund_request_create(order=order, customer=users.alice, amount="10.00", reason="broken")
        earlier = f"refund:1060:{request.pk}"
        body = {"order": "1060", "amount": "10.00", "currency": "GBP"}
        status, _answer = world.sandbox.request("POST", "/v1/refunds", body, headers={"Idempotency-Key": earlier})
        assert status == 201, _answer

    # then this request's key is its own (the request's salt after its number), and the provider
    # refunds it: a second refund on order 1060, not the first one's record taken as this one's
    assert request.operation_key.startswith(f"{earlier}:") and len(request.key_salt) == 12
    assert_confirmed(request, world.sandbox, provider_refunds=2)
    assert refunded_at_provider(world.sandbox, "1060") == Decimal("20.00")


def test_refund_is_recorded_without_personal_data(world: World, users: Users) -> None:
    # given an order shipped to an address
    order = new_order(users.alice, "1001", amount="80.00")

    # when a refund on it is made
    request = ask(order, "20.00")
    assert_confirmed(request, world.sandbox)

    # then its record ties the run, the step and the operation to what the provider answered
    record = OperationalRecord.objects.get(request_id=f"refund-request:{request.pk}")
    assert (record.tool, record.step, record.approval_pending) == ("payments.refund", "refund", False)
    assert record.run_id == request.run_id and record.observed_at is not None
    assert record.operation is not None and record.operation.key == request.operation_key
    assert record.response is not None
    assert record.response["provider"]["amount"] == "20.00"
    # and holds nothing of the address
    assert "Baker Street" not in json.dumps(record.response) and "NW1" not in json.dumps(record.response)
    assert "shipping_address" not in record.response["order"]  # never copied out of the order


def test_large_refund_waits_for_approval_then_is_confirmed(world: World, users: Users) -> None:
    # given a £120 refund asked for, above the approval limit
    request = ask(new_order(users.alice, "1042"), "120.00")

    # when its run gets that far, then it waits for the refund approvers, with nothing refunded
    approval = pending_approval(request)
    wait_status(request, "awaiting approval")
    assert approval.summary == "Refund £120.00 on order 1042"
    assert (approval.approvers, approval.version) == ("refund-approvers", "1")
    assert approval.content is not None
    assert approval.content["refund_amount"] == "120.00"
    assert world.sandbox.stats()["refunds"] == 0

    # when carol approves it
    decide(approval, by=users.carol, approve=True, version=approval.version)

    # then the refund is made
    assert_confirmed(request, world.sandbox)


def test_rejected_refund_completes_as_rejected(world: World, users: Users) -> None:
    # given a £150 refund waiting for approval
    request = ask(new_order(users.alice, "1043"), "150.00")
    approval = pending_approval(request)

    # when carol rejects it
    decide(approval, by=users.carol, approve=False, version=approval.version, note="no")

    # then the run completes with that outcome, and nothing is refunded
    run = wait_for_terminal(run_of(request))
    assert run.result is not None, run.error
    assert (run.status, run.result["outcome"]) == ("completed", "rejected")
    assert status_of(request) == "rejected"
    assert world.sandbox.stats()["refunds"] == 0


def test_timeout_leaves_outcome_unknown_until_reconcile_confirms_one_refund(world: World, users: Users) -> None:
    # given a refund whose answer the provider loses
    request = ask(
        new_order(users.alice, "1100", "50.00"),
        "30.00",
        sandbox=world.sandbox,
        faults=ANSWER_LOST,
        retry_delay_seconds=0.2,
        check_interval_seconds=3,
    )

    # when the call times out, then the outcome is unknown and the run checks it from time to time
    checks_the_outcome(request)
    assert ExternalOperation.objects.get(key=request.operation_key).status == OperationStatus.UNKNOWN
    assert status_of(request) == "outcome being checked"

    # when the provider answers lookups again and reconcile runs
    drain_lookup_faults(world.sandbox, request.operation_key)
    output = reconcile()

    # then it finds the refund the provider made, and the run confirms that one refund
    assert ExternalOperation.objects.get(key=request.operation_key).status == OperationStatus.SUCCEEDED, output
    assert_confirmed(request, world.sandbox)


def test_worker_killed_inside_the_provider_call_refunds_once(world: World, users: Users) -> None:
    # given a refund in flight at a provider that takes 0.8 s before it stores it
    request = ask(
        new_order(users.alice, "1200", "50.00"),
        "25.00",
        sandbox=world.sandbox,
        faults=(("delay=0.8", "create", 1, ""),),
        retry_delay_seconds=1,
    )
    operation_reaches(request, OperationStatus.SUBMITTED, interval=0.01)

    # when the worker is killed mid-call (SIGKILL to its process group) and a fresh one starts
    world.workers.replace()

    # then the refund is made once, recovery having asked the provider before anything else
    assert_confirmed(request, world.sandbox, timeout=90)
    assert ExternalOperation.objects.get(key=request.operation_key).lookup_count >= 1


def test_an_order_change_supersedes_the_pending_approval_at_once(world: World, users: Users) -> None:
    # given a refund whose approval of the order's version 1 is pending
    order = new_order(users.alice, "1300")
    request = ask(order, "150.00")
    first = pending_approval(request)
    assert first.version == "1"

    # when the order changes while carol reviews version 1
    order_change(order_id=order.pk, items=[{"sku": "KETTLE", "qty": 2}])

    # then her request is superseded in that commit, and approving it from her page is refused
    assert ApprovalRequest.objects.get(pk=first.pk).status == ApprovalStatus.SUPERSEDED
    with pytest.raises(ApprovalRefused) as late:
        decide(first, by=users.carol, approve=True, version="1")
    assert late.value.code == RefusalCode.NOT_PENDING
    # and the run asks again, for the version that is current, with nothing refunded on the old one
    second = pending_approval(request, version="2")
    assert second.content is not None
    assert second.replaces_id == first.pk and second.content["items"] == [{"sku": "KETTLE", "qty": 2}]
    assert status_of(request) == "awaiting approval"
    assert world.sandbox.stats()["refunds"] == 0

    # when carol approves version 2, then the refund is made
    decide(second, by=users.carol, approve=True, version="2")
    assert_confirmed(request, world.sandbox)


def test_approval_of_an_old_version_is_not_acted_on(world: World, users: Users) -> None:
    # given a refund whose approval of the order's version 1 is pending
    order = new_order(users.alice, "1350")
    request = ask(order, "150.00")
    first = pending_approval(request)
    assert first.version == "1"

    # when the order changes without the service (another system writing to the table), so that
    # nothing supersedes the pending request, and carol approves the version 1 her page shows
    Order.objects.filter(pk=order.pk).update(shipping_address={"street": "1 New Road"}, version=F("version") + 1)
    decide(first, by=users.carol, approve=True, version="1")

    # then the workflow's re-check finds version 2, supersedes the approval and asks again
    second = pending_approval(request, version="2")
    first.refresh_from_db()
    assert first.status == ApprovalStatus.SUPERSEDED
    assert status_of(request) == "awaiting approval"
    # and a stale page is refused there too, with nothing refunded on the old version
    with pytest.raises(ApprovalRefused):
        decide(second, by=users.carol, approve=True, version="1")
    assert world.sandbox.stats()["refunds"] == 0

    # when carol approves version 2, then the refund is made
    decide(second, by=users.carol, approve=True, version="2")
    assert_confirmed(request, world.sandbox)


def test_terminated_run_shows_its_in_flight_refund_until_reconciled(world: World, users: Users) -> None:
    # given a refund whose outcome is unknown
    request = ask(
        new_order(users.alice, "1400", "50.00"),
        "10.00",
        sandbox=world.sandbox,
        faults=ANSWER_LOST,
        retry_delay_seconds=1,
    )
    key = request.operation_key
    operation_reaches(request, OperationStatus.UNKNOWN)

    # when staff terminate its run
    run = terminated(request)

    # then the run still has the refund in flight, tied to the step that sent it
    assert [op.key for op in run_pending_operations(run)] == [key]
    assert status_of(request) == "outcome being checked"
    operation = ExternalOperation.objects.get(key=key)
    assert (operation.run_id, operation.step) == (run.id, "refund")
    # and staff see it listed for reconciliation on the run's page and its admin page; alice does not
    alice, carol = login(users.alice), login(users.carol)
    assert lists_for_reconciliation(carol.get(f"/runs/{run.id}/").content.decode(), key)
    assert lists_for_reconciliation(carol.get(f"/admin/workflows/workflowrun/{run.id}/change/").content.decode(), key)
    assert NEEDS_RECONCILIATION not in alice.get(f"/runs/{run.id}/").content.decode()

    # when the provider answers lookups again and reconcile runs
    drain_lookup_faults(world.sandbox, key)
    reconcile()

    # then the money went out, though the run was stopped, and nothing is left to reconcile
    assert list(run_pending_operations(run)) == []
    assert status_of(request) == "confirmed"
    assert world.sandbox.stats()["refunds"] == 1
    assert NEEDS_RECONCILIATION not in carol.get(f"/runs/{run.id}/").content.decode()


def test_api_requests_a_refund_idempotently(world: World, users: Users) -> None:
    # given a £60 order of alice's
    new_order(users.alice, "1500", "60.00")
    alice, url = api_login(users.alice, via="force"), "/api/orders/1500/refunds"

    # when she asks for £15 back, then sends the same request again, then another under its key
    first = alice.post(url, {"amount": "15.00", "reason": "late"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    again = alice.post(url, {"amount": "15.00", "reason": "late"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    conflict = alice.post(url, {"amount": "16.00", "reason": "late"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    too_much = alice.post(url, {"amount": "61.00"}, format="json", HTTP_IDEMPOTENCY_KEY="k-2")

    # then the first creates the request, the same one again answers with it, another body under the
    # key is a conflict, and more than the order is refused: one request, refunded once
    assert first.status_code == 201, first.json()
    assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "idempotency_conflict"
    assert too_much.status_code == 409 and too_much.json()["error"]["code"] == "balance_exceeded"
    assert RefundRequest.objects.count() == 1
    assert_confirmed(RefundRequest.objects.get(), world.sandbox)


def test_api_shows_a_refund_to_its_owner_only(world: World, users: Users) -> None:
    # given alice's £15 refund on a £60 order, asked for through the API
    new_order(users.alice, "1500", "60.00")
    alice, mallory, url = (
        api_login(users.alice, via="force"),
        api_login(users.mallory, via="force"),
        "/api/orders/1500/refunds",
    )
    created = alice.post(url, {"amount": "15.00", "reason": "late"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    refund_id = created.json()["id"]

    # when alice, mallory and someone signed in as nobody look at it
    shown = alice.get(f"/api/refunds/{refund_id}")

    # then alice sees it; mallory can neither see it nor ask for a refund on the order; nobody is a 401
    assert shown.status_code == 200
    assert shown.json()["order"] == "1500" and Decimal(shown.json()["amount"]) == Decimal("15.00")
    assert shown.json()["status"] in {"being prepared", "submitted", "confirmed"}
    assert mallory.get(f"/api/refunds/{refund_id}").status_code == 404
    assert mallory.post(url, {"amount": "1.00"}, format="json").status_code == 404
    assert api_login(None).get(f"/api/refunds/{refund_id}").status_code == 401
    # and once the refund is made, she sees it confirmed
    assert_confirmed(RefundRequest.objects.get(pk=refund_id), world.sandbox)
    assert alice.get(f"/api/refunds/{refund_id}").json()["status"] == "confirmed"
