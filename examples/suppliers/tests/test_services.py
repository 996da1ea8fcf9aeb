"""The assessment's state machine and who may move it, source revisions and report versions,
without a worker: the services on PostgreSQL inside the test's transaction."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django_fsm import has_transition_perm

from examples.suppliers import services
from examples.suppliers.models import (
    REVIEWERS,
    SUBJECT_TYPE,
    AssessmentReport,
    AssessmentStatus,
    SourceRecord,
    SupplierAssessment,
)
from tests.factories import Users
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db


def snapshot(assessment: SupplierAssessment) -> tuple[Any, ...]:
    """Everything a refusal must leave as it was."""
    row = SupplierAssessment.objects.get(pk=assessment.pk)
    return (
        row.status,
        row.input,
        row.run_id,
        row.decided_by_id,
        row.decided_version,
        row.failure_reason,
        SourceRecord.objects.filter(assessment=row).count(),
        AssessmentReport.objects.filter(assessment=row).count(),
        WorkflowRun.objects.count(),
    )


def in_state(users: Users, status: str) -> SupplierAssessment:
    """An assessment in ``status`` (a protected field: set once at creation, as a fixture)."""
    row = SupplierAssessment.objects.create(supplier_name="Globex", requested_by=users.alice, status=status)
    SourceRecord.objects.create(assessment=row, source="credit", revision=1, content={"score": 70})
    return row


def test_a_new_assessment_awaits_input_with_revision_1_of_each_source(assessment: SupplierAssessment) -> None:
    assert assessment.status == AssessmentStatus.AWAITING_INPUT
    assert list(assessment.source_records.values_list("source", "revision")) == [
        ("companies-house", 1),
        ("sanctions", 1),
    ]


@pytest.mark.parametrize("name", ["", "   ", "\u00a0\t", "x" * 101])
def test_a_source_name_is_1_to_100_characters_not_only_whitespace(
    users: Users, assessment: SupplierAssessment, name: str
) -> None:
    before = snapshot(assessment), SupplierAssessment.objects.count()

    with pytest.raises(services.InvalidSourceName, match="Source names are 1 to 100 characters"):
        services.assessment_create(supplier_name="Globex", requested_by=users.alice, sources={name: {}})
    with pytest.raises(services.InvalidSourceName):
        services.source_record_add(assessment_id=assessment.pk, source=name, content={}, by=users.alice)

    assert (snapshot(assessment), SupplierAssessment.objects.count()) == before
    services.check_source_name("x" * 100)  # the longest name allowed
    services.check_source_name(" credit ")  # taken as given: spaces around a name are part of it


def test_the_status_cannot_be_assigned_directly(assessment: SupplierAssessment) -> None:
    with pytest.raises(AttributeError):
        assessment.status = AssessmentStatus.APPROVED


def test_the_requester_submits_the_input_and_the_run_starts(users: Users, assessment: SupplierAssessment) -> None:
    services.assessment_submit_input(assessment_id=assessment.pk, by=users.alice, data={"scope": "tier 1"})

    row = SupplierAssessment.objects.get(pk=assessment.pk)
    assert row.status == AssessmentStatus.AWAITING_INPUT  # the run's first step moves it on
    assert row.input == {"scope": "tier 1"}
    assert row.run is not None
    assert (row.run.workflow, row.run.owner, row.run.payload) == (
        "supplier-assessment",
        users.alice,
        {"assessment_id": row.pk, "requested_by_id": users.alice.pk},
    )


@pytest.mark.parametrize("who", ["mallory", "bob", "carol"])
def test_only_the_requester_may_submit(users: Users, assessment: SupplierAssessment, who: str) -> None:
    before = snapshot(assessment)
    with pytest.raises(PermissionDenied):
        services.assessment_submit_input(assessment_id=assessment.pk, by=getattr(users, who), data={"scope": "x"})
    assert snapshot(assessment) == before


def test_input_is_submitted_once(users: Users, assessment: SupplierAssessment) -> None:
    services.assessment_submit_input(assessment_id=assessment.pk, by=users.alice, data={})
    before = snapshot(assessment)
    with pytest.raises(services.AssessmentStateError):
        services.assessment_submit_input(assessment_id=assessment.pk, by=users.alice, data={"again": True})
    assert snapshot(assessment) == before


def test_nobody_but_the_engine_moves_it_to_gathering_ready_or_failed(users: Users) -> None:
    superuser = User.objects.create_superuser("root", "root@example.com", "pw")
    waiting = in_state(users, AssessmentStatus.AWAITING_INPUT)
    gathering = in_state(users, AssessmentStatus.GATHERING_EVIDENCE)
    for user in (users.alice, users.carol, superuser):
        assert not has_transition_perm(waiting.start_gathering, user)
        assert not has_transition_perm(gathering.mark_ready, user)
        assert not has_transition_perm(gathering.fail, user)
    # the engine (the workflow's steps, no person) may
    assert services.assessment_start_gathering(assessment_id=waiting.pk) == AssessmentStatus.GATHERING_EVIDENCE
    assert services.assessment_mark_ready(assessment_id=gathering.pk) == AssessmentStatus.READY_FOR_REVIEW


def test_only_reviewers_other_than_the_requester_approve_or_reject(users: Users) -> None:
    ready = in_state(users, AssessmentStatus.READY_FOR_REVIEW)
    users.alice.groups.add(*users.carol.groups.all())  # even in the group, the requester may not
    assert has_transition_perm(ready.approve, users.carol) and has_transition_perm(ready.reject, users.bob)
    for who in ("alice", "mallory"):
        assert not has_transition_perm(ready.approve, getattr(users, who))
        assert not has_transition_perm(ready.reject, getattr(users, who))

    before = snapshot(ready)
    with pytest.raises(PermissionDenied):
        services.assessment_decide(assessment_id=ready.pk, approve=True, by_id=users.mallory.pk, version=1)
    assert snapshot(ready) == before

    assert (
        services.assessment_decide(assessment_id=ready.pk, approve=False, by_id=users.carol.pk, version=1)
        == AssessmentStatus.REJECTED
    )
    row = SupplierAssessment.objects.get(pk=ready.pk)
    assert (row.decided_by, row.decided_version) == (users.carol, 1)


def test_a_decision_needs_the_review_state(users: Users) -> None:
    gathering = in_state(users, AssessmentStatus.GATHERING_EVIDENCE)
    before = snapshot(gathering)
    with pytest.raises(services.AssessmentStateError):
        services.assessment_decide(assessment_id=gathering.pk, approve=True, by_id=users.carol.pk, version=1)
    assert snapshot(gathering) == before


def test_a_revision_is_a_new_row_and_history_stays(users: Users, assessment: SupplierAssessment) -> None:
    record = services.source_record_add(
        assessment_id=assessment.pk, source="sanctions", content={"hits": 1}, by=users.carol
    )
    assert record.revision == 2
    assert list(assessment.source_records.filter(source="sanctions").values_list("revision", "content")) == [
        (1, {"hits": 0}),
        (2, {"hits": 1}),
    ]
    assert services.current_revisions(assessment) == {"companies-house": 1, "sanctions": 2}


def test_outsiders_and_closed_assessments_get_no_revisions(users: Users, assessment: SupplierAssessment) -> None:
    before = snapshot(assessment)
    with pytest.raises(PermissionDenied):
        services.source_record_add(assessment_id=assessment.pk, source="sanctions", content={}, by=users.mallory)
    assert snapshot(assessment) == before

    closed = in_state(users, AssessmentStatus.APPROVED)
    before = snapshot(closed)
    with pytest.raises(services.AssessmentStateError):
        services.source_record_add(assessment_id=closed.pk, source="credit", content={}, by=users.alice)
    assert snapshot(closed) == before


def test_the_current_report_is_regenerated_only_when_a_source_changed(
    users: Users,
    assessment: SupplierAssessment,
) -> None:
    revisions = services.sources_gather(assessment_id=assessment.pk)
    assert services.report_generate(assessment_id=assessment.pk, revisions=revisions) == 1

    first = services.report_current(assessment_id=assessment.pk)
    assert first.version == "report-v1"
    assert services.report_current(assessment_id=assessment.pk).version == "report-v1"  # nothing changed

    services.source_record_add(assessment_id=assessment.pk, source="sanctions", content={"hits": 2}, by=users.alice)
    second = services.report_current(assessment_id=assessment.pk)
    assert second.version == "report-v2"
    v2 = AssessmentReport.objects.get(assessment=assessment, version=2)
    assert v2.source_revisions == {"companies-house": 1, "sanctions": 2}
    assert {"source": "sanctions", "revision": 2, "content": {"hits": 2}} in v2.body["sources"]
    # v1 is kept as it was
    assert AssessmentReport.objects.get(assessment=assessment, version=1).source_revisions == revisions


def test_demo_seed_is_idempotent(users: Users) -> None:
    import io

    from examples.suppliers import demo

    demo.seed(io.StringIO())
    out = io.StringIO()
    demo.seed(out)
    assessment = SupplierAssessment.objects.get(supplier_name=demo.DEMO_SUPPLIER)
    assert (assessment.requested_by, assessment.status) == (users.alice, AssessmentStatus.AWAITING_INPUT)
    assert users.carol.groups.filter(name=REVIEWERS).exists()
    assert f"POST /api/assessments/{assessment.pk}/submit" in out.getvalue()

    # and once it is decided, a seed tells no one to submit or review it
    SupplierAssessment.objects.filter(pk=assessment.pk).update(status=AssessmentStatus.APPROVED)
    out = io.StringIO()
    demo.seed(out)
    assert f"Supplier assessment {assessment.pk} is approved" in out.getvalue()
    assert "/submit" not in out.getvalue() and "/review" not in out.getvalue()


def test_once_the_review_is_decided_the_evidence_is_final(users: Users) -> None:
    # given an assessment whose report v1 was just approved; the workflow has yet to apply it
    from approvals.models import ApprovalStatus
    from approvals.tests.support import waiting_request

    row = in_state(users, AssessmentStatus.READY_FOR_REVIEW)
    decided = waiting_request(
        subject_type=SUBJECT_TYPE, subject_id=str(row.pk), version="report-v1", status=ApprovalStatus.APPROVED
    )
    SupplierAssessment.objects.filter(pk=row.pk).update(run=decided.run)
    before = snapshot(row)

    # when a source is revised, then the revision is refused: it would be neither reviewed nor refused
    with pytest.raises(services.AssessmentStateError, match="report-v1 was approved"):
        services.source_record_add(assessment_id=row.pk, source="credit", content={"score": 10}, by=users.alice)
    assert snapshot(row) == before
