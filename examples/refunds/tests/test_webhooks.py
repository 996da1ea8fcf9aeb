"""The payment provider's outcome webhook settles a refund whose outcome was unknown, as reconcile
would, and the waiting run goes on; a webhook and a reconcile racing settle it once; reconcile
finding the refund never received wakes the run to send it again.

Real sandbox provider, real workers (the refund tests' world); the webhook is posted through
Django's test client to a source configured for the test."""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import quote

import pytest
from django.test import Client
from django.utils import timezone

from examples.refunds.models import RefundRequest
from examples.refunds.tests.conftest import World
from examples.refunds.tests.support import (
    ask,
    assert_confirmed,
    drain_lookup_faults,
    new_order,
    reconcile,
    run_of,
    status_of,
    unknown_refund,
)
from examples.sandbox.process import SandboxProcess
from ledger.conf import in_flight_window
from ledger.models import ExternalOperation, OperationalRecord, OperationEvent, OperationStatus
from tests.factories import Users
from tests.support import thread_of, wait_for
from webhooks.models import WebhookDelivery
from webhooks.tests.support import SOURCES, encode, outcome_event, standard_headers
from workflows.models import StepResult, WorkflowRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(autouse=True)
def sources(settings: Any) -> None:
    settings.WEBHOOK_SOURCES = SOURCES


def waiting_for_outcome(request: RefundRequest) -> bool:
    run = WorkflowRun.objects.get(pk=run_of(request))
    return run.status == "waiting" and run.wait_event_type.startswith("ledger:settled:")


def provider_record(sandbox: SandboxProcess, key: str) -> dict[str, Any]:
    """The provider's own record of the refund (its list: lookups of the key are failing)."""
    status, body = sandbox.request("GET", "/v1/refunds")
    assert status == 200, body
    [record] = [r for r in body["refunds"] if r["key"] == key]
    return dict(record)


def post_outcome(event_id: str, event: dict[str, Any]) -> Any:
    body = encode(event)
    headers = standard_headers(body, event_id)
    return Client().post("/webhooks/sandbox/", data=body, content_type="application/json", headers=headers)


def settled_events(op: ExternalOperation) -> int:
    """How many times the operation was moved to a final state (one outcome: once)."""
    return (
        OperationEvent.objects.filter(operation=op, status_after__in=[OperationStatus.SUCCEEDED, "failed"])
        .exclude(status_before__in=[OperationStatus.SUCCEEDED, "failed"])
        .count()
    )


def test_the_providers_webhook_settles_an_unknown_refund_and_wakes_the_run(world: World, users: Users) -> None:
    # given a refund the provider made, whose answer was lost and whose lookups fail, and whose run
    # waits ten minutes between checks (after its refund step's retries, 3.1 s in all)
    request = unknown_refund(world, users.alice, "2101", "50.00", "30.00", check_interval=600, retry_delay=0.1)
    wait_for(lambda: waiting_for_outcome(request), timeout=30, what="the run to wait for the refund's outcome")
    assert status_of(request) == "outcome being checked"
    record = provider_record(world.sandbox, request.operation_key)

    # when the provider's webhook says it succeeded
    response = post_outcome("evt_2101", {"type": "refund.succeeded", "data": record})

    # then it is accepted and the operation is settled at once, recorded as reconcile would
    assert response.status_code == 202, response.content
    op = ExternalOperation.objects.get(key=request.operation_key)
    assert op.status == OperationStatus.SUCCEEDED
    assert op.response is not None and op.response["key"] == request.operation_key
    assert "reported by webhook sandbox" in op.note
    assert settled_events(op) == 1
    delivery = WebhookDelivery.objects.get(pk=response.json()["delivery"])
    assert delivery.operation_key == request.operation_key
    assert delivery.result is not None
    assert (delivery.result["changed"], delivery.result["before"], delivery.result["after"]) == (
        True,
        "unknown",
        "succeeded",
    )
    # and the waiting run is woken at once (not ten minutes later): confirmed, one refund at the
    # provider, one record
    assert_confirmed(request, world.sandbox, timeout=20)
    woken = StepResult.objects.get(run_id=request.run_id, name="wait for the outcome")
    assert woken.status == "completed"  # the event came; a timeout would have failed the wait
    assert OperationalRecord.objects.filter(request_id=f"refund-request:{request.pk}").count() == 1

    # and the provider sending its webhook again (another event id) is accepted and changes nothing
    again = post_outcome("evt_2101_again", {"type": "refund.succeeded", "data": record})
    assert again.status_code == 202
    result = WebhookDelivery.objects.get(pk=again.json()["delivery"]).result
    assert result is not None and result["changed"] is False and "already succeeded" in result["note"]
    assert settled_events(ExternalOperation.objects.get(pk=op.pk)) == 1
    drain_lookup_faults(world.sandbox, request.operation_key)


def test_reconcile_finding_a_refund_never_received_wakes_the_run_to_send_it_again(world: World, users: Users) -> None:
    # given a refund whose send failed (500, nothing done) and whose lookups fail meanwhile, so that
    # its run, past its refund step's retries, waits ten minutes before checking again
    request = ask(
        new_order(users.alice, "2102", "50.00"),
        "30.00",
        sandbox=world.sandbox,
        faults=(("error", "create", 1, ""), ("error", "lookup", 100, "")),
        retry_delay_seconds=0.1,
        check_interval_seconds=600,
    )
    wait_for(lambda: waiting_for_outcome(request), timeout=30, what="the run to wait for the refund's outcome")
    op = ExternalOperation.objects.get(key=request.operation_key)
    assert op.status == OperationStatus.UNKNOWN and world.sandbox.stats()["refunds"] == 0
    # the provider answers lookups again, and the send can no longer be on its way
    for _ in range(200):
        if world.sandbox.request("GET", f"/v1/refunds?key={quote(op.key, safe='')}")[0] == 404:
            break
    assert op.submitted_at is not None
    believed = op.submitted_at + in_flight_window()
    wait_for(lambda: timezone.now() > believed, timeout=30, what="the in-flight window to pass")

    # when reconcile finds the provider never received it
    output = reconcile()

    # then it says so, and the waiting run sends it again now, not ten minutes later: one refund
    assert "safe to send again" in output
    assert_confirmed(request, world.sandbox, timeout=30)
    woken = StepResult.objects.filter(run_id=request.run_id, name="wait for the outcome").first()
    assert woken is not None and woken.status == "completed"  # the knock came; a timeout would have failed it


def test_a_webhook_for_a_key_nobody_knows_is_accepted_and_changes_nothing(world: World) -> None:
    response = post_outcome("evt_nobody", outcome_event("refund:nobody:0", "succeeded"))
    assert response.status_code == 202
    delivery = WebhookDelivery.objects.get()
    assert delivery.result == {"changed": False, "note": "no operation of payments has this key"}
    assert ExternalOperation.objects.count() == 0


def test_a_webhook_and_reconcile_racing_settle_the_refund_once(world: World, users: Users) -> None:
    # given an unknown refund whose lookups work again: reconcile and the webhook both know the answer
    request = unknown_refund(world, users.alice, "2102", "50.00", "30.00")
    drain_lookup_faults(world.sandbox, request.operation_key)
    record = provider_record(world.sandbox, request.operation_key)
    barrier = threading.Barrier(2)
    answers: dict[str, Any] = {}

    def webhook() -> None:
        barrier.wait()
        answers["webhook"] = post_outcome("evt_2102", {"type": "refund.succeeded", "data": record})

    def reconciling() -> None:
        barrier.wait()
        answers["reconcile"] = reconcile()

    # when both run at the same instant
    threads = [thread_of(webhook), thread_of(reconciling)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    # then one of them settled it, once; the other found it settled and changed nothing
    assert answers["webhook"].status_code == 202, answers["webhook"].content
    op = ExternalOperation.objects.get(key=request.operation_key)
    assert op.status == OperationStatus.SUCCEEDED
    assert settled_events(op) == 1
    result = WebhookDelivery.objects.get().result
    assert result is not None
    webhook_won = result["changed"]
    assert ("reported by webhook sandbox" in op.note) is webhook_won
    # and the run goes on once: one refund, one record, confirmed
    assert_confirmed(request, world.sandbox)
    assert OperationalRecord.objects.filter(request_id=f"refund-request:{request.pk}").count() == 1
    assert RefundRequest.objects.get(pk=request.pk).run_id is not None
