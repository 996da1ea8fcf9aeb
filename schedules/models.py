"""Schedules: recurring work (a workflow run or a submission to an agent) due by cron or interval,
and every firing of each, one row per due time.

A schedule has no state machine: ``enabled`` is a switch, ``next_due_at`` is when it is next due
(NULL: to be worked out by the next tick, as a schedule a migration installs is). The firing row,
unique per (schedule, due_at), is inserted in the transaction that starts the work, so a due time
fires once however many ticks meet it (``schedules/services.py``).
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from schedules.spec import Spec, SpecError, spec_of


class Action(models.TextChoices):
    WORKFLOW = "workflow", "start a workflow"
    SUBMISSION = "submission", "submit a message to an agent"


def default_timezone() -> str:
    return str(settings.TIME_ZONE)


class Schedule(models.Model):
    name = models.SlugField(max_length=100, unique=True, help_text="Also part of each firing's idempotency key.")
    description = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)
    # When: exactly one of these two.
    cron = models.CharField(
        max_length=100,
        blank=True,
        help_text="Five fields: minute hour day-of-month month day-of-week (e.g. '30 2 * * *'), or @daily, @weekly...",
    )
    interval_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="Or every so many seconds, counted from the first due time."
    )
    timezone = models.CharField(
        max_length=64, default=default_timezone, help_text="The IANA time zone the cron fields are read in."
    )
    # What: a workflow run, or a message submitted to an agent.
    action = models.CharField(max_length=20, choices=Action.choices)
    workflow = models.CharField(max_length=200, blank=True, help_text="The workflow's registered name.")
    payload = models.JSONField(default=dict, blank=True, help_text="The run's payload (a JSON object).")
    account = models.SlugField(max_length=100, blank=True, help_text="The account's slug.")
    agent_kind = models.CharField(max_length=64, blank=True)
    agent_name = models.CharField(max_length=128, blank=True, help_text="The conversation (created on first use).")
    message = models.TextField(blank=True, help_text="The text submitted at each firing.")
    # Kept by the tick; never edited by hand (the admin shows them read-only).
    next_due_at = models.DateTimeField(null=True, blank=True)
    last_fired_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(cron="") & Q(interval_seconds__gte=1)) | (~Q(cron="") & Q(interval_seconds__isnull=True)),
                name="schedule_cron_or_interval",
            ),
            models.CheckConstraint(
                condition=(Q(action=Action.WORKFLOW) & ~Q(workflow=""))
                | (
                    Q(action=Action.SUBMISSION)
                    & ~Q(account="")
                    & ~Q(agent_kind="")
                    & ~Q(agent_name="")
                    & ~Q(message="")
                ),
                name="schedule_action_complete",
            ),
        ]
        indexes = [models.Index(fields=["next_due_at"], condition=Q(enabled=True), name="schedule_due")]

    def __str__(self) -> str:
        return self.name

    def spec(self) -> Spec:
        """When it is due (SpecError for an expression or zone that cannot be one)."""
        return spec_of(cron=self.cron, interval_seconds=self.interval_seconds, timezone=self.timezone)

    def describe_spec(self) -> str:
        try:
            return self.spec().describe()
        except SpecError as exc:
            return f"invalid: {exc}"

    def describe_action(self) -> str:
        if self.action == Action.WORKFLOW:
            return f"start {self.workflow}"
        return f"submit to {self.account}/{self.agent_kind}/{self.agent_name}"

    def clean(self) -> None:
        from schedules.services import action_problems  # the registries are read there

        errors: dict[str, list[str]] = {}
        try:
            self.spec().next_after(timezone.now())  # an expression with no due time ahead is refused too
        except SpecError as exc:
            field = "cron" if self.cron else "interval_seconds"
            if "time zone" in str(exc):
                field = "timezone"
            errors.setdefault(field, []).append(str(exc))
        for field, problem in action_problems(self):
            errors.setdefault(field, []).append(problem)
        if errors:
            raise ValidationError(errors)


class Trigger(models.TextChoices):
    SCHEDULE = "schedule"  # the tick, at a due time
    MANUAL = "manual"  # "fire now" (admin or manage.py schedules fire): due_at is when it was asked


class Outcome(models.TextChoices):
    STARTED = "started"  # the run or the submission was created by this firing
    EXISTED = "existed"  # its idempotency key had been used: the run or submission found is that one
    FAILED = "failed"  # refused or broken (error says why); the schedule went on to its next due time


class ScheduleFiring(models.Model):
    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="firings")
    due_at = models.DateTimeField()
    fired_at = models.DateTimeField(default=timezone.now)
    trigger = models.CharField(max_length=20, choices=Trigger.choices, default=Trigger.SCHEDULE)
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    idempotency_key = models.CharField(max_length=255)
    run = models.ForeignKey("workflows.WorkflowRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    submission = models.ForeignKey(
        "agents.Submission", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-due_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["schedule", "due_at"], name="schedule_fires_once_per_due_time")]

    def __str__(self) -> str:
        return f"{self.schedule_id} @ {self.due_at:%Y-%m-%d %H:%M:%S} {self.outcome}"
