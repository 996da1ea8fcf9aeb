"""Demo data for ``seed_demo``: the reviewers group and one assessment awaiting input.

``seed(stdout)`` is safe to repeat: it finds what an earlier call created instead of adding more.
"""
from __future__ import annotations

from typing import TextIO

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import OutputWrapper
from django.db import transaction

from examples.suppliers.models import REVIEWERS, SupplierAssessment
from examples.suppliers.services import assessment_create

DEMO_SUPPLIER = "Acme Metals Ltd (demo)"
DEMO_SOURCES = {
    "companies-house": {"status": "active", "incorporated": "2009-04-17", "directors": 3},
    "sanctions-screening": {"hits": 0, "lists": ["UK", "EU", "OFAC"]},
    "credit-check": {"score": 71, "band": "moderate"},
}


def seed(stdout: OutputWrapper | TextIO) -> None:
    """Create the ``supplier-reviewers`` group (admin joins it if present) and a demo assessment
    requested by alice (or the first superuser), awaiting input."""
    users = get_user_model()
    with transaction.atomic():
        group, created = Group.objects.get_or_create(name=REVIEWERS)
        if created:
            stdout.write(f"created group {REVIEWERS}\n")
        admin_user = users.objects.filter(username="admin").first()
        if admin_user is not None:
            admin_user.groups.add(group)  # add() ignores a membership that exists
        requester = users.objects.filter(username="alice").first() or users.objects.filter(is_superuser=True).first()
        if requester is None:
            stdout.write("no user to request the demo supplier assessment; skipped\n")
            return
        if SupplierAssessment.objects.filter(supplier_name=DEMO_SUPPLIER).exists():
            stdout.write("demo supplier assessment exists\n")
            return
        assessment = assessment_create(supplier_name=DEMO_SUPPLIER, requested_by=requester, sources=DEMO_SOURCES)
    stdout.write(f"created supplier assessment {assessment.pk} ({DEMO_SUPPLIER}) for {requester}, awaiting input\n")
