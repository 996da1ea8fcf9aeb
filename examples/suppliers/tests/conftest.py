"""The cast of the supplier tests, on top of tests.fixtures' users.

- alice requests the assessment; bob and carol are supplier reviewers; mallory is nobody's.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from examples.suppliers.models import REVIEWERS, SupplierAssessment
from examples.suppliers.services import assessment_create

Cast = dict[str, User]

SOURCES = {"companies-house": {"status": "active"}, "sanctions": {"hits": 0}}


@pytest.fixture
def cast(users: dict[str, User]) -> Cast:
    group = Group.objects.create(name=REVIEWERS)
    users["bob"].groups.add(group)
    users["carol"].groups.add(group)
    return users


@pytest.fixture
def assessment(cast: Cast) -> SupplierAssessment:
    return assessment_create(supplier_name="Acme Metals", requested_by=cast["alice"], sources=SOURCES)
