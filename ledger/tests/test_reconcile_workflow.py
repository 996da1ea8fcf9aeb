"""``ledger.reconcile``, the workflow the nightly schedule starts: its step does what
``manage.py reconcile`` does and counts it; its payload is bounded."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.models import ExternalOperation, OperationStatus
from ledger.tests.provider import FakeProvider, Fault
from ledger.tests.support import make_operation
from ledger.workflows import Reconcile, reconcile
from workflows.exceptions import InvalidPayload
from workflows.registry import get_workflow

pytestmark = pytest.mark.django_db


def test_the_step_reconciles_and_names_what_needs_a_person(payments: FakeProvider) -> None:
    payments.seed("paid")
    payments.inject("lookup", "provider-down", Fault("error", status=503))
    make_operation("paid")
    make_operation("provider-down")

    result = reconcile(None, None)

    assert result == {"operations": 2, "resolved": 1, "flagged": 1, "skipped": 0, "flagged_keys": ["provider-down"]}
    assert ExternalOperation.objects.get(key="paid").status == OperationStatus.SUCCEEDED
    assert reconcile("other-system", None)["operations"] == 0


@pytest.mark.parametrize(
    "payload",
    [{"bogus": 1}, {"system": ""}, {"system": 5}, {"older_than_seconds": -1}, {"older_than_seconds": True}],
)
def test_the_payload_is_bounded(payload: dict[str, Any]) -> None:
    with pytest.raises(InvalidPayload):
        Reconcile.validate_payload(payload)


def test_it_is_registered_private() -> None:
    cls = get_workflow("ledger.reconcile")
    assert cls is Reconcile and not cls.public
    assert Reconcile.validate_payload({"system": "payments", "older_than_seconds": 600}) == {
        "system": "payments",
        "older_than_seconds": 600,
    }
