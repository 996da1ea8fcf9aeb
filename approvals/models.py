"""Versioned approval requests and the log of every decision taken (or refused) on them.

A request names the exact version of its subject (``subject_type`` + ``subject_id`` +
``version``) and the proposed consequence (``summary`` and a JSON snapshot ``content`` of the
version under review). It belongs to the workflow run (and attempt) that waits for it; that run
waits for the event ``approval:<id>``.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django_fsm import FSMField, transition

from workflows.fsm import FSMModelMixin
from workflows.models import WorkflowRun


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"
    CANCELLED = "cancelled"


# Limits of what a workflow may put in a request (checked before the request step runs).
VERSION_MAX = 255
SUBJECT_TYPE_MAX = 100
SUBJECT_ID_MAX = 255
NAME_MAX = 150  # the step names "<name>: request" etc. must fit the engine's 200 characters
APPROVERS_MAX = 150  # auth.Group.name
NOTE_MAX = 2000


class ApprovalRequest(FSMModelMixin, models.Model):
    """One request for a decision on one version of a subject.

    ``status`` is protected: only the transitions below change it, called by ``approvals.services``
    inside ``transaction.atomic()`` with the run row and this row locked.
    """

    run = models.ForeignKey(WorkflowRun, on_delete=models.PROTECT, related_name="approval_requests")
    # The run's attempt that raised it: a restarted run no longer waits for earlier attempts' requests.
    attempt = models.PositiveIntegerField(default=1)
    # The name given to wait_for_approval; its steps are "<name>: request", "<name>: decision", ...
    step_name = models.CharField(max_length=NAME_MAX)

    subject_type = models.CharField(max_length=SUBJECT_TYPE_MAX, help_text="e.g. shop.order (app_label.model)")
    subject_id = models.CharField(max_length=SUBJECT_ID_MAX)
    version = models.CharField(max_length=VERSION_MAX, help_text="The exact version under review.")
    summary = models.TextField(help_text="The proposed consequence, in words.")
    content = models.JSONField(null=True, blank=True, help_text="A snapshot of the version under review.")

    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approvers = models.CharField(max_length=APPROVERS_MAX, help_text="The name of the group that may decide.")
    # The request this one replaces (its subject changed after it was approved).
    replaces = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="replacements")

    status = FSMField(default=ApprovalStatus.PENDING, choices=ApprovalStatus.choices, protected=True)
    expires_at = models.DateTimeField()
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The pending queue (admin, API) and the orphan sweep read only pending rows.
            models.Index(
                fields=["approvers", "created_at"],
                name="approval_pending_queue",
                condition=Q(status=ApprovalStatus.PENDING),
            ),
            models.Index(fields=["run", "status"], name="approval_run_status"),
            models.Index(fields=["subject_type", "subject_id"], name="approval_subject"),
        ]
        permissions = [("decide_any", "Can decide any approval request, whatever its approvers group")]

    def __str__(self) -> str:
        return f"#{self.pk} {self.subject_type}:{self.subject_id} v{self.version} ({self.status})"

    @property
    def event_type(self) -> str:
        """What the waiting run's step waits for (and what WorkflowRun.wait_event_type shows)."""
        return f"approval:{self.pk}"

    @property
    def event_key(self) -> str:
        """The idempotency key of the one event that wakes the run for this request (its decision,
        or its supersession while pending): a replayed decide cannot send a second."""
        return f"approval:{self.pk}:decision"

    @property
    def is_pending(self) -> bool:
        return bool(self.status == ApprovalStatus.PENDING)  # FSMField reads as Any

    def is_overdue(self, now: datetime | None = None) -> bool:
        return self.expires_at <= (now or timezone.now())

    # --- Transitions: database fields only; services call them inside atomic() with the row locked.
    @transition(field=status, source=ApprovalStatus.PENDING, target=ApprovalStatus.APPROVED)
    def approve(self, *, by_id: int, note: str, at: datetime) -> None:
        self.decided_by_id, self.note, self.decided_at = by_id, note, at

    @transition(field=status, source=ApprovalStatus.PENDING, target=ApprovalStatus.REJECTED)
    def reject(self, *, by_id: int, note: str, at: datetime) -> None:
        self.decided_by_id, self.note, self.decided_at = by_id, note, at

    @transition(field=status, source=ApprovalStatus.PENDING, target=ApprovalStatus.EXPIRED)
    def expire(self) -> None:
        pass

    # Superseded when the subject changes: while pending (supersede_pending, with the change), or
    # once approved, when the workflow's re-check finds a newer version.
    @transition(
        field=status, source=[ApprovalStatus.PENDING, ApprovalStatus.APPROVED], target=ApprovalStatus.SUPERSEDED
    )
    def supersede(self) -> None:
        pass

    @transition(field=status, source=ApprovalStatus.PENDING, target=ApprovalStatus.CANCELLED)
    def cancel(self) -> None:
        pass


class DecisionAction(models.TextChoices):
    APPROVE = "approve"
    REJECT = "reject"
    # What the system does to a request: not decisions, logged for the same audit trail.
    EXPIRE = "expire"
    SUPERSEDE = "supersede"
    CANCEL = "cancel"


class DecisionResult(models.TextChoices):
    ACCEPTED = "accepted"  # this attempt made the transition
    REPEATED = "repeated"  # the same decision again: answered with the established result
    REFUSED = "refused"  # nothing changed; ``code`` and ``message`` say why


class DecisionChannel(models.TextChoices):
    ADMIN = "admin"
    API = "api"
    PYTHON = "python"
    SYSTEM = "system"  # the workflow (expiry, re-check) or the engine (cancellation)


class DecisionLog(models.Model):
    """Who tried what on which request and version, when, and how it ended. Never updated."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="log")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Kept as text as well: the log must still say who it was after the user is deleted.
    actor_name = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=20, choices=DecisionAction.choices)
    version = models.CharField(max_length=VERSION_MAX, blank=True, help_text="The version the actor sent.")
    result = models.CharField(max_length=20, choices=DecisionResult.choices)
    code = models.CharField(max_length=40, blank=True, help_text="Why it was refused.")
    message = models.TextField(blank=True)
    note = models.TextField(blank=True)
    channel = models.CharField(max_length=20, choices=DecisionChannel.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["request", "created_at"], name="decision_log_request")]

    def __str__(self) -> str:
        return f"{self.actor_name or 'system'} {self.action} #{self.request_id}: {self.result}"
