"""wait_for_approval and approve_current end to end: runs advanced by a real Celery worker (with
beat, the sweeper that fires the expiry timers) on PostgreSQL; decisions made here."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from approvals import ApprovalRefused, RefusalCode, decide, supersede_pending
from approvals.models import ApprovalRequest, ApprovalStatus, DecisionAction, DecisionLog
from approvals.tests.support import GROUP
from tests.factories import Users
from tests.support import Worker, wait_for, wait_for_status, wait_for_terminal
from workflows import public as wf
from workflows.models import RunStatus, StepResult, StepStatus, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

# Two shared cores and other suites running beside this one: waits are generous.
WAIT = 90.0


def waiting_for_approval(run: WorkflowRun, *, pending: int = 1) -> ApprovalRequest:
    """Once the run waits for its ``pending``-th request: that request."""

    def ready() -> ApprovalRequest | None:
        current = WorkflowRun.objects.get(pk=run.pk)
        requests = list(ApprovalRequest.objects.filter(run=run).order_by("id"))
        if len(requests) < pending or current.status != RunStatus.WAITING:
            return None
        latest = requests[-1]
        return latest if current.wait_event_type == latest.event_type else None

    return wait_for(ready, timeout=WAIT, what=f"run {run.id} to wait for approval request #{pending}")


def test_an_approval_resumes_the_run(worker: Worker, users: Users) -> None:
    # given a run waiting for an approval bob asked for
    run = wf.start(
        "approvals.test.simple",
        {"approvers": GROUP, "requested_by": users.bob.pk, "content": {"order": 1042, "amount": "120.00"}},
    )
    request = waiting_for_approval(run)
    assert (request.version, request.summary, request.requested_by, request.content) == (
        "v1",
        "Refund £120 on order 1042",
        users.bob,
        {"order": 1042, "amount": "120.00"},
    )
    assert (request.subject_type, request.subject_id, request.step_name) == ("shop.order", "1042", "refund approval")
    # the run says what it waits for, and until when: the request's expiry (never before it)
    waiting = WorkflowRun.objects.get(pk=run.pk)
    assert waiting.wait_event_type == f"approval:{request.pk}"
    assert waiting.wake_at is not None
    assert timedelta(0) <= waiting.wake_at - request.expires_at < timedelta(seconds=1)

    # when carol approves
    decide(request, by=users.carol, approve=True, version="v1", note="ok")

    # then the run resumes and acts on the approval
    run = wait_for_terminal(run.id, timeout=WAIT)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result == {
        "outcome": "approved",
        "by": "carol",
        "version": "v1",
        "request": request.pk,
        "note": "ok",
        "done": f"acted on approval {request.pk}",
    }
    assert list(StepResult.objects.filter(run=run).order_by("position").values_list("name", "status")) == [
        ("refund approval: request", StepStatus.COMPLETED),
        ("refund approval: decision", StepStatus.COMPLETED),
        ("act", StepStatus.COMPLETED),
        ("who decided", StepStatus.COMPLETED),
    ]
    assert ApprovalRequest.objects.filter(run=run).count() == 1


def test_a_rejection_reaches_the_workflow_as_approval_rejected(worker: Worker, users: Users) -> None:
    run = wf.start("approvals.test.simple", {"approvers": GROUP})
    request = waiting_for_approval(run)

    decide(request, by=users.carol, approve=False, version="v1", note="over the limit")

    run = wait_for_terminal(run.id, timeout=WAIT)
    assert run.result == {"outcome": "rejected", "by": "carol", "note": "over the limit"}


def test_without_a_decision_in_time_the_request_expires(worker: Worker, users: Users) -> None:
    # given a request that expires in a second and a half
    run = wf.start("approvals.test.simple", {"approvers": GROUP, "timeout": 1.5})
    request = waiting_for_approval(run)

    # when nobody decides: the engine's timer (beat's sweeper) wakes the run
    run = wait_for_terminal(run.id, timeout=WAIT)

    # then the workflow handled ApprovalExpired, and the request is expired
    assert run.result == {"outcome": "expired", "request": request.pk}
    request.refresh_from_db()
    assert request.status == ApprovalStatus.EXPIRED
    assert DecisionLog.objects.filter(request=request, action=DecisionAction.EXPIRE).count() == 1
    steps = dict(StepResult.objects.filter(run=run).values_list("name", "status"))
    assert steps == {
        "refund approval: request": StepStatus.COMPLETED,
        "refund approval: decision": StepStatus.FAILED,  # the wait timed out
        "refund approval: expire": StepStatus.COMPLETED,
    }
    # and a decision now is refused naming the state
    with pytest.raises(ApprovalRefused) as info:
        decide(request, by=users.carol, approve=True, version="v1")
    assert info.value.code == RefusalCode.NOT_PENDING and "expired" in str(info.value)


def test_a_version_changed_after_approval_is_superseded_and_asked_again(
    worker: Worker, users: Users, tmp_path: Path
) -> None:
    # given a run waiting for approval of version 1 of a document
    document = tmp_path / "document.json"
    document.write_text(json.dumps({"version": "1", "title": "Q3 report", "body": "draft"}))
    run = wf.start("approvals.test.current", {"approvers": GROUP, "path": str(document)})
    first = waiting_for_approval(run)
    assert first.content is not None
    assert (first.version, first.summary, first.content["body"]) == ("1", "Publish Q3 report", "draft")

    # when the document changes while carol reviews, and she approves the version she saw
    document.write_text(json.dumps({"version": "2", "title": "Q3 report", "body": "final"}))
    decide(first, by=users.carol, approve=True, version="1")

    # then the workflow's re-check supersedes that approval and asks for the new version
    second = waiting_for_approval(run, pending=2)
    first.refresh_from_db()
    assert first.status == ApprovalStatus.SUPERSEDED
    assert second.content is not None
    assert (second.status, second.version, second.content["body"], second.replaces_id) == (
        ApprovalStatus.PENDING,
        "2",
        "final",
        first.pk,
    )
    # a decision on the old request is refused and points at the new one
    with pytest.raises(ApprovalRefused) as info:
        decide(first, by=users.erin, approve=True, version="1")
    assert info.value.superseded_by == second.pk and "review the current version" in str(info.value)

    # when the current version is approved, the run goes on with it
    decide(second, by=users.carol, approve=True, version="2")
    run = wait_for_terminal(run.id, timeout=WAIT)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result == {"version": "2", "request": second.pk, "by": "carol"}
    names = list(StepResult.objects.filter(run=run).order_by("position").values_list("name", flat=True))
    assert names == [
        "review: request",
        "review: decision",
        "review: re-check",
        "review: request#2",
        "review: decision#2",
        "review: re-check#2",
        "who decided",
    ]


def test_a_version_changed_while_pending_is_superseded_at_once_and_asked_again(
    worker: Worker, users: Users, tmp_path: Path
) -> None:
    # given a run waiting for approval of version 1 of a document
    document = tmp_path / "document.json"
    document.write_text(json.dumps({"version": "1", "title": "Q3 report", "body": "draft"}))
    run = wf.start("approvals.test.current", {"approvers": GROUP, "path": str(document)})
    first = waiting_for_approval(run)

    # when the document changes and the code that changed it says so
    document.write_text(json.dumps({"version": "2", "title": "Q3 report", "body": "final"}))
    assert supersede_pending(("test.document", "doc-1"), reason="body edited", current_version="2") == [first.pk]

    # then a reviewer still looking at version 1 is refused at once
    with pytest.raises(ApprovalRefused) as info:
        decide(first, by=users.carol, approve=True, version="1")
    assert info.value.code == RefusalCode.NOT_PENDING and "superseded" in str(info.value)
    # and the run, woken without any decision, asks for version 2
    second = waiting_for_approval(run, pending=2)
    assert second.content is not None
    assert (second.version, second.content["body"], second.replaces_id) == ("2", "final", first.pk)
    assert ApprovalRequest.objects.get(pk=first.pk).status == ApprovalStatus.SUPERSEDED
    with pytest.raises(ApprovalRefused) as info:
        decide(first, by=users.carol, approve=True, version="1")
    assert info.value.superseded_by == second.pk and "review the current version" in str(info.value)

    decide(second, by=users.carol, approve=True, version="2")
    run = wait_for_terminal(run.id, timeout=WAIT)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result == {"version": "2", "request": second.pk, "by": "carol"}
    names = list(StepResult.objects.filter(run=run).order_by("position").values_list("name", flat=True))
    assert names == [
        "review: request",
        "review: decision",
        "review: request#2",
        "review: decision#2",
        "review: re-check",
        "who decided",
    ]


def test_wait_for_approval_raises_approval_superseded_into_the_workflow(worker: Worker, users: Users) -> None:
    run = wf.start("approvals.test.simple", {"approvers": GROUP})
    request = waiting_for_approval(run)

    supersede_pending(("shop.order", 1042), reason="order cancelled", current_version="v2")

    run = wait_for_terminal(run.id, timeout=WAIT)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result == {
        "outcome": "superseded",
        "request": request.pk,
        "version": "v1",
        "current_version": "v2",
        "reason": "order cancelled",
    }
    assert not StepResult.objects.filter(run=run, name="act").exists()


def test_terminating_a_waiting_run_cancels_its_request(worker: Worker, users: Users) -> None:
    run = wf.start("approvals.test.simple", {"approvers": GROUP})
    request = waiting_for_approval(run)

    wf.terminate(run)  # its hook cancels the run's pending requests in the same transaction

    request.refresh_from_db()
    assert request.status == ApprovalStatus.CANCELLED
    with pytest.raises(ApprovalRefused) as info:
        decide(request, by=users.carol, approve=True, version="v1")
    assert "cancelled" in str(info.value)
    assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.TERMINATED
    assert wait_for_status(run.id, RunStatus.TERMINATED).events.count() == 0
