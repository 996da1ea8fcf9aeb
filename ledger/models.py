"""The ledger's tables: external operations (one per key), what happened to each, and
operational records.

``ExternalOperation.status`` is a protected FSM field:

    pending → submitted → succeeded | failed | unknown
    submitted → pending                (nothing reached the provider: safe to send again)
    unknown | stale submitted → succeeded | failed | pending    (only through reconciliation:
                                        a lookup at the provider, or a person with a note)
    pending → succeeded | failed        (reconciliation of an operation sent before, whose run
                                        has ended: an earlier send may still have taken effect)
    pending → failed                    (abandon: never sent, and the run that would send it has
                                        ended)
    failed → succeeded                  (contradict: failed by a person's hand, then found at the
                                        provider as succeeded by reconcile's recheck)

Transitions change nothing but the row; the services call them inside ``transaction.atomic()``
with the row locked (``select_for_update``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django_fsm import ConcurrentTransitionMixin, FSMField, transition


class OperationStatus(models.TextChoices):
    PENDING = "pending"  # stored, not sent (or known not to have reached the provider)
    SUBMITTED = "submitted"  # a worker is calling the provider now, or died doing so (stale)
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a definitive rejection; the key is spent
    UNKNOWN = "unknown"  # sent, outcome not known: only reconciliation resolves it


FINAL = [OperationStatus.SUCCEEDED, OperationStatus.FAILED]
# The states reconciliation (a lookup, or a person) may resolve. A submitted operation only once
# it is stale: before that its worker may still record the real outcome.
RECONCILABLE = [OperationStatus.UNKNOWN, OperationStatus.SUBMITTED]
# ...and a pending one that was sent before, once its run has ended (nobody will send it again,
# and "not found" never proves that an earlier send will not still arrive).
SETTLEABLE = [OperationStatus.PENDING, *RECONCILABLE]


class ExternalOperation(ConcurrentTransitionMixin, models.Model):
    """One side effect in an external system, identified by its key (also the provider's
    idempotency key). ConcurrentTransitionMixin makes every save an ``UPDATE ... WHERE status =
    <as loaded>``: a belt to the services' row locks."""

    if TYPE_CHECKING:
        # For mypy only: django-fsm-2's ConcurrentTransitionMixin.__init__ reads as untyped before
        # Python 3.12 (its `override` falls back from typing to typing_extensions), which made the
        # model class, its manager and every query on it Any. Django's plugin still checks the fields.
        def __init__(self, *args: Any, **kwargs: Any) -> None: ...

    key = models.CharField(max_length=255, unique=True)
    system = models.CharField(max_length=100)
    action = models.CharField(max_length=100)
    # The request as the caller gave it: needed to submit again after a lookup says "not found".
    # Shown redacted (admin, API); never logged unredacted.
    request = models.JSONField(default=dict)
    # sha256 of the canonical JSON of (system, action, request): a reused key is compared by it.
    request_hash = models.CharField(max_length=64)

    status = FSMField(default=OperationStatus.PENDING, choices=OperationStatus.choices, protected=True)
    response = models.JSONField(null=True, blank=True, help_text="The provider's answer once succeeded.")
    error = models.JSONField(null=True, blank=True, help_text="Why it failed: reason and detail.")
    # Why it is unknown, or what reconciliation last found; for people.
    note = models.TextField(blank=True)

    # The run and step whose body performed it (workflows.current_step()), when there was one:
    # terminating a run lists what it left in flight.
    run = models.ForeignKey(
        "workflows.WorkflowRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="external_operations"
    )
    step = models.CharField(max_length=200, blank=True)

    submit_count = models.PositiveIntegerField(default=0)
    lookup_count = models.PositiveIntegerField(default=0)
    submitted_at = models.DateTimeField(null=True, blank=True, help_text="When it was last sent.")
    looked_up_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # A manual resolution: who, when and why (a note is required).
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution_note = models.TextField(blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["status", "-created_at"], name="op_status_created"),
            models.Index(fields=["system", "-created_at"], name="op_system_created"),
            # Reconciliation's question ("unknown, or submitted before T?") stays cheap however
            # many finished operations the table holds.
            models.Index(fields=["submitted_at"], name="op_reconcilable", condition=Q(status__in=RECONCILABLE)),
        ]
        permissions = [("resolve_externaloperation", "Can reconcile and resolve external operations by hand")]

    def __str__(self) -> str:
        return f"{self.system} {self.action} {self.key}"

    # --- Transitions: the row only; the services lock it, call these, save, and log. ---
    @transition(field=status, source=OperationStatus.PENDING, target=OperationStatus.SUBMITTED)
    def submit(self) -> None:
        pass

    @transition(field=status, source=OperationStatus.SUBMITTED, target=OperationStatus.SUCCEEDED)
    def succeed(self) -> None:
        pass

    @transition(field=status, source=OperationStatus.SUBMITTED, target=OperationStatus.FAILED)
    def fail(self) -> None:
        pass

    @transition(field=status, source=OperationStatus.SUBMITTED, target=OperationStatus.UNKNOWN)
    def lose_track(self) -> None:
        """The request was sent and no answer came back (or a stale submit could not be looked up)."""

    @transition(field=status, source=OperationStatus.SUBMITTED, target=OperationStatus.PENDING)
    def release(self) -> None:
        """The request certainly had no effect (never connected, or refused before acting)."""

    @transition(field=status, source=SETTLEABLE, target=OperationStatus.SUCCEEDED)
    def reconcile_succeeded(self) -> None:
        pass

    @transition(field=status, source=SETTLEABLE, target=OperationStatus.FAILED)
    def reconcile_failed(self) -> None:
        pass

    @transition(field=status, source=RECONCILABLE, target=OperationStatus.PENDING)
    def reconcile_not_found(self) -> None:
        """The provider has no record of the key: it never took effect, sending again is safe."""

    @transition(field=status, source=OperationStatus.FAILED, target=OperationStatus.SUCCEEDED)
    def contradict(self) -> None:
        """Recorded as failed (by hand, or on a provider's report), then found or reported by the
        provider as succeeded: the provider is the truth about the money. Only reconcile's recheck
        of hand-failed operations and a provider's report (``operation_report``) call it."""

    @transition(field=status, source=OperationStatus.PENDING, target=OperationStatus.FAILED)
    def abandon(self) -> None:
        """It was never sent, and the run that would send it has ended: nobody will, so the key is
        spent. Only the services call it, with both established under the row lock. An operation
        sent even once is never abandoned: a provider can act on a request long after our call gave
        up on it, and no "not found" proves it will not; a person decides (``operation_resolve``)."""


class EventKind(models.TextChoices):
    SUBMIT = "submit"
    LOOKUP = "lookup"
    RESOLVE = "resolve"  # by a person
    ABANDON = "abandon"  # never took effect, and its run has ended: nobody will send it


class EventOutcome(models.TextChoices):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"
    NO_EFFECT = "no_effect"
    NOT_FOUND = "not_found"


class OperationEvent(models.Model):
    """What happened to an operation, one row per call out or resolution: its audit trail."""

    operation = models.ForeignKey(ExternalOperation, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=20, choices=EventKind.choices)
    outcome = models.CharField(max_length=20, choices=EventOutcome.choices)
    status_before = models.CharField(max_length=20)
    status_after = models.CharField(max_length=20)
    # Redacted before storage, like everything else the ledger keeps about a provider's answer.
    detail = models.JSONField(null=True, blank=True)
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["operation", "created_at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.outcome}: {self.status_before} → {self.status_after}"


class OperationalRecord(models.Model):
    """What a colleague needs to answer a customer about a consequential action. Personal data
    (settings.LEDGER["REDACT_KEYS"]) is redacted before storage; kept LEDGER["RETENTION_DAYS"]."""

    request_id = models.CharField(max_length=255, db_index=True)
    run = models.ForeignKey("workflows.WorkflowRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    operation = models.ForeignKey(
        ExternalOperation, null=True, blank=True, on_delete=models.SET_NULL, related_name="records"
    )
    step = models.CharField(max_length=200, blank=True)
    tool = models.CharField(max_length=200, blank=True, help_text="The tool or action invoked.")
    observed_at = models.DateTimeField(
        null=True, blank=True, help_text="When the data the action relied on was observed."
    )
    response = models.JSONField(null=True, blank=True, help_text="The external response, redacted.")
    approval_pending = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.request_id} {self.tool}"
