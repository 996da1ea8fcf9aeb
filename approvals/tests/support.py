"""Helpers of the approvals tests: runs waiting for a request, and what a refusal must not change."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from workflows.conf import conf
from workflows.models import RunAttempt, RunEvent, RunStatus, WorkflowRun

GROUP = "refund-approvers"


def waiting_request(
    *,
    requested_by: User | None = None,
    version: str = "v1",
    status: str = ApprovalStatus.PENDING,
    approvers: str = GROUP,
    expires_in: timedelta = timedelta(hours=1),
    content: Any = None,
    run_status: str = RunStatus.WAITING,
    subject_type: str = "shop.order",
    subject_id: str = "1042",
    **fields: Any,
) -> ApprovalRequest:
    """A run waiting for a new request, as wait_for_approval leaves them (rows created directly;
    status is a protected FSM field, so it is set once at creation, as a fixture of any state).

    The run's workflow is test.wait: if a worker ever advanced it (a transactional test's commit,
    then the session worker's sweeper), it would only wait for "reply".
    """
    run = WorkflowRun.objects.create(workflow="test.wait", status=run_status, queue=conf()["QUEUE"])
    RunAttempt.objects.create(run=run, number=1)
    request = ApprovalRequest.objects.create(
        run=run,
        attempt=1,
        step_name="refund approval",
        subject_type=subject_type,
        subject_id=subject_id,
        version=version,
        summary="Refund £120 on order 1042",
        content=content if content is not None else {"order": 1042, "amount": "120.00", "version": version},
        requested_by=requested_by,
        approvers=approvers,
        status=status,
        expires_at=timezone.now() + expires_in,
        **fields,
    )
    if run_status == RunStatus.WAITING:
        WorkflowRun.objects.filter(pk=run.pk).update(
            wait_event_type=request.event_type,
            wait_step="refund approval: decision",
            wake_at=request.expires_at,
        )
    return request


def state(request: ApprovalRequest) -> tuple[Any, ...]:
    """Everything a refused decision must leave as it was: the request, its run and its events."""
    request = ApprovalRequest.objects.get(pk=request.pk)
    run = WorkflowRun.objects.get(pk=request.run_id)
    return (
        request.status,
        request.decided_by_id,
        request.decided_at,
        request.note,
        run.status,
        run.wait_event_type,
        RunEvent.objects.filter(run=run).count(),
    )


def assert_still_waiting(request: ApprovalRequest, before: tuple[Any, ...]) -> None:
    assert state(request) == before
    run = WorkflowRun.objects.get(pk=request.run_id)
    if before[0] == ApprovalStatus.PENDING and before[4] == RunStatus.WAITING:
        assert run.status == RunStatus.WAITING and run.wait_event_type == request.event_type
        assert not RunEvent.objects.filter(run=run).exists()
