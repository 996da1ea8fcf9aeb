"""Reads: what a caller may see of runs, and the shapes the interfaces show."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict
from uuid import UUID

from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.timesince import timeuntil

from workflows.exceptions import UnknownWorkflow
from workflows.models import TERMINAL, TIMED, RunAttempt, RunEvent, RunStatus, StepResult, WorkflowRun
from workflows.registry import get_workflow, view_permissions


def can_see_all_runs(user: AbstractUser | AnonymousUser) -> bool:
    return bool(user.is_authenticated and user.is_staff and user.has_perm("workflows.view_workflowrun"))


def can_control_all_runs(user: AbstractUser | AnonymousUser) -> bool:
    return bool(user.is_authenticated and user.is_staff and user.has_perm("workflows.control_workflowrun"))


def can_control_run(user: AbstractUser | AnonymousUser, run: WorkflowRun) -> bool:
    """Pause, resume, terminate, restart or send events to ``run``: staff with the control
    permission, or its owner if its workflow is public. A private workflow's run belongs to a
    process with its own service (a refund, an assessment), which its customer drives through that
    service: stopping or restarting it midway would leave the process half done, for staff to
    reconcile (a refund terminated while its outcome is unknown)."""
    if can_control_all_runs(user):
        return True
    return run.owner_id is not None and run.owner_id == user.pk and is_public(run.workflow)


def is_public(workflow: str) -> bool:
    """Whether ``workflow`` is registered and public (``@workflow(name, public=True)``)."""
    try:
        return get_workflow(workflow).public
    except UnknownWorkflow:
        return False


def run_list_all(*, status: str | None = None, workflow: str | None = None) -> QuerySet[WorkflowRun]:
    """Every run (of ``status`` and ``workflow``, if given), newest first: for a caller who sees
    them all, such as the command line. A person's view is ``run_list``."""
    runs = WorkflowRun.objects.all()
    if status:
        runs = runs.filter(status=status)
    if workflow:
        runs = runs.filter(workflow=workflow)
    return runs


def run_list(
    *, user: AbstractUser | AnonymousUser, status: str | None = None, workflow: str | None = None
) -> QuerySet[WorkflowRun]:
    """Runs the user may see: their own, or all for staff with the view permission; of a workflow
    with a ``view_permission``, only if the user has it too (see ``hidden_workflows``)."""
    runs = run_list_all(status=status, workflow=workflow)
    if not user.is_authenticated:
        return runs.none()
    if not can_see_all_runs(user):
        runs = runs.filter(owner_id=user.pk)
    if hidden := hidden_workflows(user):
        runs = runs.exclude(workflow__in=hidden)
    return runs


def hidden_workflows(user: AbstractUser | AnonymousUser) -> list[str]:
    """The workflows whose runs ``user`` may not see, whoever owns them: those registered with a
    ``view_permission`` the user lacks. A chat turn's run holds the conversation in its steps, so
    it is not for its owner once they leave the account, nor for staff who may read runs but not
    the agents' conversations."""
    return sorted(name for name, permission in view_permissions().items() if not user.has_perm(permission))


def run_get(*, user: AbstractUser | AnonymousUser, run_id: UUID | str) -> WorkflowRun | None:
    """The run if the user may see it; None both when it does not exist and when it is another's."""
    try:
        return run_list(user=user).get(pk=run_id)
    except (WorkflowRun.DoesNotExist, ValueError, ValidationError):
        return None


def run_get_any(*, run_id: UUID) -> WorkflowRun | None:
    """Any run, with its owner, for a caller who sees them all (the command line); None if there
    is no such run. A person's view is ``run_get``."""
    return WorkflowRun.objects.select_related("owner").filter(pk=run_id).first()


def run_attempts(*, run: WorkflowRun) -> QuerySet[RunAttempt]:
    """The run's attempts, oldest (number 1) first."""
    return RunAttempt.objects.filter(run=run).order_by("number")


def run_events(*, run: WorkflowRun) -> QuerySet[RunEvent]:
    """The events sent to the run, in the order they arrived."""
    return RunEvent.objects.filter(run=run).order_by("created_at", "id")


def waiting_event_types() -> list[str]:
    """The event types waiting runs wait for, each once, sorted."""
    types = (
        WorkflowRun.objects.filter(status=RunStatus.WAITING)
        .exclude(wait_event_type="")
        .order_by("wait_event_type")
        .values_list("wait_event_type", flat=True)
        .distinct()
    )
    return list(types)


class StatusSummary(TypedDict):
    status: str
    attempt: int
    current_step: str
    waiting_for: dict[str, Any] | None
    pause_requested: bool
    terminal: bool
    failure_reason: str


def waiting_for(run: WorkflowRun) -> dict[str, Any] | None:
    """What a suspended run waits for and until when; None for a run that is not suspended (a run
    terminated or failed while it waited keeps its wait's fields, for the record, but waits no more)."""
    if run.status not in TIMED or (not run.wake_at and not run.wait_event_type):
        return None
    return {
        "step": run.wait_step,
        "event_type": run.wait_event_type or None,
        "until": run.wake_at.isoformat() if run.wake_at else None,
    }


def describe_wait(run: WorkflowRun, *, plain: bool = False, now: datetime | None = None) -> str:
    """What a suspended run waits for and until when, in words; empty for a run that is not
    suspended. For a page (the admin): ``event “reply” until 2030-01-01 12:00:00 (in 5 minutes)``.
    ``plain``, for a terminal (``manage.py workflows``): ``event 'reply' until 2030-01-01 12:00:00``, the
    name as a Python literal (a control character in it shows escaped) and short enough for a
    table cell.

    Gated on the status, not on the wait fields: only a sleeping, retrying or waiting run waits
    for anything, whatever its fields still hold.
    """
    if run.status not in TIMED:
        return ""
    if run.status == RunStatus.WAITING and run.wait_event_type:
        kind, name = "event", run.wait_event_type
    else:
        kind = {RunStatus.SLEEPING: "sleep", RunStatus.RETRYING: "retry of"}.get(RunStatus(run.status), "step")
        name = run.wait_step
    what = f"{kind} {name!r}" if plain else f"{kind} “{name}”"
    if run.wake_at is None:
        return what
    until = timezone.localtime(run.wake_at).strftime("%Y-%m-%d %H:%M:%S")
    if plain:
        return f"{what} until {until}"
    now = now or timezone.now()
    when = "overdue" if run.wake_at <= now else f"in {timeuntil(run.wake_at, now)}"
    return f"{what} until {until} ({when})"


def run_status_summary(*, run_id: UUID | str) -> StatusSummary | None:
    run = WorkflowRun.objects.filter(pk=run_id).first()
    return status_summary(run) if run is not None else None


def status_summary(run: WorkflowRun) -> StatusSummary:
    """The status event of the run's stream, from the run as it is in memory."""
    return {
        "status": run.status,
        "attempt": run.attempt,
        "current_step": run.current_step,
        "waiting_for": waiting_for(run),
        "pause_requested": run.pause_requested,
        "terminal": run.status in TERMINAL,
        "failure_reason": run.failure_reason,
    }


def step_timer(step: StepResult, run: WorkflowRun) -> datetime | None:
    """A step's timer (the end of a sleep or wait, the next try, a dispatched step's deadline) while
    it can still fire: None for a step of an ended run, or of an earlier attempt, which keeps the
    status it had when it stopped but will never be woken."""
    return step.wake_at if run.status not in TERMINAL and step.attempt == run.attempt else None


def run_timeline(*, run: WorkflowRun) -> list[dict[str, Any]]:
    """Every step of every attempt, oldest attempt first; a step's ``wake_at`` is ``step_timer``'s."""
    return [
        {
            "attempt": s.attempt,
            "position": s.position,
            "name": s.name,
            "kind": s.kind,
            "status": s.status,
            "tries": s.tries,
            "result": s.result,
            "error": s.error,
            "wake_at": timer.isoformat() if (timer := step_timer(s, run)) else None,
            "started_at": s.started_at.isoformat() if s.started_at else None,
            "finished_at": s.finished_at.isoformat() if s.finished_at else None,
        }
        for s in run.steps.order_by("attempt", "position")
    ]


class AttemptView(TypedDict):
    number: int
    status: str
    error: Any
    started_at: str | None
    finished_at: str | None


class RunSnapshot(StatusSummary):
    """The run as the page and the socket show it: its status summary and the rest."""

    id: str
    workflow: str
    progress: Any
    result: Any
    error: Any
    created_at: str
    started_at: str | None
    finished_at: str | None
    attempts: list[AttemptView]
    timeline: list[dict[str, Any]]


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def attempt_status(run: WorkflowRun, attempt: RunAttempt) -> str:
    """The attempt's status: the engine records it when the attempt ends; until then the run's
    status is the attempt's, and showing the stored "queued" beside a waiting run would be wrong."""
    if attempt.number == run.attempt and attempt.finished_at is None:
        return str(run.status)
    return attempt.status


def public_error(error: Any, *, user: AbstractUser | AnonymousUser) -> Any:
    """An error record as ``user`` may see it: the traceback (file paths, source lines) only for
    staff who may see all runs; a run's owner gets the type and message. The one rule for the API,
    the run page and its WebSocket."""
    if isinstance(error, dict) and "traceback" in error and not can_see_all_runs(user):
        return {key: value for key, value in error.items() if key != "traceback"}
    return error


def run_snapshot(*, run: WorkflowRun, user: AbstractUser | AnonymousUser) -> RunSnapshot:
    """Everything one row read (plus its steps and attempts) says about the run, as ``user`` may
    see it (``public_error``): the WebSocket snapshot and the run page."""
    timeline = run_timeline(run=run)
    for step in timeline:
        step["error"] = public_error(step["error"], user=user)
    return {
        "id": str(run.id),
        "workflow": run.workflow,
        "status": run.status,
        "attempt": run.attempt,
        "current_step": run.current_step,
        "waiting_for": waiting_for(run),
        "pause_requested": run.pause_requested,
        "terminal": run.status in TERMINAL,
        "failure_reason": run.failure_reason,
        "progress": run.progress,
        "result": run.result,
        "error": public_error(run.error, user=user),
        "created_at": run.created_at.isoformat(),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "attempts": [
            {
                "number": a.number,
                "status": attempt_status(run, a),
                "error": public_error(a.error, user=user),
                "started_at": _iso(a.started_at),
                "finished_at": _iso(a.finished_at),
            }
            for a in run_attempts(run=run)
        ],
        "timeline": timeline,
    }
