"""No order is refunded more than its amount, whatever the customer sends and whatever fails:
requests sent together, a request while another's outcome is unknown, a run stopped while its
refund was in flight, and a provider that answers "not found" while it is still working.

Every test counts what the sandbox provider really refunded, by its own list."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.apps import apps
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from accounts.services import account_ensure
from agents.models import Agent
from agents.selectors import agent_get
from approvals import ApprovalRefused, RefusalCode, decide
from approvals.models import ApprovalRequest, DecisionLog
from examples.refunds.models import Order, RefundRequest
from examples.refunds.selectors import order_balance
from examples.refunds.tests.conftest import World
from examples.refunds.tests.support import (
    ADDRESS,
    ask,
    assert_confirmed,
    drain_lookup_faults,
    new_order,
    pending_approval,
    reconcile,
    refunded_at_provider,
    run_of,
    status_of,
    unknown_refund,
)
from ledger.models import ExternalOperation, OperationalRecord, OperationStatus
from ledger.services import operation_resolve, record_purge
from ledger.services.common import may_still_arrive
from tests.factories import Users, api_login
from tests.support import race, wait_for, wait_for_status, wait_for_terminal
from workflows import terminate
from workflows.models import StepResult

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_two_requests_for_the_whole_order_sent_together_pay_once(world: World, users: Users) -> None:
    # given a £30 order and two API calls for all of it, sent at the same instant with different keys
    order = new_order(users.alice, "2001", "30.00")

    def ask_over_http() -> Any:
        client = api_login(users.alice, via="force")
        key = f"k-{id(client)}"
        return client.post("/api/orders/2001/refunds", {"amount": "30.00"}, format="json", HTTP_IDEMPOTENCY_KEY=key)

    # when
    answers = race(ask_over_http, n=2)

    # then one is accepted and the other refused (a conflict with the order's balance), saying what is
    # left: nothing, the first being in flight, or (on a loaded machine, where the second came after
    # the first had paid) that the order is refunded
    assert sorted(a.status_code for a in answers) == [201, 409], [a.content for a in answers]
    [refused] = [a for a in answers if a.status_code == 409]
    assert refused.json()["error"]["code"] == "balance_exceeded"
    nothing_left = "at most 0.00 of this order's 30.00 can still be refunded (0.00 refunded, 30.00 in requests still "
    assert refused.json()["error"]["detail"] in (
        {"amount": [nothing_left + "being handled)"]},
        {"order": ["this order is already refunded"]},
    )
    [request] = RefundRequest.objects.filter(order=order)
    assert_confirmed(request, world.sandbox)
    assert refunded_at_provider(world.sandbox, "2001") == Decimal("30.00")


def test_two_partial_requests_that_fit_both_pay(world: World, users: Users) -> None:
    order = new_order(users.alice, "2002", "50.00")
    first, second = ask(order, "20.00"), ask(order, "30.00")
    with pytest.raises(ValidationError):
        ask(order, "0.01")  # nothing is left
    for request in (first, second):
        run = wait_for_terminal(run_of(request))
        assert run.result is not None, run.error
        assert (run.status, run.result["outcome"]) == ("completed", "refunded")
    assert refunded_at_provider(world.sandbox, "2002") == Decimal("50.00")
    assert Order.objects.get(pk=order.pk).status == "refunded"


def test_a_request_while_another_is_unknown_counts_the_unknown_one(world: World, users: Users) -> None:
    # given £30 of a £50 order sent, its outcome unknown ("outcome being checked")
    first = unknown_refund(world, users.alice, "2003", "50.00", "30.00")
    assert status_of(first) == "outcome being checked"
    order = Order.objects.get(pk=first.order_id)

    # when the customer asks for the whole order again, then for what is really left
    with pytest.raises(ValidationError) as too_much:
        ask(order, "50.00")
    second = ask(order, "20.00")

    # then the unknown £30 counted: only £20 more was accepted, and the provider never paid more
    # than the order, once the first one's outcome is known
    assert "20.00" in str(too_much.value)
    assert_confirmed(second, world.sandbox, provider_refunds=2)
    drain_lookup_faults(world.sandbox, first.operation_key)
    reconcile()
    wait_for(lambda: status_of(first) == "confirmed", timeout=40, what="the first refund to be confirmed")
    assert refunded_at_provider(world.sandbox, "2003") == Decimal("50.00")


def test_a_terminated_run_whose_refund_reconciles_as_paid_still_counts(world: World, users: Users) -> None:
    # given a run terminated while its £30 refund's outcome was unknown, asked for in alice's chat
    first = unknown_refund(world, users.alice, "2004", "30.00", "30.00")
    account_ensure(slug="acme", members=[users.alice])
    agent = agent_get(user=users.alice, kind="support", name="help")
    assert agent is not None
    RefundRequest.objects.filter(pk=first.pk).update(agent=agent)
    terminate(run_of(first))
    wait_for_status(run_of(first), "terminated")
    assert chat_status(agent, first) == "outcome being checked"  # told by the termination's hook
    order = Order.objects.get(pk=first.order_id)
    with pytest.raises(ValidationError):
        ask(order, "30.00")  # unknown still counts

    # when reconcile learns the provider paid it
    drain_lookup_faults(world.sandbox, first.operation_key)
    reconcile()
    assert ExternalOperation.objects.get(key=first.operation_key).status == OperationStatus.SUCCEEDED

    # then asking again is refused: the order is refunded, though its run never said so
    with pytest.raises(ValidationError) as again:
        ask(order, "30.00")
    assert "already refunded" in str(again.value)
    assert order_balance(order=order).refunded == Decimal("30.00")
    assert refunded_at_provider(world.sandbox, "2004") == Decimal("30.00")
    # and the order says so, with the record a colleague needs, written when the outcome was settled
    assert Order.objects.get(pk=order.pk).status == "refunded"
    record = OperationalRecord.objects.get(request_id=f"refund-request:{first.pk}")
    assert record.operation is not None
    assert (record.step, record.run_id, record.operation.key) == ("reconcile", first.run_id, first.operation_key)
    assert status_of(first) == "confirmed"
    # and the chat it was asked in hears it, though its run never will tell it
    assert chat_status(agent, first) == "confirmed"


def chat_status(agent: Agent, request: RefundRequest) -> str | None:
    entry = Agent.objects.get(pk=agent.pk).state.get("refunds", {}).get(str(request.pk))
    return entry["status"] if isinstance(entry, dict) else None


def test_a_not_found_while_the_provider_still_processes_is_never_believed_for_an_ended_run(
    world: World,
    users: Users,
) -> None:
    sandbox = world.sandbox
    # given the provider takes 9 s before it stores the refund (our read timeout is 1 s, and a
    # "not found" is believed 5 s after the send), and the run is terminated as soon as the outcome
    # is unknown: nobody but reconcile will look again
    request = ask(
        new_order(users.alice, "2005", "30.00"),
        "30.00",
        sandbox=sandbox,
        faults=(("delay=9", "create", 1, ""),),
        retry_delay_seconds=30,
    )
    key = request.operation_key
    wait_for(
        lambda: ExternalOperation.objects.filter(key=key, status=OperationStatus.UNKNOWN).exists(),
        timeout=40,
        interval=0.02,
        what="the refund's outcome to be unknown",
    )
    terminate(run_of(request))

    # when reconcile asks while the provider is still working on it: "not found"
    output = reconcile()

    # then that is not believed: still unknown, still counted, and the customer is told so
    assert ExternalOperation.objects.get(key=key).status == OperationStatus.UNKNOWN, output
    assert "may still reach the provider" in ExternalOperation.objects.get(key=key).note
    assert status_of(request) == "outcome being checked"
    with pytest.raises(ValidationError):
        ask(Order.objects.get(pk=request.order_id), "30.00")

    # when reconcile asks again past the in-flight window, the provider still working: "not found"
    op = ExternalOperation.objects.get(key=key)
    wait_for(lambda: not may_still_arrive(op, now=timezone.now()), timeout=10, what="the in-flight window to pass")
    reconcile()

    # then still: its run has ended, nobody will send it again, and no "not found" proves it will
    # not arrive; it waits for the provider or a person, and still holds the order's money
    assert ExternalOperation.objects.get(key=key).status == OperationStatus.UNKNOWN
    assert "a person decides" in ExternalOperation.objects.get(key=key).note
    with pytest.raises(ValidationError):
        ask(Order.objects.get(pk=request.order_id), "30.00")

    # when the provider has done it, reconcile finds it
    wait_for(lambda: refunded_at_provider(sandbox, "2005") > 0, timeout=20, what="the provider to refund")
    reconcile()
    assert ExternalOperation.objects.get(key=key).status == OperationStatus.SUCCEEDED
    assert status_of(request) == "confirmed"
    assert refunded_at_provider(sandbox, "2005") == Decimal("30.00")
    assert sandbox.stats()["refunds"] == 1


def test_a_refund_approver_cannot_approve_a_refund_they_asked_for(world: World, users: Users) -> None:
    # given carol, a refund approver, asks for a refund on her own order
    carol = users.carol
    request = ask(new_order(carol, "2006", "300.00"), "150.00")
    approval = pending_approval(request)
    assert approval.requested_by_id == carol.pk

    # when she tries to approve it
    with pytest.raises(ApprovalRefused) as refused:
        decide(approval, by=carol, approve=True, version=approval.version)

    # then four eyes: refused, logged, nothing else changed and nothing paid
    assert refused.value.code == RefusalCode.FOUR_EYES
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "pending"
    assert DecisionLog.objects.filter(request=approval, code=RefusalCode.FOUR_EYES).count() == 1
    assert world.sandbox.stats()["refunds"] == 0


def stored_json(exclude: set[tuple[str, str]]) -> list[tuple[str, int, str]]:
    """Every JSON column of every model, as (model, pk, JSON text)."""
    rows = []
    for model in apps.get_models():
        fields = [
            f.name
            for f in model._meta.get_fields()
            if isinstance(f, models.JSONField) and (model._meta.label, f.name) not in exclude
        ]
        for values in model._default_manager.values("pk", *fields) if fields else []:
            pk = values.pop("pk")
            rows.append((model._meta.label, pk, json.dumps(values, default=str)))
    return rows


def test_no_personal_data_or_staff_note_is_stored_outside_the_order(world: World, users: Users) -> None:
    sandbox = world.sandbox
    # given a refund that needed an approval, and one whose outcome a person resolved with a note
    approved = ask(new_order(users.alice, "2007", "300.00"), "150.00")
    approval = pending_approval(approved)
    decide(
        approval,
        by=users.carol,
        approve=True,
        version=approval.version,
        note="STAFFNOTE internal: customer flagged for review",
    )
    assert_confirmed(approved, sandbox)
    by_hand = unknown_refund(world, users.alice, "2008", "30.00", "10.00")
    carol = users.carol
    carol.user_permissions.add(*_ledger_permissions())
    note = "Called the provider: paid, ref RF-1, customer on 07700 900123"
    operation_resolve(
        operation_id=ExternalOperation.objects.get(key=by_hand.operation_key).pk,
        outcome="succeeded",
        note=note,
        user=type(carol).objects.get(pk=carol.pk),
    )
    run = wait_for_terminal(run_of(by_hand), timeout=60)
    assert run.result is not None, run.error
    assert run.result["outcome"] == "refunded"

    # then the address is in the order's own column and nowhere else (step results, approvals,
    # records, events, run results ...), and the note stays with the operation's resolution
    leaks = [
        (label, pk)
        for label, pk, text in stored_json(exclude={("refunds.Order", "shipping_address")})
        if ADDRESS["street"] in text or ADDRESS["postcode"] in text
    ]
    assert leaks == []
    assert [(label, pk) for label, pk, text in stored_json(exclude=set()) if "07700" in text] == []
    # and neither the approver's note nor who approved reaches the customer's run
    assert [(label, pk) for label, pk, text in stored_json(exclude=set()) if "STAFFNOTE" in text] == []
    client = api_login(users.alice, via="force")
    alices_view = client.get(f"/api/runs/{approved.run_id}").content.decode()
    assert "STAFFNOTE" not in alices_view and "carol" not in alices_view
    assert "07700" not in client.get(f"/api/runs/{run.id}").content.decode()
    assert ExternalOperation.objects.get(key=by_hand.operation_key).resolution_note == note


def _ledger_permissions() -> list[Any]:
    from django.contrib.auth.models import Permission

    return list(Permission.objects.filter(codename__in=["view_externaloperation", "resolve_externaloperation"]))


def test_a_refund_run_started_for_someone_elses_request_touches_nothing(world: World, users: Users) -> None:
    """Even started behind the API's back (the API refuses: not public), a refund run only ever
    acts on its own request: mallory's run naming alice's request fails at once, having read
    nothing of alice's order into its steps and moved nothing."""
    from workflows.services import run_start

    # given alice's refund, waiting for an approval
    alices = ask(new_order(users.alice, "2009", "300.00"), "150.00")
    pending_approval(alices)

    # when mallory's own run names alice's request
    run, _ = run_start(workflow="refund", payload={"request_id": alices.pk, "order": "2009"}, owner=users.mallory)

    # then it fails on its first step, which stored nothing of alice's
    done = wait_for_terminal(run.id)
    assert done.error is not None, done.status
    assert done.status == "failed" and "belongs to another run" in done.error["message"]
    assert not StepResult.objects.filter(run=run, status="completed").exists()
    assert status_of(alices) == "awaiting approval"
    assert world.sandbox.stats()["refunds"] == 0


def test_splitting_a_refund_below_the_approval_limit_still_needs_a_reviewer(world: World, users: Users) -> None:
    # given £100 of a £300 order refunded without approval (the limit is £100 an order)
    order = new_order(users.alice, "2010", "300.00")
    first = ask(order, "100.00")
    assert_confirmed(first, world.sandbox)
    assert not ApprovalRequest.objects.filter(run_id=first.run_id).exists()

    # when she asks for another £100
    second = ask(order, "100.00")

    # then it waits for a reviewer: the order's refunds would come to £200
    approval = pending_approval(second)
    assert approval.content is not None
    assert approval.content["already_refunded"] == "100.00"
    assert refunded_at_provider(world.sandbox, "2010") == Decimal("100.00")


def test_a_retry_sent_with_the_original_answers_with_the_same_request(world: World, users: Users) -> None:
    # given a £50 order and one request for all of it, sent twice at once with one Idempotency-Key
    new_order(users.alice, "2011", "50.00")

    def ask_over_http() -> Any:
        client = api_login(users.alice, via="force")
        return client.post(
            "/api/orders/2011/refunds", {"amount": "50.00"}, format="json", HTTP_IDEMPOTENCY_KEY="retry-1"
        )

    # when
    answers = race(ask_over_http, n=2)

    # then the one that waited for the order's lock answers with the request the other created
    assert sorted(a.status_code for a in answers) == [200, 201], [a.content for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert RefundRequest.objects.filter(order__number="2011").count() == 1


def test_a_run_restarted_after_another_request_took_the_money_ends_refused(world: World, users: Users) -> None:
    sandbox = world.sandbox
    # given alice's £150 refund awaiting approval, its run terminated (its hold released), and a
    # second request for the whole order that was then paid
    order = new_order(users.alice, "2012", "150.00")
    first = ask(order, "150.00")
    pending_approval(first)
    terminate(run_of(first))
    wait_for_status(run_of(first), "terminated")
    second = ask(order, "150.00")
    approval = pending_approval(second)
    decide(approval, by=users.carol, approve=True, version=approval.version)
    assert_confirmed(second, sandbox)

    # when staff restart the first run
    from workflows import restart

    restart(run_of(first))

    # then its policy check refuses it: an outcome, not a failed run, and nothing more is paid
    run = wait_for_terminal(run_of(first))
    assert run.result is not None, run.error
    assert (run.status, run.result["outcome"]) == ("completed", "failed"), run.error
    assert "can still refund (0.00 of 150.00)" in run.result["reason"]
    assert refunded_at_provider(sandbox, "2012") == Decimal("150.00")


@pytest.mark.parametrize("purged", [False, True], ids=["its record kept", "its record purged"])
def test_a_finished_refund_run_restarted_records_its_refund_once(world: World, users: Users, purged: bool) -> None:
    """However long after: purge_records deletes the operational record by age, and a run restarted
    after that once recorded the refund again and changed the order again."""
    from workflows import restart

    # given a refund confirmed and recorded (and its record purged since)
    order = new_order(users.alice, "2014", "80.00")
    request = ask(order, "20.00")
    assert_confirmed(request, world.sandbox)
    version = Order.objects.get(pk=order.pk).version
    if purged:
        # (the retention period passed: purged as `purge_records` would, 90 days on)
        assert record_purge(older_than=timedelta(days=90), now=timezone.now() + timedelta(days=91)).count == 1

    # when staff restart its finished run
    restart(run_of(request))

    # then the run ends refunded again from what is stored: one provider refund, one record, and
    # the order not changed again
    run = wait_for_terminal(run_of(request), timeout=60)
    assert run.result is not None, run.error
    assert (run.status, run.result["outcome"]) == ("completed", "refunded"), run.error
    assert world.sandbox.stats()["refunds"] == 1
    assert OperationalRecord.objects.filter(request_id=f"refund-request:{request.pk}").count() == (0 if purged else 1)
    assert Order.objects.get(pk=order.pk).version == version


def test_a_restarted_run_continues_the_refund_its_earlier_attempt_sent(world: World, users: Users) -> None:
    """Its money is already committed: the run neither checks the balance nor asks for an approval
    again (the other request on the order would now make it need one), it finds out what became
    of the refund it sent, and records it."""
    from workflows import restart

    sandbox = world.sandbox
    # given £100 of a £150 order sent to a provider that takes 5 s, its run terminated while the
    # outcome is unknown (its next try 8 s away), and another £50 asked for meanwhile
    order = new_order(users.alice, "2013", "150.00")
    first = ask(order, "100.00", sandbox=sandbox, faults=(("delay=5", "create", 1, ""),), retry_delay_seconds=8)
    wait_for(
        lambda: ExternalOperation.objects.filter(key=first.operation_key, status=OperationStatus.UNKNOWN).exists(),
        timeout=40,
        interval=0.02,
        what="the refund's outcome to be unknown",
    )
    terminate(run_of(first))
    wait_for_status(run_of(first), "terminated")
    second = ask(order, "50.00")
    pending_approval(second)  # £150 in all: it needs a reviewer

    # when staff restart the first run
    restart(run_of(first))

    # then it carries on with the refund it sent: no second approval, the provider's answer recorded
    run = wait_for_terminal(run_of(first), timeout=90)
    assert run.result is not None, run.error
    assert (run.status, run.result["outcome"]) == ("completed", "refunded"), run.error
    assert not ApprovalRequest.objects.filter(run_id=first.run_id).exists()
    assert status_of(first) == "confirmed"
    assert OperationalRecord.objects.filter(request_id=f"refund-request:{first.pk}").count() == 1
    # (the order changed as the first refund was recorded: the second's approval is asked again)
    second_approval = pending_approval(second, version=str(Order.objects.get(pk=order.pk).version))
    decide(second_approval, by=users.carol, approve=True, version=second_approval.version)
    assert_confirmed(second, sandbox, provider_refunds=2)
    assert Order.objects.get(pk=order.pk).status == "refunded"
    assert refunded_at_provider(sandbox, "2013") == Decimal("150.00")
