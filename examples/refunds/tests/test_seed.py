"""seed_demo's refund cast: who may do what, and that seeding twice adds nothing."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from examples.refunds.models import Order


@pytest.mark.django_db
def test_seed_demo_creates_the_refund_cast_and_orders_once() -> None:
    call_command("seed_demo", stdout=StringIO())
    out = StringIO()
    call_command("seed_demo", stdout=out)

    carol, dave, bob, mallory = (User.objects.get(username=n) for n in ("carol", "dave", "bob", "mallory"))
    assert carol.groups.filter(name="refund-approvers").exists() and carol.is_staff
    assert carol.has_perm("approvals.view_approvalrequest") and carol.has_perm("ledger.view_externaloperation")
    assert (
        dave.is_staff and dave.has_perm("workflows.view_workflowrun") and dave.has_perm("ledger.view_operationalrecord")
    )
    assert not dave.has_perm("workflows.control_workflowrun") and not dave.groups.exists()
    assert bob.is_staff and bob.has_perm("refunds.view_refundrequest")
    assert not mallory.is_staff and not mallory.user_permissions.exists()
    assert sorted(Order.objects.filter(customer__username="alice").values_list("number", flat=True)) == ["1041", "1042"]
    assert "carol   / carol" in out.getvalue() and "already existed" in out.getvalue()
