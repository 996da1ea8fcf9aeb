"""The supplier tests' cast and assessment: the suite's ``users``, with carol and bob in the supplier
reviewers' group; alice requests the assessment."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from examples.suppliers.models import REVIEWERS, SupplierAssessment
from examples.suppliers.services import assessment_create
from tests.factories import Users

SOURCES = {"companies-house": {"status": "active"}, "sanctions": {"hits": 0}}


@pytest.fixture
def users(users: Users) -> Users:
    Group.objects.create(name=REVIEWERS).user_set.add(users.carol, users.bob)
    return users


@pytest.fixture
def assessment(users: Users) -> SupplierAssessment:
    return assessment_create(supplier_name="Acme Metals", requested_by=users.alice, sources=SOURCES)
