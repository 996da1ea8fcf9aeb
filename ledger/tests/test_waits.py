"""Whoever settles an operation wakes the run waiting for its outcome (``ledger.waits``); nobody else
can send that event. The refund example's test_webhooks.py shows a real run woken by a webhook."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import transaction

from ledger.adapters import Succeeded
from ledger.models import ExternalOperation, OperationStatus
from ledger.services import operation_reconcile, operation_report
from ledger.tests.provider import FakeProvider
from ledger.tests.support import make_operation
from ledger.waits import outcome_event_type, wake_waiting_run
from tests.fixtures import NoEnqueue
from workflows import services as workflow_services
from workflows.context import in_step
from workflows.exceptions import InvalidPayload
from workflows.models import RunEvent, WorkflowRun

pytestmark = pytest.mark.django_db


def a_run() -> WorkflowRun:
    run, _ = workflow_services.run_start(workflow="test.echo", payload={})
    return run


def test_a_report_that_settles_the_operation_sends_its_run_the_event_once(no_enqueue: NoEnqueue) -> None:
    run = a_run()
    op = make_operation("refund:1", run=run)

    with transaction.atomic():
        operation_report(key="refund:1", system="payments", outcome=Succeeded(response={}), reported_by="webhook")
    with transaction.atomic():  # settled already: changes nothing, sends nothing
        operation_report(key="refund:1", system="payments", outcome=Succeeded(response={}), reported_by="webhook")

    [event] = RunEvent.objects.filter(run=run)
    assert (event.type, event.idempotency_key, event.payload) == (outcome_event_type(op.key),) * 2 + ({},)
    assert event.consumed_at is None  # kept for the run's next wait


def test_nothing_is_sent_for_the_runs_own_step_an_operation_without_a_run_or_an_ended_run(
    no_enqueue: NoEnqueue,
) -> None:
    run = a_run()
    own = make_operation("refund:own", OperationStatus.SUCCEEDED, run=run)
    with in_step(run.id, attempt=1, step="refund"):
        wake_waiting_run(own)  # the run itself read the answer
    wake_waiting_run(make_operation("refund:none", OperationStatus.SUCCEEDED))
    workflow_services.run_terminate(run_id=run.id)
    wake_waiting_run(make_operation("refund:late", OperationStatus.SUCCEEDED, run=run))

    assert not RunEvent.objects.filter(run=run).exists()


def test_only_the_ledger_sends_its_events(no_enqueue: NoEnqueue) -> None:
    run = a_run()

    with pytest.raises(InvalidPayload, match="reserved"):
        workflow_services.run_send_event(run_id=run.id, type=outcome_event_type("refund:1"))


def test_a_long_key_gets_an_event_type_that_fits() -> None:
    long = outcome_event_type("k" * 255)

    assert len(long) <= 200 and long.startswith("ledger:settled:sha256:")
    assert outcome_event_type("refund:1") == "ledger:settled:refund:1"


@pytest.mark.parametrize("batch", [True, False], ids=["reconcile", "one operation"])
def test_an_operation_found_never_received_wakes_its_run_to_send_it_again(
    no_enqueue: NoEnqueue, payments: FakeProvider, batch: bool
) -> None:
    # given a run waiting (ten minutes, say) for an operation the provider never received
    run = a_run()
    op = make_operation("refund:lost", run=run)

    # when reconcile finds it so: pending again, safe to send
    reconcile(op, batch)

    # then the run is knocked now, not at the end of its wait: its check sends it again
    assert ExternalOperation.objects.get(pk=op.pk).status == OperationStatus.PENDING
    [reopened] = RunEvent.objects.filter(run=run)
    assert (reopened.type, reopened.idempotency_key) == (
        outcome_event_type(op.key),
        f"{outcome_event_type(op.key)}#reopened-1",
    )

    # and when that second send is unknown in its turn and then found made, the run is knocked again
    ExternalOperation.objects.filter(pk=op.pk).update(status=OperationStatus.UNKNOWN, submit_count=2)
    payments.seed("refund:lost")
    reconcile(op, batch)
    assert ExternalOperation.objects.get(pk=op.pk).status == OperationStatus.SUCCEEDED
    assert RunEvent.objects.filter(run=run, type=outcome_event_type(op.key)).count() == 2


def reconcile(op: ExternalOperation, batch: bool) -> None:
    if batch:
        call_command("reconcile", stdout=StringIO())
    else:
        operation_reconcile(operation_id=op.pk)
