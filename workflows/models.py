"""The engine's tables: runs, their attempts, step results and events.

Timers live here too: a run that sleeps, retries or waits has ``wake_at``; the sweeper fires it.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django_fsm import FSMField, FSMModelMixin, transition


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
    @transition(field=status, source=[RunStatus.QUEUED, RunStatus.RUNNING], target=RunStatus.RUNNING)
    def begin(self) -> None:
        pass

    @transition(field=status, source=RunStatus.RUNNING, target=RunStatus.SLEEPING)
    def sleep(self) -> None:
        pass

    @transition(field=status, source=RunStatus.RUNNING, target=RunStatus.RETRYING)
    def retry_later(self) -> None:
        pass

    @transition(field=status, source=RunStatus.RUNNING, target=RunStatus.WAITING)
    def wait(self) -> None:
        pass

    @transition(field=status, source=TIMED, target=RunStatus.QUEUED)
    def wake(self) -> None:
        pass

    @transition(field=status, source=[RunStatus.RUNNING, *PAUSABLE], target=RunStatus.PAUSED)
    def pause(self) -> None:
        pass

    @transition(field=status, source=RunStatus.PAUSED, target=RunStatus.QUEUED)
    def resume(self) -> None:
        pass

    @transition(field=status, source=RunStatus.RUNNING, target=RunStatus.QUEUED)
    def hand_back(self) -> None:
        """The worker's task used its time budget; the run waits on the queue for the next task."""

    @transition(field=status, source=RunStatus.RUNNING, target=RunStatus.COMPLETED)
    def complete(self) -> None:
        pass

    @transition(field=status, source=[RunStatus.QUEUED, RunStatus.RUNNING], target=RunStatus.FAILED)
    def fail(self) -> None:
        pass

    @transition(field=status, source=NON_TERMINAL, target=RunStatus.TERMINATED)
    def terminate(self) -> None:
        pass

    @transition(field=status, source=list(RunStatus), target=RunStatus.QUEUED)
    def restart(self) -> None:
        pass


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
