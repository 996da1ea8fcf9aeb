"""`manage.py reconcile` over many unknown refunds against the sandbox over HTTP: the batch lookup
path (200 keys a request), each operation settled once, and not one extra refund at the provider."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from examples.refunds.tests.conftest import World
from ledger.models import ExternalOperation, OperationEvent, OperationStatus
from ledger.services import request_fingerprint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def unknown_refund(i: int) -> ExternalOperation:
    request = {"order": f"R{i}", "amount": "10.00", "currency": "GBP"}
    return ExternalOperation(
        key=f"refund:R{i}:{i}",
        system="payments",
        action="refund",
        request=request,
        request_hash=request_fingerprint(system="payments", action="refund", request=request),
        status=OperationStatus.UNKNOWN,
        note="the answer was lost",
    )


def test_reconcile_settles_hundreds_of_unknown_refunds_with_no_duplicate(world: World) -> None:
    # given 450 operations whose answers were lost: the provider has every third one
    sandbox = world.sandbox
    operations = [unknown_refund(i) for i in range(450)]
    for op in operations[::3]:
        status, _ = sandbox.request("POST", "/v1/refunds", op.request, headers={"Idempotency-Key": op.key})
        assert status == 201
    ExternalOperation.objects.bulk_create(operations)
    before = sandbox.stats()

    # when reconcile runs
    out = io.StringIO()
    call_command("reconcile", stdout=out)

    # then those the provider has are succeeded, the rest pending (safe to send again), each
    # looked up once, through batch requests, and the provider made no refund
    statuses = dict(ExternalOperation.objects.values_list("key", "status"))
    assert [statuses[op.key] for op in operations] == [
        OperationStatus.SUCCEEDED if i % 3 == 0 else OperationStatus.PENDING for i in range(450)
    ]
    assert OperationEvent.objects.filter(kind="lookup").count() == 450
    after = sandbox.stats()
    assert after["refunds"] == before["refunds"] == 150
    assert after["requests"].get("batch_lookup", 0) - before["requests"].get("batch_lookup", 0) == 3
    assert out.getvalue().count("refund:R") == 450  # one line of the table each
