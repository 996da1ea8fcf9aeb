"""Every inbound webhook delivery, whatever became of it: accepted, duplicate or rejected.

A row is written once and never changes, so there is no state machine here: the outcome is what
happened to that one HTTP request. The partial unique constraint on (source, event_id) for accepted
rows is the deduplication: the endpoint inserts the accepted row in the transaction that does the
event's work, so a second delivery of the event waits for the first to commit and then finds the
conflict (its insert does nothing, and it is recorded as a duplicate) or, if the first rolled back,
is accepted itself.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone


class Outcome(models.TextChoices):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"


ACCEPTED_ONCE = "webhook_accepted_once"


class WebhookDelivery(models.Model):
    source = models.CharField(max_length=100)
    # Blank when the delivery was rejected before its signature held: an id from an unverified sender
    # proves nothing (its headers, kept below, show what it claimed).
    event_id = models.CharField(max_length=255, blank=True)
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    # Why it was rejected: a code (bad_signature, stale_timestamp, ...) and words for people.
    reason = models.CharField(max_length=50, blank=True)
    message = models.TextField(blank=True)
    received_at = models.DateTimeField(default=timezone.now)
    # Signature-, secret- and credential-like headers as "[redacted]".
    headers = models.JSONField(default=dict)
    # The JSON body with the ledger's personal-data keys redacted; kept only once the signature
    # held (what an unverified sender posts is not worth storing, and would be anyone's to fill).
    body = models.JSONField(null=True, blank=True)
    size = models.PositiveIntegerField(default=0, help_text="Bytes of the body as received.")
    # What it did.
    run = models.ForeignKey("workflows.WorkflowRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    operation_key = models.CharField(max_length=255, blank=True)
    submission = models.ForeignKey(
        "agents.Submission", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    result = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-received_at", "-id"]
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["source", "event_id"], condition=Q(outcome=Outcome.ACCEPTED), name=ACCEPTED_ONCE
            )
        ]
        indexes = [
            models.Index(fields=["source", "event_id"], name="webhook_source_event"),
            models.Index(fields=["received_at"], name="webhook_received"),
        ]

    def __str__(self) -> str:
        return f"{self.source} {self.event_id or '?'} {self.outcome}"
