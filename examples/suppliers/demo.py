"""Demo data for ``seed_demo``: the reviewers group and one assessment awaiting input.

``seed(stdout)`` is safe to repeat: it finds what an earlier call created instead of adding more.
"""

from __future__ import annotations

from typing import TextIO

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import OutputWrapper
from django.db import transaction

from examples.suppliers.models import REVIEWERS, TERMINAL, AssessmentStatus, SupplierAssessment
from examples.suppliers.services import assessment_create

DEMO_SUPPLIER = "Acme Metals Ltd (demo)"
DEMO_SOURCES = {
    "companies-house": {"status": "active", "incorporated": "2009-04-17", "directors": 3},
    "sanctions-screening": {"hits": 0, "lists": ["UK", "EU", "OFAC"]},
    "credit-check": {"score": 71, "band": "moderate"},
}


def seed(stdout: OutputWrapper | TextIO) -> None:
    """Create the ``supplier-reviewers`` group (admin and carol join it if present) and a demo
    assessment requested by alice (or the first superuser), awaiting input."""
    users = get_user_model()
    with transaction.atomic():
        group, created = Group.objects.get_or_create(name=REVIEWERS)
        if created:
            stdout.write(f"created group {REVIEWERS}\n")
        for reviewer in users.objects.filter(username__in=["admin", "carol"]):
            reviewer.groups.add(group)  # add() ignores a membership that exists
        requester = users.objects.filter(username="alice").first() or users.objects.filter(is_superuser=True).first()
        if requester is None:
            stdout.write("no user to request the demo supplier assessment; skipped\n")
            return
        assessment = SupplierAssessment.objects.filter(supplier_name=DEMO_SUPPLIER).first()
        if assessment is None:
            assessment = assessment_create(supplier_name=DEMO_SUPPLIER, requested_by=requester, sources=DEMO_SOURCES)
            stdout.write(f"created supplier assessment {assessment.pk} ({DEMO_SUPPLIER}) for {requester}\n")
    url = f"/api/assessments/{assessment.pk}"
    # What can be done with it now: a seed run again later finds it submitted, or decided.
    stdout.write(f"Supplier assessment {assessment.pk} is {assessment.status} (GET {url}).\n")
    if assessment.status == AssessmentStatus.AWAITING_INPUT:
        stdout.write(
            f'  As {assessment.requested_by}: POST {url}/submit {{"input": {{"scope": "..."}}}}; revise evidence\n'
            f'  with POST {url}/sources {{"source", "content"}}.\n'
        )
    if assessment.status not in TERMINAL:
        stdout.write(
            f"  Reviewers ({REVIEWERS}: admin, carol) decide the report version GET {url} shows, with\n"
            f'  POST {url}/review {{"approve": true, "report_version": N}} or in the admin\'s approval queue.\n'
        )
