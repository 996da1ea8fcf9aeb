"""Supplier assessment: the task record, its source records (every revision kept) and its reports.

``SupplierAssessment.status`` is a protected FSM field. Each transition says who may take it
(``permission=``): the requester submits the input, only the workflow (the engine, no person)
moves the assessment on to gathering, ready and failed, and only a reviewer of the
``supplier-reviewers`` group, never the requester, approves or rejects it. ``services`` call the
transitions inside ``transaction.atomic()`` with the row locked.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django_fsm import FSMField, transition

from workflows.fsm import FSMModelMixin
from workflows.models import WorkflowRun

REVIEWERS = "supplier-reviewers"
# How approval requests name an assessment (approvals.services.subject_ref of the instance).
SUBJECT_TYPE = "suppliers.supplierassessment"
# A person with this approvals permission may decide any request (approvals.selectors.can_decide_any);
# the assessment accepts their decision too, so an approval the approvals app took is never refused here.
DECIDE_ANY = "approvals.decide_any"


class AssessmentStatus(models.TextChoices):
    AWAITING_INPUT = "awaiting_input"
    GATHERING_EVIDENCE = "gathering_evidence"
    READY_FOR_REVIEW = "ready_for_review"
    APPROVED = "approved"
    REJECTED = "rejected"
    FAILED = "failed"


TERMINAL = frozenset({AssessmentStatus.APPROVED, AssessmentStatus.REJECTED, AssessmentStatus.FAILED})


# --- who may move an assessment ----------------------------------------------------------------
# Predicates take the user first, as approvals.selectors' do; django-fsm-2 calls a transition's
# permission with the instance first, so the transitions name the *_only functions below.
def is_requester(user: Any, assessment: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.pk == assessment.requested_by_id)


def is_reviewer(user: Any, assessment: Any) -> bool:
    """In the reviewers group (or may decide any approval), and not the requester (four eyes)."""
    if user is None or not user.is_authenticated or not user.is_active or is_requester(user, assessment):
        return False
    return bool(user.has_perm(DECIDE_ANY) or user.groups.filter(name=REVIEWERS).exists())


def requester_only(instance: Any, user: Any) -> bool:
    return is_requester(user, instance)


def reviewer_only(instance: Any, user: Any) -> bool:
    return is_reviewer(user, instance)


def engine_only(instance: Any, user: Any) -> bool:
    """No person may take these transitions: the workflow takes them without a user (services
    check ``can_proceed`` for it), so ``has_transition_perm`` is False for everyone."""
    return False


def has_no_run(instance: Any) -> bool:
    return instance.run_id is None


class SupplierAssessment(FSMModelMixin, models.Model):
    supplier_name = models.CharField(max_length=200)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    # What the requester submitted (scope, questions): part of every report.
    input = models.JSONField(default=dict, blank=True)
    status = FSMField(default=AssessmentStatus.AWAITING_INPUT, choices=AssessmentStatus.choices, protected=True)
    run = models.OneToOneField(
        WorkflowRun, null=True, blank=True, on_delete=models.PROTECT, related_name="supplier_assessment"
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The report version the decision applied to, and why the assessment failed (if it did).
    decided_version = models.PositiveIntegerField(null=True, blank=True)
    failure_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.supplier_name} ({self.status})"

    @property
    def is_closed(self) -> bool:
        return self.status in TERMINAL

    # --- transitions: database fields only; services call them inside atomic() with the row locked.
    # Submitting keeps the state (the run is queued; its first step moves it on): the condition
    # makes a second submit impossible, so one assessment never gets two runs.
    @transition(
        field=status,
        source=AssessmentStatus.AWAITING_INPUT,
        target=AssessmentStatus.AWAITING_INPUT,
        conditions=[has_no_run],
        permission=requester_only,
    )
    def submit_input(self, *, data: dict[str, Any]) -> None:
        self.input = data

    # From ready_for_review too: a restarted run gathers the evidence again and builds a new report.
    @transition(
        field=status,
        source=[AssessmentStatus.AWAITING_INPUT, AssessmentStatus.READY_FOR_REVIEW],
        target=AssessmentStatus.GATHERING_EVIDENCE,
        permission=engine_only,
    )
    def start_gathering(self) -> None:
        pass

    @transition(
        field=status,
        source=AssessmentStatus.GATHERING_EVIDENCE,
        target=AssessmentStatus.READY_FOR_REVIEW,
        permission=engine_only,
    )
    def mark_ready(self) -> None:
        pass

    @transition(
        field=status,
        source=AssessmentStatus.READY_FOR_REVIEW,
        target=AssessmentStatus.APPROVED,
        permission=reviewer_only,
    )
    def approve(self, *, by_id: int, version: int) -> None:
        self.decided_by_id, self.decided_version = by_id, version

    @transition(
        field=status,
        source=AssessmentStatus.READY_FOR_REVIEW,
        target=AssessmentStatus.REJECTED,
        permission=reviewer_only,
    )
    def reject(self, *, by_id: int, version: int) -> None:
        self.decided_by_id, self.decided_version = by_id, version

    @transition(
        field=status,
        source=[
            AssessmentStatus.AWAITING_INPUT,
            AssessmentStatus.GATHERING_EVIDENCE,
            AssessmentStatus.READY_FOR_REVIEW,
        ],
        target=AssessmentStatus.FAILED,
        permission=engine_only,
    )
    def fail(self, *, reason: str) -> None:
        self.failure_reason = reason


# The longest source name (services.check_source_name and the API's schema use it too).
SOURCE_NAME_MAX = 100


class SourceRecord(models.Model):
    """One revision of one source's evidence. A revision is a new row: history is never rewritten,
    so a report can always show exactly the revisions it was built from."""

    assessment = models.ForeignKey(SupplierAssessment, on_delete=models.CASCADE, related_name="source_records")
    source = models.CharField(max_length=SOURCE_NAME_MAX, help_text="e.g. companies-house, sanctions, credit")
    revision = models.PositiveIntegerField()
    content = models.JSONField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["assessment", "source", "revision"]
        constraints = [
            models.UniqueConstraint(fields=["assessment", "source", "revision"], name="source_record_revision"),
        ]

    def __str__(self) -> str:
        return f"{self.source} r{self.revision}"


class AssessmentReport(models.Model):
    """Version n of the assessment's report, built from the source revisions in ``source_revisions``
    ({source: revision}). Never changed once written: a new version is a new row."""

    assessment = models.ForeignKey(SupplierAssessment, on_delete=models.CASCADE, related_name="reports")
    version = models.PositiveIntegerField()
    body = models.JSONField()
    source_revisions = models.JSONField(help_text="{source: revision} the report was built from")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["assessment", "version"]
        constraints = [
            models.UniqueConstraint(fields=["assessment", "version"], name="assessment_report_version"),
        ]

    def __str__(self) -> str:
        return f"report v{self.version}"

    @property
    def approval_version(self) -> str:
        """The version string the approval request names (what a reviewer's tab sends back)."""
        return report_version_label(self.version)


def report_version_label(version: int) -> str:
    return f"report-v{version}"


def report_number(label: str) -> int:
    """``report-v3`` → 3: the inverse of ``report_version_label``."""
    return int(label.removeprefix("report-v"))
