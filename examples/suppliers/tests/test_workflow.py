"""The supplier-assessment workflow end to end: a real Celery worker (with beat) advances the run
on PostgreSQL; people act here through the services and approvals' decide()."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals import ApprovalRefused, RefusalCode, decide
from approvals.models import ApprovalRequest, ApprovalStatus, DecisionAction, DecisionLog
from examples.suppliers import services
from examples.suppliers.models import AssessmentReport, AssessmentStatus, SupplierAssessment
from tests.factories import Users
from tests.support import Worker, wait_for, wait_for_terminal
from workflows import public as wf
from workflows.models import RunStatus, StepResult, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

# Two shared cores and other suites running beside this one: waits are generous.
WAIT = 120.0


def submit(assessment: SupplierAssessment, by: User, **data: object) -> WorkflowRun:
    """The requester submits the input; the run that starts."""
    services.assessment_submit_input(assessment_id=assessment.pk, by=by, data=dict(data))
    run = SupplierAssessment.objects.get(pk=assessment.pk).run
    assert run is not None
    return run


def review_pending(assessment: SupplierAssessment, *, number: int = 1) -> ApprovalRequest:
    """Once the run waits for its ``number``-th review request: that request."""

    def ready() -> ApprovalRequest | None:
        row = SupplierAssessment.objects.select_related("run").get(pk=assessment.pk)
        requests = list(ApprovalRequest.objects.filter(subject_id=str(assessment.pk)).order_by("id"))
        if row.run is None or len(requests) < number or row.run.status != RunStatus.WAITING:
            return None
        latest = requests[-1]
        return latest if row.run.wait_event_type == latest.event_type else None

    return wait_for(ready, timeout=WAIT, what=f"review request #{number} of assessment {assessment.pk}")


def review(assessment: SupplierAssessment, by: User, *, approve: bool, report_version: int, note: str = "") -> None:
    """A reviewer decides the report version their page shows, through the assessment's service."""
    services.assessment_review(
        assessment_id=assessment.pk, by=by, approve=approve, report_version=report_version, note=note
    )


def outcome_of(run: WorkflowRun) -> Any:
    """Once the run has completed: its result."""
    done = wait_for_terminal(run.id, timeout=WAIT)
    assert done.status == RunStatus.COMPLETED, done.error
    return done.result


def status(assessment: SupplierAssessment) -> str:
    return str(SupplierAssessment.objects.get(pk=assessment.pk).status)


def test_input_to_approval_of_report_v1(worker: Worker, users: Users, assessment: SupplierAssessment) -> None:
    # when alice submits her assessment's input
    run = submit(assessment, users.alice, scope="tier 1")

    # then the run builds report v1 from the revisions it gathered, and asks for a review of that version
    request = review_pending(assessment)
    report = AssessmentReport.objects.get(assessment=assessment)
    assert (report.version, report.source_revisions) == (1, {"companies-house": 1, "sanctions": 1})
    assert report.body["input"] == {"scope": "tier 1"}
    assert (request.version, request.approvers, request.content) == ("report-v1", "supplier-reviewers", report.body)
    assert (request.subject_type, request.subject_id) == ("suppliers.supplierassessment", str(assessment.pk))
    assert request.requested_by == users.alice
    assert status(assessment) == AssessmentStatus.READY_FOR_REVIEW

    # when carol, a reviewer, approves it
    review(assessment, users.carol, approve=True, report_version=1)

    # then the run completes, and the assessment is approved by carol, at that version, with one report
    assert outcome_of(run) == {"outcome": "approved", "report_version": 1}
    row = SupplierAssessment.objects.get(pk=assessment.pk)
    assert (row.status, row.decided_by, row.decided_version) == (AssessmentStatus.APPROVED, users.carol, 1)
    assert AssessmentReport.objects.filter(assessment=assessment).count() == 1


def test_neither_the_requester_nor_an_outsider_may_review(
    worker: Worker, users: Users, assessment: SupplierAssessment
) -> None:
    # given alice's assessment waiting for review, and alice in the reviewers' group too
    submit(assessment, users.alice, scope="tier 1")
    review_pending(assessment)
    users.alice.groups.add(*users.carol.groups.all())

    for who, code in (("alice", RefusalCode.FOUR_EYES), ("mallory", RefusalCode.NOT_AUTHORISED)):
        # when she, then mallory, approve it
        with pytest.raises(ApprovalRefused) as refused:
            review(assessment, getattr(users, who), approve=True, report_version=1)

        # then four eyes refuses alice, and mallory is no reviewer
        assert refused.value.code == code
    # and the assessment still waits for a review
    assert status(assessment) == AssessmentStatus.READY_FOR_REVIEW


def test_a_source_revised_during_review_supersedes_v1_and_a_stale_tab_is_refused(
    worker: Worker,
    users: Users,
    assessment: SupplierAssessment,
) -> None:
    # given report v1 under review
    run = submit(assessment, users.alice)
    first = review_pending(assessment)
    assert first.version == "report-v1"

    # when its evidence changes while the review is pending
    services.source_record_add(assessment_id=assessment.pk, source="sanctions", content={"hits": 1}, by=users.alice)

    # then the review of v1 is superseded in that commit, saying why
    assert ApprovalRequest.objects.get(pk=first.pk).status == ApprovalStatus.SUPERSEDED
    log = DecisionLog.objects.get(request=first, action=DecisionAction.SUPERSEDE)
    assert "source sanctions revised (revision 2)" in log.message
    # and bob, approving the v1 his tab shows, is refused at once
    with pytest.raises(ApprovalRefused) as late:
        decide(first, by=users.bob, approve=True, version="report-v1")
    assert late.value.code == RefusalCode.NOT_PENDING
    # and the run builds report v2 from the new revision and asks for a review of that
    second = review_pending(assessment, number=2)
    assert second.version == "report-v2" and second.replaces_id == first.pk
    v2 = AssessmentReport.objects.get(assessment=assessment, version=2)
    assert v2.source_revisions == {"companies-house": 1, "sanctions": 2}
    assert second.content == v2.body
    assert status(assessment) == AssessmentStatus.READY_FOR_REVIEW

    # when carol decides from a tab opened on report v1
    with pytest.raises(ApprovalRefused) as stale:
        review(assessment, users.carol, approve=True, report_version=1)
    with pytest.raises(ApprovalRefused) as old:
        decide(first, by=users.carol, approve=True, version="report-v1")

    # then she is told to review the current version; posting to the old request says it was
    # superseded, and by which
    assert stale.value.code == RefusalCode.STALE_VERSION
    assert "review the current version" in str(stale.value)
    assert old.value.code == RefusalCode.NOT_PENDING and old.value.superseded_by == second.pk
    assert "review the current version" in str(old.value)
    # and nothing changed: v2 is still pending, the run still waits for it
    assert ApprovalRequest.objects.get(pk=second.pk).status == ApprovalStatus.PENDING
    assert review_pending(assessment, number=2).pk == second.pk

    # when she approves v2, then the assessment is approved at version 2
    decide(second, by=users.carol, approve=True, version="report-v2")
    assert outcome_of(run) == {"outcome": "approved", "report_version": 2}
    row = SupplierAssessment.objects.get(pk=assessment.pk)
    assert (row.status, row.decided_version) == (AssessmentStatus.APPROVED, 2)


def test_a_rejection_rejects_the_assessment(worker: Worker, users: Users, assessment: SupplierAssessment) -> None:
    # given report v1 under review
    run = submit(assessment, users.alice)
    review_pending(assessment)

    # when bob rejects it
    review(assessment, users.bob, approve=False, report_version=1, note="sanctions evidence is too old")

    # then the run completes with that outcome, and the assessment is rejected by bob
    assert outcome_of(run) == {"outcome": "rejected", "report_version": 1}
    row = SupplierAssessment.objects.get(pk=assessment.pk)
    assert (row.status, row.decided_by, row.decided_version) == (AssessmentStatus.REJECTED, users.bob, 1)


def test_no_decision_in_time_fails_the_assessment(worker: Worker, users: Users, assessment: SupplierAssessment) -> None:
    # given reviewers who have two seconds
    services.assessment_submit_input(assessment_id=assessment.pk, by=users.alice, data={}, review_timeout_seconds=2)
    run = SupplierAssessment.objects.get(pk=assessment.pk).run
    assert run is not None

    # when nobody decides, and beat's sweeper fires the expiry timer
    result = outcome_of(run)

    # then the assessment fails, and its review expired
    assert result == {"outcome": "failed", "reason": "review expired"}
    row = SupplierAssessment.objects.get(pk=assessment.pk)
    assert (row.status, row.failure_reason) == (AssessmentStatus.FAILED, "no reviewer decided in time")
    assert ApprovalRequest.objects.get(subject_id=str(assessment.pk)).status == ApprovalStatus.EXPIRED


def test_terminating_the_run_fails_the_assessment(worker: Worker, users: Users, assessment: SupplierAssessment) -> None:
    # given report v1 under review, for alice whose account has a support agent
    from accounts.services import account_ensure
    from agents.models import Agent
    from agents.selectors import agent_get

    account_ensure(slug="acme", members=[users.alice])
    agent = agent_get(user=users.alice, kind="support", name="help")
    assert agent is not None
    run = submit(assessment, users.alice)
    request = review_pending(assessment)

    # when staff terminate the run
    wf.terminate(run)

    # then the assessment fails, saying why, and its review is cancelled
    row = SupplierAssessment.objects.get(pk=assessment.pk)
    assert (row.status, row.failure_reason) == (AssessmentStatus.FAILED, "the workflow run was terminated")
    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.CANCELLED
    # and alice's chat hears it could not be completed (the run's own last report never comes)
    entry = Agent.objects.get(pk=agent.pk).state["assessments"][str(assessment.pk)]
    assert entry == {"supplier": assessment.supplier_name, "status": "could not be completed"}


def test_a_restarted_run_gathers_again_and_asks_for_the_new_report(
    worker: Worker,
    users: Users,
    assessment: SupplierAssessment,
) -> None:
    # given report v1 under review
    run = submit(assessment, users.alice)
    first = review_pending(assessment)

    # when staff restart the run
    wf.restart(run)

    # then the pending review of attempt 1 is cancelled; attempt 2 gathers again and builds report v2
    second = review_pending(assessment, number=2)
    assert ApprovalRequest.objects.get(pk=first.pk).status == ApprovalStatus.CANCELLED
    assert (second.version, second.attempt) == ("report-v2", 2)
    assert AssessmentReport.objects.get(assessment=assessment, version=2).source_revisions == {
        "companies-house": 1,
        "sanctions": 1,
    }
    # and the old review is refused as cancelled, the new one approves the assessment
    with pytest.raises(ApprovalRefused) as old:
        decide(first, by=users.carol, approve=True, version="report-v1")
    assert old.value.code == RefusalCode.NOT_PENDING and "cancelled" in str(old.value)
    decide(second, by=users.carol, approve=True, version="report-v2")
    run = wait_for_terminal(run.id, timeout=WAIT)
    assert run.result == {"outcome": "approved", "report_version": 2}, run.error
    assert status(assessment) == AssessmentStatus.APPROVED


def test_a_run_started_for_someone_elses_assessment_touches_nothing(
    worker: Worker, users: Users, assessment: SupplierAssessment
) -> None:
    """Even started behind the API's back (the API refuses it: not public), the workflow acts only
    on the assessment whose run it is: mallory's run naming alice's assessment fails at once."""
    from workflows.services import run_start

    # when mallory starts a run of her own naming alice's assessment, which awaits alice's input
    run, _ = run_start(
        workflow="supplier-assessment",
        owner=users.mallory,
        payload={"assessment_id": assessment.pk, "requested_by_id": users.mallory.pk},
    )

    # then the run fails, and nothing of alice's moved
    done = wait_for_terminal(run.id, timeout=WAIT)
    assert done.error is not None, done.status
    assert done.status == RunStatus.FAILED and "belongs to another run" in done.error["message"]
    assert status(assessment) == AssessmentStatus.AWAITING_INPUT  # not moved to gathering evidence
    assert not AssessmentReport.objects.filter(assessment=assessment).exists()
    assert not ApprovalRequest.objects.filter(run=run).exists()


def test_the_requesters_chat_hears_each_change_once(
    worker: Worker, users: Users, assessment: SupplierAssessment
) -> None:
    """alice's account has a support agent: her assessment's run tells that chat where it stands."""
    from accounts.services import account_ensure
    from agents.models import Agent
    from agents.selectors import agent_get

    # given alice's account acme and its support agent
    account_ensure(slug="acme", members=[users.alice])
    agent = agent_get(user=users.alice, kind="support", name="help")
    assert agent is not None

    def told() -> Any:
        return Agent.objects.get(pk=agent.pk).state.get("assessments", {}).get(str(assessment.pk))

    # when she submits the input, the report is ready for review, and carol approves it
    run = submit(assessment, users.alice, scope="tier 1")
    assert run.payload["agent"] == agent.pk
    review_pending(assessment)
    assert wait_for(lambda: (t := told()) and t["status"] == "ready for review" and t, timeout=WAIT) == {
        "supplier": "Acme Metals",
        "status": "ready for review",
    }
    review(assessment, users.carol, approve=True, report_version=1)

    # then the chat says approved, having been told each change once, in order
    assert outcome_of(run) == {"outcome": "approved", "report_version": 1}
    assert told() == {"supplier": "Acme Metals", "status": "approved"}
    steps = StepResult.objects.filter(run=run, name__startswith="tell the chat").order_by("position")
    assert list(steps.values_list("name", flat=True)) == [
        "tell the chat: submitted",
        "tell the chat: ready for review",
        "tell the chat: approved",
    ]
    assert Agent.objects.get(pk=agent.pk).state_version == 3


def test_a_requester_without_an_account_agent_is_told_nothing(
    worker: Worker, users: Users, assessment: SupplierAssessment
) -> None:
    # given alice in an account with no agent: the run names none, and takes no step to tell one
    from accounts.services import account_ensure

    account_ensure(slug="acme", members=[users.alice])

    run = submit(assessment, users.alice)
    review_pending(assessment)
    review(assessment, users.bob, approve=False, report_version=1)

    assert outcome_of(run) == {"outcome": "rejected", "report_version": 1}
    assert "agent" not in run.payload
    assert not StepResult.objects.filter(run=run, name__startswith="tell the chat").exists()
