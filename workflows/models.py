"""The engine's tables: runs, their attempts, step results and events.

Timers live here too: a run that sleeps, retries or waits has ``wake_at``; the sweeper fires it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django_fsm import FSMField, transition

from workflows.fsm import FSMModelMixin


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SLEEPING = "sleeping"
    WAITING = "waiting"
    RETRYING = "retrying"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    TERMINATED = "terminated"


TERMINAL = [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.TERMINATED]
NON_TERMINAL = [s for s in RunStatus if s not in TERMINAL]
# States with a timer in wake_at that the sweeper fires.
TIMED = [RunStatus.SLEEPING, RunStatus.RETRYING, RunStatus.WAITING]
# States a worker may claim (through a conditional UPDATE, see engine.claim).
CLAIMABLE = [RunStatus.QUEUED, RunStatus.RUNNING]
PAUSABLE = [RunStatus.QUEUED, RunStatus.SLEEPING, RunStatus.WAITING, RunStatus.RETRYING]
# The wait fields of a run that waits for nothing: WorkflowRun.clear_wait sets them, and the writes
# that clear them in SQL (statements.py, the sweeper) take them from here.
NO_WAIT: Mapping[str, Any] = MappingProxyType({"wake_at": None, "wait_step": "", "wait_event_type": ""})
# The fields of a run no worker holds (WorkflowRun.release; statements.finish writes them in SQL).
NO_LEASE: Mapping[str, Any] = MappingProxyType({"lease_owner": "", "lease_expires_at": None, "current_step": ""})


class FailureReason(models.TextChoices):
    ERROR = "error"
    NON_DETERMINISM = "non_determinism"
    MAX_RECOVERY_ATTEMPTS = "max_recovery_attempts"
    UNKNOWN_WORKFLOW = "unknown_workflow"


class WorkflowRun(FSMModelMixin, models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workflow = models.CharField(max_length=100, db_index=True)
    workflow_version = models.CharField(max_length=40, blank=True)
    payload = models.JSONField(default=dict)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="workflow_runs"
    )
    idempotency_key = models.CharField(max_length=255, blank=True)
    # The Celery queue this run is advanced on; the sweeper re-enqueues it there.
    queue = models.CharField(max_length=100)
    # owner, workflow and key in one unique column: portable across PostgreSQL and SQLite,
    # and keys of different owners never collide (nor reveal each other).
    dedupe_key = models.CharField(max_length=400, null=True, blank=True, unique=True)

    status = FSMField(default=RunStatus.QUEUED, choices=RunStatus.choices, protected=True)
    attempt = models.PositiveIntegerField(default=1)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    failure_reason = models.CharField(max_length=40, blank=True, choices=FailureReason.choices)

    # What a suspended run waits for, and until when (the timer).
    wait_event_type = models.CharField(max_length=200, blank=True)
    wait_step = models.CharField(max_length=200, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    current_step = models.CharField(max_length=200, blank=True)

    pause_requested = models.BooleanField(default=False)
    lease_owner = models.CharField(max_length=100, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    recovery_count = models.PositiveIntegerField(default=0)

    progress = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["owner", "-created_at"], name="run_owner_created"),
            models.Index(fields=["status", "-created_at"], name="run_status_created"),
            # The sweeper's two questions stay cheap however many finished runs the table holds.
            models.Index(fields=["wake_at"], name="run_due_timers", condition=Q(status__in=TIMED)),
            models.Index(fields=["enqueued_at"], name="run_claimable", condition=Q(status__in=CLAIMABLE)),
        ]
        permissions = [("control_workflowrun", "Can pause, resume, terminate and restart any run")]

    def __str__(self) -> str:
        return f"{self.workflow} {self.id}"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    # --- Transitions: database only; services call them inside atomic() and emit on commit. ---
    # Each sets the fields that go with its state; the caller saves the whole row. statements.py
    # and the sweeper write the same in SQL (one statement, no prior read) on the hot paths.
    @transition(field=status, source=[RunStatus.QUEUED, RunStatus.RUNNING], target=RunStatus.RUNNING)
    def begin(self, *, owner: str, lease_until: datetime, now: datetime) -> None:
        """A worker takes the run (statements.claim). A lease that still names an owner means that
        worker died mid-run: one recovery more."""
        if self.lease_owner:
            self.recovery_count += 1
        self.lease_owner, self.lease_expires_at = owner, lease_until
        self.started_at = self.started_at or now
        self.clear_wait()

    @transition(field=status, source=RunStatus.RUNNING, target=RunStatus.SLEEPING)
    def sleep(self, *, until: datetime, step: str) -> None:
        self._suspend(until=until, step=step)

    @transition(field=status, source=RunStatus.RUNNING, target=RunStatus.RETRYING)
    def retry_later(self, *, until: datetime, step: str) -> None:
        self._suspend(until=until, step=step)

    @transition(field=status, source=RunStatus.RUNNING, target=RunStatus.WAITING)
    def wait(self, *, until: datetime, step: str, event_type: str = "") -> None:
        """For an event of ``event_type``, or (none) for a step sent to another queue."""
        self._suspend(until=until, step=step, event_type=event_type)

    @transition(field=status, source=TIMED, target=RunStatus.QUEUED)
    def wake(self, *, now: datetime) -> None:
        """Its timer fired or its event came: back on the queue (the caller enqueues it)."""
        self.clear_wait()
        self.enqueued_at = now

    @transition(field=status, source=[RunStatus.RUNNING, *PAUSABLE], target=RunStatus.PAUSED)
    def pause(self) -> None:
        """At once between steps, or by its worker at a step boundary once asked (pause_requested)."""
        self.pause_requested = False
        self.release()

    @transition(field=status, source=RunStatus.PAUSED, target=RunStatus.QUEUED)
    def resume(self, *, now: datetime) -> None:
        self.pause_requested = False
        self.enqueued_at = now

    @transition(field=status, source=RunStatus.RUNNING, target=RunStatus.QUEUED)
    def hand_back(self, *, now: datetime) -> None:
        """The worker's task used its time budget; the run waits on the queue for the next task."""
        self.release()
        self.enqueued_at = now

    @transition(field=status, source=RunStatus.RUNNING, target=RunStatus.COMPLETED)
    def complete(self, *, result: Any, now: datetime) -> None:
        self.result = result
        self._end(now)

    @transition(field=status, source=[RunStatus.QUEUED, RunStatus.RUNNING], target=RunStatus.FAILED)
    def fail(self, *, error: dict[str, Any], reason: str, now: datetime) -> None:
        self.error, self.failure_reason = error, reason
        self._end(now)

    @transition(field=status, source=NON_TERMINAL, target=RunStatus.TERMINATED)
    def terminate(self, *, now: datetime) -> None:
        """Stopped for good. What it waited for and its current step stay shown; its timer is off."""
        self.finished_at = now
        self.lease_owner, self.lease_expires_at, self.wake_at = "", None, None
        self.pause_requested = False

    @transition(field=status, source=list(RunStatus), target=RunStatus.QUEUED)
    def restart(self, *, now: datetime) -> None:
        """A new attempt from the first step: everything the last one left is cleared."""
        self.attempt += 1
        self.result, self.error, self.failure_reason = None, None, ""
        self.finished_at = None
        self.release()
        self.clear_wait()
        self.pause_requested = False
        self.recovery_count = 0
        self.progress = None
        self.enqueued_at = now

    # --- The fields the transitions share. ---
    def clear_wait(self) -> None:
        """The run waits for nothing: no timer, no step, no event (NO_WAIT, as the SQL writes it)."""
        for field, value in NO_WAIT.items():
            setattr(self, field, value)

    def release(self) -> None:
        """No worker holds the run or runs a step of it (NO_LEASE, as the SQL writes it)."""
        for field, value in NO_LEASE.items():
            setattr(self, field, value)

    def _suspend(self, *, until: datetime, step: str, event_type: str = "") -> None:
        self.wake_at, self.wait_step, self.wait_event_type = until, step, event_type
        self.release()

    def _end(self, now: datetime) -> None:
        self.finished_at = now
        self.release()
        self.clear_wait()


class RunAttempt(models.Model):
    """One execution of a run from its first step; restart adds one and keeps the others."""

    # No index of its own: the unique (run, number) index serves lookups by run.
    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="attempts", db_index=False)
    number = models.PositiveIntegerField()
    status = models.CharField(max_length=20, default=RunStatus.QUEUED)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "number"]
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="attempt_unique_number")]


class StepKind(models.TextChoices):
    DO = "do"
    SLEEP = "sleep"
    WAIT = "wait"


class StepStatus(models.TextChoices):
    RUNNING = "running"  # dispatched to another queue as its own task
    RETRYING = "retrying"
    SLEEPING = "sleeping"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"


class StepResult(models.Model):
    """The memo of one step of one attempt: once completed it is never run again.

    Unique on (run, attempt, position): a worker that loses a race adopts the stored row.
    """

    # No index of its own: the unique (run, attempt, position) index serves lookups by run, and
    # one index fewer to maintain on the insert every step makes.
    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="steps", db_index=False)
    attempt = models.PositiveIntegerField()
    position = models.PositiveIntegerField()
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=10, choices=StepKind.choices)
    status = models.CharField(max_length=20, choices=StepStatus.choices)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    tries = models.PositiveIntegerField(default=0)
    # For a step sent to another queue: the function and arguments its task calls.
    call = models.JSONField(null=True, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "attempt", "position"]
        constraints = [
            models.UniqueConstraint(fields=["run", "attempt", "position"], name="step_unique_position"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.attempt}.{self.position} {self.name}"


class RunEvent(models.Model):
    """An event sent to a run; a waiting step consumes the oldest unconsumed one of its type."""

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="events", db_index=False)
    type = models.CharField(max_length=200)
    payload = models.JSONField(default=dict)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    consumed_attempt = models.PositiveIntegerField(null=True, blank=True)
    consumed_position = models.PositiveIntegerField(null=True, blank=True)
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "idempotency_key"], name="event_unique_key"),
        ]
        indexes = [models.Index(fields=["run", "type", "consumed_attempt"], name="event_lookup")]
