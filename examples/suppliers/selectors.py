"""Reads of supplier assessments: who sees which, and what a page or the API shows of one."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.db.models import QuerySet

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.selectors import can_see_all, may_decide_now
from examples.suppliers.models import (
    DECIDE_ANY,
    REVIEWERS,
    SUBJECT_TYPE,
    AssessmentReport,
    AssessmentStatus,
    SupplierAssessment,
    report_number,
)

User = AbstractUser | AnonymousUser


def sees_all(user: User) -> bool:
    """Reviewers (the group, or anyone who may decide any approval) and staff who see every request."""
    if not user.is_authenticated or not user.is_active:
        return False
    return can_see_all(user) or user.has_perm(DECIDE_ANY) or user.groups.filter(name=REVIEWERS).exists()


def assessment_list(*, user: User, status: str | None = None, supplier: str = "") -> QuerySet[SupplierAssessment]:
    """The requester sees their own assessments; reviewers see all of them. ``supplier`` narrows
    them to suppliers whose name contains it (any case)."""
    if not user.is_authenticated or not user.is_active:
        return SupplierAssessment.objects.none()
    assessments = SupplierAssessment.objects.select_related("requested_by", "decided_by")
    if not sees_all(user):
        assessments = assessments.filter(requested_by_id=user.pk)
    if status:
        assessments = assessments.filter(status=status)
    if supplier:
        assessments = assessments.filter(supplier_name__icontains=supplier)
    return assessments


def assessment_get(*, user: User, assessment_id: int) -> SupplierAssessment | None:
    """The assessment if the user may see it; None both when it does not exist and when it is not theirs."""
    return assessment_list(user=user).filter(pk=assessment_id).first()


def assessment_status(assessment_id: int) -> str | None:
    """The assessment's status as it is now (a refusal reports it); None if there is no such assessment."""
    return SupplierAssessment.objects.filter(pk=assessment_id).values_list("status", flat=True).first()


def latest_sources(assessment: SupplierAssessment) -> list[dict[str, Any]]:
    """The latest revision of each source, by source name."""
    latest: dict[str, Any] = {}
    for record in assessment.source_records.select_related("created_by").order_by("source", "revision"):
        latest[record.source] = record
    return [
        {
            "source": r.source,
            "revision": r.revision,
            "content": r.content,
            "created_by": r.created_by.get_username() if r.created_by else None,
            "created_at": r.created_at,
        }
        for r in latest.values()
    ]


def current_report(assessment: SupplierAssessment) -> AssessmentReport | None:
    return assessment.reports.order_by("-version").first()


def report_shown(assessment: SupplierAssessment, request: ApprovalRequest | None) -> AssessmentReport | None:
    """The report a page shows beside ``request``, the review pending (read first): the version
    under review, else the latest. Not the latest whatever the review: the two are separate reads,
    and a new version with its review committed between them paired the older report with the
    newer review, a page showing one version and sending another back to be approved."""
    if request is not None:
        under_review = assessment.reports.filter(version=report_number(request.version)).first()
        if under_review is not None:
            return under_review
    return current_report(assessment)


def pending_review(assessment_id: int) -> ApprovalRequest | None:
    """The approval request now waiting for a reviewer, if any."""
    return (
        ApprovalRequest.objects.filter(
            subject_type=SUBJECT_TYPE, subject_id=str(assessment_id), status=ApprovalStatus.PENDING
        )
        .order_by("-id")
        .first()
    )


def decided_review(assessment: SupplierAssessment) -> ApprovalRequest | None:
    """The current run attempt's latest review request, if it is approved or rejected: a decision the
    workflow has yet to apply (or has applied, once the assessment is closed)."""
    run = assessment.run
    if run is None:
        return None
    latest = (
        ApprovalRequest.objects.filter(
            subject_type=SUBJECT_TYPE, subject_id=str(assessment.pk), run_id=run.pk, attempt=run.attempt
        )
        .order_by("-id")
        .first()
    )
    decided = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED)
    return latest if latest is not None and latest.status in decided else None


def assessment_data(*, assessment: SupplierAssessment, user: User, detail: bool = False) -> dict[str, Any]:
    """What the API answers for one assessment; ``detail`` adds sources, the report and the review."""
    data: dict[str, Any] = {
        "id": assessment.pk,
        "supplier_name": assessment.supplier_name,
        "status": assessment.status,
        "requested_by": assessment.requested_by.get_username(),
        "run": assessment.run_id,
        "decided_by": assessment.decided_by.get_username() if assessment.decided_by else None,
        "decided_version": assessment.decided_version,
        "failure_reason": assessment.failure_reason,
        "created_at": assessment.created_at,
        "updated_at": assessment.updated_at,
    }
    if not detail:
        return data
    request = pending_review(assessment.pk)
    report = report_shown(assessment, request)
    data.update(
        input=assessment.input,
        sources=latest_sources(assessment),
        report=None
        if report is None
        else {
            "version": report.version,
            "source_revisions": report.source_revisions,
            "body": report.body,
            "created_at": report.created_at,
        },
        review=None
        if request is None
        else {
            "request": request.pk,
            "report_version": report_number(request.version),
            "expires_at": request.expires_at,
            "can_decide": may_decide_now(user, request),
        },
    )
    return data


# What the requester reads, in words, for each state (their home page).
STATUS_WORDS = {
    AssessmentStatus.AWAITING_INPUT: "awaiting your input",
    AssessmentStatus.GATHERING_EVIDENCE: "gathering evidence",
    AssessmentStatus.READY_FOR_REVIEW: "awaiting review",
    AssessmentStatus.APPROVED: "approved",
    AssessmentStatus.REJECTED: "rejected",
    AssessmentStatus.FAILED: "could not be completed",
}


def assessment_status_words(assessment: SupplierAssessment) -> str:
    return STATUS_WORDS.get(AssessmentStatus(assessment.status), str(assessment.status))


def assessments_requested_by(*, user: User) -> QuerySet[SupplierAssessment]:
    """The assessments the user asked for, newest first: a reviewer's home page lists their own
    requests, not everyone's (``assessment_list`` is the reviewer's queue)."""
    if not user.is_authenticated or not user.is_active:
        return SupplierAssessment.objects.none()
    return SupplierAssessment.objects.filter(requested_by_id=user.pk).order_by("-created_at", "-pk")
