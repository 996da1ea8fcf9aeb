"""Writes on supplier assessments. Each service is one transaction and locks the assessment row
first, so source revisions are numbered one at a time and a transition never races another.

People call ``assessment_create``, ``source_record_add``, ``assessment_submit_input`` and
``assessment_review``; the workflow (``examples.suppliers.workflows``) calls the rest from its steps.
A refusal raises before anything is written: ``PermissionDenied`` (who), ``AssessmentStateError``
(when).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.contrib.auth.models import User as DjangoUser
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Max
from django_fsm import can_proceed, has_transition_perm

from approvals import Proposal, decide, supersede_pending
from approvals.models import DecisionChannel
from approvals.services import Decided
from examples.chat import account_agent
from examples.suppliers.models import (
    SOURCE_NAME_MAX,
    SUBJECT_TYPE,
    TERMINAL,
    AssessmentReport,
    AssessmentStatus,
    SourceRecord,
    SupplierAssessment,
    is_requester,
    is_reviewer,
    report_version_label,
)
from examples.suppliers.selectors import current_report, decided_review, pending_review
from workflows.models import WorkflowRun
from workflows.services import count_with_user_locked, run_start

WORKFLOW = "supplier-assessment"

User = AbstractUser | AnonymousUser
MAX_REVIEW_TIMEOUT_SECONDS = 90 * 24 * 3600


class AssessmentStateError(Exception):
    """The assessment's state does not allow this (e.g. revising evidence of a closed assessment)."""


class TooMany(Exception):
    """Past SUPPLIER_MAX_OPEN_ASSESSMENTS of a requester or SUPPLIER_MAX_SOURCE_RECORDS of an
    assessment (the API's 429): whoever may add evidence could otherwise fill the database."""


def check_open_assessments(requester: DjangoUser) -> None:
    """TooMany if ``requester`` has SUPPLIER_MAX_OPEN_ASSESSMENTS open. Inside the transaction that
    creates one: the requester's row is locked, so assessments asked for together are counted one
    after the other."""
    limit = int(settings.SUPPLIER_MAX_OPEN_ASSESSMENTS)
    if not limit:
        return
    assessments = SupplierAssessment.objects.filter(requested_by=requester).exclude(status__in=TERMINAL)
    open_ones = count_with_user_locked(requester, assessments)
    if open_ones >= limit:
        raise TooMany(
            f"you have {open_ones} supplier assessments open (the limit is {limit}); ask for more once some are decided"
        )


def check_source_records(*, held: int, adding: int) -> None:
    """TooMany if an assessment that holds ``held`` source records would pass
    SUPPLIER_MAX_SOURCE_RECORDS with ``adding`` more."""
    limit = int(settings.SUPPLIER_MAX_SOURCE_RECORDS)
    if limit and held + adding > limit:
        raise TooMany(
            f"an assessment holds at most {limit} source records (sources and their revisions); this one holds {held}"
        )


class InvalidSourceName(ValueError):
    """A source name that is empty, only whitespace, or longer than SOURCE_NAME_MAX."""


def check_source_name(source: str) -> None:
    """A source is named by 1 to SOURCE_NAME_MAX characters, not only whitespace (the API's schema
    states the same as a pattern), or InvalidSourceName."""
    if not source.strip() or len(source) > SOURCE_NAME_MAX:
        raise InvalidSourceName(f"Source names are 1 to {SOURCE_NAME_MAX} characters, not only whitespace.")


def _locked(assessment_id: int) -> SupplierAssessment:
    """The assessment row, locked, after its run's row: the engine's terminate (whose hook fails the
    assessment) and approvals' services lock the run first, so one order everywhere, no deadlock."""
    run_id = SupplierAssessment.objects.filter(pk=assessment_id).values_list("run_id", flat=True).get()
    if run_id is not None:
        WorkflowRun.objects.select_for_update().filter(pk=run_id).first()
    return SupplierAssessment.objects.select_for_update().get(pk=assessment_id)


def _check(assessment: SupplierAssessment, name: str, by: User | None) -> None:
    """The transition ``name`` is allowed now, for ``by`` (a person) or for the engine (None)."""
    bound = getattr(assessment, name)
    if not can_proceed(bound):
        raise AssessmentStateError(f"assessment {assessment.pk} is {assessment.status}: it cannot {name}")
    if by is not None and not has_transition_perm(bound, by):
        raise PermissionDenied(f"{by} may not {name} assessment {assessment.pk}")


# --- what people do --------------------------------------------------------------------------------
def assessment_create(
    *,
    supplier_name: str,
    requested_by: DjangoUser,
    sources: dict[str, Any] | None = None,
) -> SupplierAssessment:
    """A new assessment awaiting input, with revision 1 of each of ``sources`` ({source: content}).
    ValueError for an empty name; InvalidSourceName (a ValueError) for a bad source name."""
    if not supplier_name.strip():
        raise ValueError("the supplier's name may not be empty")
    for source in sources or {}:
        check_source_name(source)
    check_source_records(held=0, adding=len(sources or {}))
    with transaction.atomic():
        check_open_assessments(requested_by)
        assessment = SupplierAssessment.objects.create(supplier_name=supplier_name.strip(), requested_by=requested_by)
        for source, content in (sources or {}).items():
            SourceRecord.objects.create(
                assessment=assessment, source=source, revision=1, content=content, created_by_id=requested_by.pk
            )
    return assessment


def source_record_add(*, assessment_id: int, source: str, content: Any, by: User) -> SourceRecord:
    """Add a source, or revise one: a new row with the next revision (earlier ones stay as they were).

    The requester and reviewers may; not once the assessment is closed (approved, rejected, failed)
    or its review decided.
    A revision during review supersedes the pending review in the same commit: the workflow builds
    the next report version and asks for a review of that, and a reviewer's page still showing the
    older report is refused.
    """
    check_source_name(source)
    with transaction.atomic():
        assessment = _locked(assessment_id)
        if not (is_requester(by, assessment) or is_reviewer(by, assessment)):
            raise PermissionDenied(f"{by} may not change the evidence of assessment {assessment.pk}")
        if assessment.is_closed:
            raise AssessmentStateError(f"assessment {assessment.pk} is {assessment.status}: its evidence is final")
        decided = decided_review(assessment)
        if decided is not None:
            # The decision is being applied: a revision now would be neither reviewed nor refused.
            raise AssessmentStateError(
                f"assessment {assessment.pk}'s {decided.version} was {decided.status}: its evidence is final"
            )
        check_source_records(held=assessment.source_records.count(), adding=1)
        latest = assessment.source_records.filter(source=source).aggregate(n=Max("revision"))["n"] or 0
        record = SourceRecord.objects.create(
            assessment=assessment, source=source, revision=latest + 1, content=content, created_by_id=by.pk
        )
        supersede_pending((SUBJECT_TYPE, assessment.pk), reason=f"source {source} revised (revision {record.revision})")
        return record


def assessment_submit_input(
    *,
    assessment_id: int,
    by: User,
    data: dict[str, Any],
    review_timeout_seconds: float | None = None,
) -> SupplierAssessment:
    """The requester submits the input: the workflow run starts (owned by the requester) in the same
    commit as the assessment records it. Only once: the transition requires that there is no run.
    ``review_timeout_seconds``: how long reviewers have (the workflow's default is 7 days)."""
    if review_timeout_seconds is not None and not 0 < review_timeout_seconds <= MAX_REVIEW_TIMEOUT_SECONDS:
        raise ValueError(f"the review timeout must be between 0 and {MAX_REVIEW_TIMEOUT_SECONDS} seconds (90 days)")
    with transaction.atomic():
        assessment = _locked(assessment_id)
        _check(assessment, "submit_input", by)
        if not assessment.source_records.exists():
            raise AssessmentStateError(f"assessment {assessment.pk} has no source records to assess")
        assessment.submit_input(data=data)
        owner = get_user_model().objects.get(pk=assessment.requested_by_id)
        # run_start nests its atomic() in this one and defers its enqueue to our commit.
        payload: dict[str, Any] = {"assessment_id": assessment.pk, "requested_by_id": owner.pk}
        if review_timeout_seconds is not None:
            payload["review_timeout_seconds"] = review_timeout_seconds
        if (agent_id := account_agent(owner)) is not None:
            payload["agent"] = agent_id  # the run tells the requester's chat where it stands
        run, _ = run_start(
            workflow=WORKFLOW, owner=owner, payload=payload, idempotency_key=f"supplier-assessment:{assessment.pk}"
        )
        assessment.run = run
        assessment.save()
    return assessment


def assessment_review(
    *,
    assessment_id: int,
    by: User,
    approve: bool,
    report_version: int,
    note: str = "",
    channel: str = DecisionChannel.PYTHON,
) -> Decided:
    """A reviewer's decision on the report version their page showed. Goes through approvals'
    ``decide``: a page opened on an older version than the one pending is refused (stale_version,
    "review the current version"), as is anyone outside the reviewers group, and the requester."""
    request = pending_review(assessment_id)
    if request is None:
        raise AssessmentStateError(f"assessment {assessment_id} has no review pending")
    return decide(
        request, by=by, approve=approve, version=report_version_label(report_version), note=note, channel=channel
    )


# --- what the workflow does (each inside an atomic step) --------------------------------------------
def assessment_start_gathering(*, assessment_id: int) -> str:
    with transaction.atomic():
        assessment = _locked(assessment_id)
        if assessment.status == AssessmentStatus.GATHERING_EVIDENCE:
            return str(assessment.status)  # already moved (a step retried after its commit)
        _check(assessment, "start_gathering", None)
        assessment.start_gathering()
        assessment.save()
        return str(assessment.status)


def current_revisions(assessment: SupplierAssessment) -> dict[str, int]:
    """{source: latest revision}: what a report built now would use."""
    rows = assessment.source_records.values("source").annotate(latest=Max("revision")).order_by("source")
    return {row["source"]: int(row["latest"]) for row in rows}


def sources_gather(*, assessment_id: int) -> dict[str, int]:
    """The evidence the report will use: the latest revision of each source, remembered by the step."""
    assessment = SupplierAssessment.objects.get(pk=assessment_id)
    revisions = current_revisions(assessment)
    if not revisions:
        raise AssessmentStateError(f"assessment {assessment_id} has no source records")
    return revisions


def _build(assessment: SupplierAssessment, revisions: dict[str, int]) -> AssessmentReport:
    """Write the next report version from exactly these revisions. Call with the assessment locked."""
    records = {(r.source, r.revision): r for r in assessment.source_records.all()}
    latest = assessment.reports.aggregate(n=Max("version"))["n"] or 0
    version = latest + 1
    body = {
        "supplier": assessment.supplier_name,
        "version": version,
        "input": assessment.input,
        "sources": [
            {"source": source, "revision": revision, "content": records[(source, revision)].content}
            for source, revision in sorted(revisions.items())
        ],
    }
    return AssessmentReport.objects.create(
        assessment=assessment, version=version, body=body, source_revisions=revisions
    )


def report_generate(*, assessment_id: int, revisions: dict[str, int]) -> int:
    """Report version n from the gathered revisions; returns n."""
    with transaction.atomic():
        assessment = _locked(assessment_id)
        return _build(assessment, revisions).version


def report_current(*, assessment_id: int) -> Proposal:
    """What reviewers must approve now (approve_current's ``load``): the latest report, regenerated
    first as a new version if any source was revised since it was built."""
    with transaction.atomic():
        assessment = _locked(assessment_id)
        report = current_report(assessment)
        revisions = current_revisions(assessment)
        if report is None or report.source_revisions != revisions:
            report = _build(assessment, revisions)
        return Proposal(
            version=report.approval_version,
            content=report.body,
            summary=f"Approve the assessment of {assessment.supplier_name} (report v{report.version})",
        )


def assessment_mark_ready(*, assessment_id: int) -> str:
    with transaction.atomic():
        assessment = _locked(assessment_id)
        if assessment.status == AssessmentStatus.READY_FOR_REVIEW:
            return str(assessment.status)
        _check(assessment, "mark_ready", None)
        assessment.mark_ready()
        assessment.save()
        return str(assessment.status)


def assessment_decide(*, assessment_id: int, approve: bool, by_id: int, version: int) -> str:
    """Apply the reviewer's decision (taken through approvals) with that reviewer's permission."""
    with transaction.atomic():
        assessment = _locked(assessment_id)
        by = get_user_model().objects.get(pk=by_id)
        name = "approve" if approve else "reject"
        _check(assessment, name, by)
        getattr(assessment, name)(by_id=by_id, version=version)
        assessment.save()
        return str(assessment.status)


def fail_for_ended_run(run: WorkflowRun) -> None:
    """``workflows.hooks.on_run_terminated`` and ``on_run_failed`` (registered in
    SuppliersConfig.ready), called inside the transaction that ended the run: an assessment whose run
    was stopped for good, or failed by the engine, can no longer be decided, so it fails rather than
    sit "ready for review" forever, and the requester's chat (if the run names one) hears it could
    not be completed (the run's own last report will never come)."""
    from examples.chat import agent_of
    from examples.suppliers.workflows import NOT_COMPLETED, report_status

    why = "the workflow run was terminated" if run.status == "terminated" else "the workflow run failed"
    agent_id = agent_of(run.payload) if isinstance(run.payload, dict) else None
    for assessment_id in SupplierAssessment.objects.filter(run=run).values_list("pk", flat=True):
        if assessment_fail(assessment_id=assessment_id, reason=why) == AssessmentStatus.FAILED and agent_id:
            report_status(agent_id, assessment_id, NOT_COMPLETED)


def assessment_fail(*, assessment_id: int, reason: str) -> str:
    with transaction.atomic():
        assessment = _locked(assessment_id)
        if assessment.is_closed:
            return str(assessment.status)  # a decision or an earlier failure stands
        _check(assessment, "fail", None)
        assessment.fail(reason=reason)
        assessment.save()
        return str(assessment.status)
