"""Who sees which assessment, and what a refusal reports of one, read directly."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser

from approvals.tests.support import waiting_request
from examples.suppliers.models import (
    REVIEWERS,
    SUBJECT_TYPE,
    AssessmentStatus,
    SupplierAssessment,
    report_version_label,
)
from examples.suppliers.selectors import assessment_data, assessment_get, assessment_list, assessment_status
from examples.suppliers.services import report_generate
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


def test_a_page_shows_the_report_under_review_beside_its_review(users: Users, assessment: SupplierAssessment) -> None:
    # given report v1 under review, and v2 written before its own review exists (as a page that
    # read the review first, then the reports, can find them: the two reads are not one snapshot)
    report_generate(assessment_id=assessment.pk, revisions={"companies-house": 1, "sanctions": 1})
    waiting_request(
        subject_type=SUBJECT_TYPE, subject_id=str(assessment.pk), version=report_version_label(1), approvers=REVIEWERS
    )
    report_generate(assessment_id=assessment.pk, revisions={"companies-house": 1, "sanctions": 1})

    # then the page pairs the review with the report it is of, not with the newest report
    data = assessment_data(assessment=assessment, user=users.carol, detail=True)
    assert (data["review"]["report_version"], data["report"]["version"]) == (1, 1)


def test_without_a_review_a_page_shows_the_latest_report(users: Users, assessment: SupplierAssessment) -> None:
    for _ in range(2):
        report_generate(assessment_id=assessment.pk, revisions={"companies-house": 1, "sanctions": 1})

    data = assessment_data(assessment=assessment, user=users.carol, detail=True)
    assert (data["review"], data["report"]["version"]) == (None, 2)
