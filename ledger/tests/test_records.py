"""Operational records: redaction before storage, and ``manage.py purge_records`` retention."""

from __future__ import annotations

import copy
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from ledger.exceptions import InvalidOperation
from ledger.models import OperationalRecord
from ledger.redaction import REDACTED, redact
from ledger.services import record_create, record_purge
from ledger.tests.support import make_operation
from tests.factories import Users
from workflows import services as workflow_services

pytestmark = pytest.mark.django_db

CUSTOMER_REPLY = {
    "refund_id": "re_1",
    "amount": "120.00",
    "email_sent": True,  # a flag named like a personal-data key, but not one
    "customer": {
        "Email": "alice@example.com",
        "name": "Refund for order 1042",  # "name" is not redacted by default: too many things have one
        "billing-address": {"street": "1 High Street", "city": "Leeds"},
        "contacts": [{"PHONE": "+44 7700 900123"}, {"type": "fax", "Phone_Number": "+44 113 496 0000"}],
    },
    "payment": {"card": {"last4": "4242", "brand": "visa"}, "cardNumber": "4242424242424242", "IBAN": "GB33BUKB"},
    "history": [[{"address": "2 Low Road"}], "address"],
}


def purge(*args: str) -> str:
    out = StringIO()
    call_command("purge_records", *args, stdout=out)
    return out.getvalue()


def aged_record(days: float, request_id: str = "") -> OperationalRecord:
    record = record_create(request_id=request_id or f"req-{days}", tool="refund.submit")
    # created_at is auto_now_add: backdate it the way time would have
    OperationalRecord.objects.filter(pk=record.pk).update(created_at=timezone.now() - timedelta(days=days))
    return record


# --- redaction ----------------------------------------------------------------------------------
def test_redact_replaces_personal_data_at_any_depth_whatever_the_case_or_separator() -> None:
    original = copy.deepcopy(CUSTOMER_REPLY)

    redacted = redact(CUSTOMER_REPLY)

    assert redacted["customer"]["Email"] == REDACTED
    assert redacted["customer"]["billing-address"] == REDACTED  # the whole object, not its parts
    assert redacted["customer"]["contacts"] == [{"PHONE": REDACTED}, {"type": "fax", "Phone_Number": REDACTED}]
    assert redacted["payment"] == {"card": REDACTED, "cardNumber": REDACTED, "IBAN": REDACTED}
    assert redacted["history"] == [[{"address": REDACTED}], "address"]  # a value "address" is not a key
    # what is not personal data is kept
    assert redacted["refund_id"] == "re_1" and redacted["amount"] == "120.00"
    assert redacted["email_sent"] is True
    assert redacted["customer"]["name"] == "Refund for order 1042"
    # and the input is not changed
    assert CUSTOMER_REPLY == original
    assert redact("alice@example.com") == "alice@example.com" and redact(None) is None


def test_the_redacted_keys_come_from_settings(settings: Any) -> None:
    settings.LEDGER = {**settings.LEDGER, "REDACT_KEYS": ["Customer_Ref"]}

    redacted = redact({"customer-ref": "C-77", "email": "alice@example.com"})

    assert redacted == {"customer-ref": REDACTED, "email": "alice@example.com"}


def test_record_create_stores_the_response_redacted(users: Users) -> None:
    # given
    run, _ = workflow_services.run_start(workflow="test.echo", payload={}, owner=users.alice)
    op = make_operation("refund:1042:r1")
    observed = timezone.now() - timedelta(minutes=3)

    # when
    record = record_create(
        request_id="req-1042",
        run=run,
        step="submit refund",
        tool="payments.refund",
        observed_at=observed,
        response=CUSTOMER_REPLY,
        approval_pending=True,
        operation=op,
    )

    # then what reached the database holds no personal data
    stored = OperationalRecord.objects.get(pk=record.pk)
    assert stored.response == redact(CUSTOMER_REPLY)
    text = str(OperationalRecord.objects.filter(pk=record.pk).values_list("response", flat=True).get())
    for secret in ("alice@example.com", "High Street", "7700 900123", "4242424242424242", "GB33BUKB", "Low Road"):
        assert secret not in text
    assert (stored.run_id, stored.operation_id, stored.step, stored.tool) == (
        run.id,
        op.pk,
        "submit refund",
        "payments.refund",
    )
    assert stored.observed_at == observed and stored.approval_pending is True
    assert stored.created_at is not None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"request_id": ""},
        {"request_id": "x" * 256},
        {"response": {"when": object()}},
        {"observed_at": timezone.now().replace(tzinfo=None)},
    ],
)
def test_record_create_refuses_bad_input_and_stores_nothing(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidOperation):
        record_create(**{"request_id": "req-1", "tool": "t", **kwargs})
    assert not OperationalRecord.objects.exists()


def test_a_record_outlives_its_run() -> None:
    run, _ = workflow_services.run_start(workflow="test.echo", payload={})
    record = record_create(request_id="req-2", tool="t", run=run.id)
    run.delete()
    assert OperationalRecord.objects.get(pk=record.pk).run_id is None


# --- retention ----------------------------------------------------------------------------------
def test_purge_deletes_only_records_older_than_the_period() -> None:
    # given
    old = [aged_record(days) for days in (91, 200, 400)]
    kept = [aged_record(days) for days in (0, 30, 89.9)]

    # when
    output = purge("--older-than", "90d")

    # then
    assert output.startswith("Deleted 3 operational record(s) created before ")
    assert "(older than 90d)" in output
    assert not OperationalRecord.objects.filter(pk__in=[r.pk for r in old]).exists()
    assert set(OperationalRecord.objects.values_list("pk", flat=True)) == {r.pk for r in kept}


def test_purge_defaults_to_the_retention_setting(settings: Any) -> None:
    settings.LEDGER = {**settings.LEDGER, "RETENTION_DAYS": 30}
    aged_record(31)
    young = aged_record(29)

    output = purge()

    assert "Deleted 1 operational record(s)" in output and "(older than 30d)" in output
    assert list(OperationalRecord.objects.values_list("pk", flat=True)) == [young.pk]


def test_purge_dry_run_counts_and_deletes_nothing() -> None:
    aged_record(100)
    aged_record(1)

    output = purge("--older-than", "90d", "--dry-run")

    assert "Would delete 1 operational record(s)" in output and "nothing was deleted" in output
    assert OperationalRecord.objects.count() == 2


def test_purge_works_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger.services import records

    monkeypatch.setattr(records, "PURGE_BATCH", 2)
    for _ in range(5):
        aged_record(120)
    aged_record(1)

    assert record_purge(older_than=timedelta(days=90)).count == 5
    assert OperationalRecord.objects.count() == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "0d"], "more than zero"),
        (["--older-than", "ninety days"], "is not a duration"),
        (["--older-than", "90"], "is not a duration"),
    ],
)
def test_purge_refuses_bad_periods_and_deletes_nothing(args: list[str], message: str) -> None:
    aged_record(400)
    with pytest.raises(CommandError, match=message):
        purge(*args)
    assert OperationalRecord.objects.count() == 1
