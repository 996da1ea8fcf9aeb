"""``operation_report``: an outcome the provider reported on its own (a signed webhook) settles an
operation in doubt as a lookup would, and leaves everything else as it is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction
from prometheus_client import REGISTRY

from ledger import hooks
from ledger.adapters import Failed, Succeeded
from ledger.models import EventKind, ExternalOperation, OperationEvent, OperationStatus
from ledger.services import operation_report
from ledger.tests.support import make_operation

pytestmark = pytest.mark.django_db


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys the settled hooks were called for."""
    calls: list[str] = []
    monkeypatch.setattr(hooks, "_on_settled", [lambda op: calls.append(op.key)])
    return calls


def report(key: str, outcome: Succeeded | Failed, system: str = "payments") -> Any:
    with transaction.atomic():
        return operation_report(key=key, system=system, outcome=outcome, reported_by="webhook sandbox")


@pytest.mark.parametrize("status", [OperationStatus.UNKNOWN, OperationStatus.SUBMITTED])
def test_an_operation_in_doubt_is_settled_as_a_lookup_would(status: str, settled: list[str]) -> None:
    make_operation("k1", status)

    result = report("k1", Succeeded({"id": "re_1"}))

    op = ExternalOperation.objects.get(key="k1")
    assert (op.status, op.response) == (OperationStatus.SUCCEEDED, {"id": "re_1"})
    assert (result.before, result.after, result.verdict) == (status, "succeeded", "resolved")
    assert op.note == "the provider has it as succeeded (reported by webhook sandbox)"
    assert op.lookup_count == 0  # not a lookup of ours
    [event] = OperationEvent.objects.filter(operation=op)
    assert (event.kind, event.status_before, event.status_after) == (EventKind.LOOKUP, status, "succeeded")
    assert settled == ["k1"]


def test_a_failure_report_fails_it_with_the_reason(settled: list[str]) -> None:
    make_operation("k1")
    report("k1", Failed(reason="declined", detail={"status": "declined"}))
    op = ExternalOperation.objects.get(key="k1")
    assert (op.status, op.error) == (OperationStatus.FAILED, {"reason": "declined", "detail": {"status": "declined"}})
    assert settled == ["k1"]


@pytest.mark.parametrize(
    ("status", "says"),
    [
        (OperationStatus.SUCCEEDED, "already succeeded"),
        (OperationStatus.FAILED, "already failed"),
        (OperationStatus.PENDING, "never sent"),
    ],
)
def test_anything_else_is_left_as_it_is(status: str, says: str, settled: list[str]) -> None:
    make_operation("k1", status)

    result = report("k1", Failed(reason="declined"))

    assert ExternalOperation.objects.get(key="k1").status == status
    assert result.verdict == "skipped" and says in result.note
    assert OperationEvent.objects.count() == 0 and settled == []


def test_a_key_of_another_system_or_nobodys_is_none(settled: list[str]) -> None:
    make_operation("k1")
    assert report("k1", Succeeded({}), system="crm") is None
    assert report("nobody", Succeeded({})) is None
    assert ExternalOperation.objects.get(key="k1").status == OperationStatus.UNKNOWN


def test_a_success_reported_after_a_failure_corrects_it_and_flags_it(
    settled: list[str], caplog: pytest.LogCaptureFixture, django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    # given a sent operation a first report failed (a provider's mistake, or events out of order)
    make_operation("k1")
    report("k1", Failed(reason="declined"))

    # when the provider then reports it succeeded
    with django_capture_on_commit_callbacks(execute=True):
        result = report("k1", Succeeded({"id": "re_1"}))

    # then the provider is believed: succeeded, flagged for a person, the hooks run again (a refund's
    # order counts the money as refunded), and an error is logged
    op = ExternalOperation.objects.get(key="k1")
    assert (op.status, op.response) == (OperationStatus.SUCCEEDED, {"id": "re_1"})
    assert (result.before, result.after, result.verdict) == ("failed", "succeeded", "flagged")
    assert "now reports it succeeded (reported by webhook sandbox): corrected" in op.note
    assert settled == ["k1", "k1"]
    assert [(e.status_before, e.status_after) for e in OperationEvent.objects.order_by("pk")] == [
        ("unknown", "failed"),
        ("failed", "succeeded"),
    ]
    assert any(r.levelname == "ERROR" and "corrected" in r.getMessage() for r in caplog.records)


def test_a_failure_never_sent_is_not_corrected(settled: list[str]) -> None:
    make_operation("k1", OperationStatus.FAILED, sent_ago=None, submit_count=0)  # abandoned: never sent

    result = report("k1", Succeeded({}))

    assert ExternalOperation.objects.get(key="k1").status == OperationStatus.FAILED
    assert result.verdict == "skipped" and settled == []


def events_counted(status: str) -> float:
    sample = REGISTRY.get_sample_value(
        "ledger_operation_events_total", {"system": "payments", "kind": EventKind.LOOKUP, "status": status}
    )
    return sample or 0.0


def test_a_settlement_rolled_back_is_neither_logged_nor_counted(
    settled: list[str], caplog: pytest.LogCaptureFixture, django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    # given an operation in doubt, and a report of its outcome whose transaction then fails (a
    # webhook's action raising after it, a replay rolled back)
    make_operation("k1")
    counted = events_counted(OperationStatus.SUCCEEDED)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(RuntimeError):
        with transaction.atomic():
            operation_report(key="k1", system="payments", outcome=Succeeded({}), reported_by="webhook sandbox")
            raise RuntimeError("the caller's transaction fails")

    # then nothing says it was settled: not the row, not the log, not the metric
    assert ExternalOperation.objects.get(key="k1").status == OperationStatus.UNKNOWN
    assert not [r for r in caplog.records if r.name == "ledger" and "k1" in r.getMessage()]
    assert events_counted(OperationStatus.SUCCEEDED) == counted

    # and the same report committed is logged and counted once
    with django_capture_on_commit_callbacks(execute=True):
        report("k1", Succeeded({}))
    assert len([r for r in caplog.records if r.name == "ledger" and "k1" in r.getMessage()]) == 1
    assert events_counted(OperationStatus.SUCCEEDED) == counted + 1
