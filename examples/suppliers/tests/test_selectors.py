"""Who sees which assessment, and what a refusal reports of one, read directly."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser

from examples.suppliers.models import AssessmentStatus, SupplierAssessment
from examples.suppliers.selectors import assessment_get, assessment_list, assessment_status
from tests.factories import Users

pytestmark = pytest.mark.django_db


def test_the_requester_sees_their_own_and_reviewers_see_all(users: Users, assessment: SupplierAssessment) -> None:
    # given: an assessment mallory asked for, beside alice's
    other = SupplierAssessment.objects.create(supplier_name="Globex", requested_by=users.mallory)

    # then
    assert set(assessment_list(user=users.alice)) == {assessment}
    assert set(assessment_list(user=users.mallory)) == {other}
    assert set(assessment_list(user=users.bob)) == {assessment, other}  # a reviewer
    assert not assessment_list(user=AnonymousUser()).exists()
    assert assessment_get(user=users.alice, assessment_id=assessment.pk) == assessment
    assert assessment_get(user=users.alice, assessment_id=other.pk) is None  # not hers: as if it did not exist
    assert set(assessment_list(user=users.bob, status=AssessmentStatus.APPROVED)) == set()


def test_assessment_status_is_the_status_now_or_none(assessment: SupplierAssessment) -> None:
    assert assessment_status(assessment.pk) == AssessmentStatus.AWAITING_INPUT
    assert assessment_status(assessment.pk + 1000) is None
