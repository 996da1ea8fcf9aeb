"""Every inbound webhook delivery, whatever became of it: accepted, duplicate or rejected.

The outcome is what happened to that one HTTP request, written once. The partial unique constraint
on (source, event_id) for accepted rows is the deduplication: a second delivery of an event waits
for the first's insert to commit and then finds the conflict (its insert does nothing, and it is
recorded as a duplicate) or, if the first rolled back, is accepted itself.

An accepted row also says where the event's action is (``action_state``). For a source that acts
now, the row is inserted in the transaction that does the action, and is ``done`` when it is
committed. For a source that acts later, the row is committed ``pending`` with the body as received
(``raw_body``) before the 202, and a worker runs the action in a transaction that also marks the
row ``done`` (or ``refused``: the action cannot act on the event) and drops ``raw_body``; one that
keeps failing ends ``failed``, for an operator to act again. Only these fields of a row change.
"""

from __future__ import annotations

from typing import get_args

from django.db import models
from django.db.models import Q
from django.utils import timezone

from webhooks.verify import Reason


class Outcome(models.TextChoices):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"


class ActionState(models.TextChoices):
    PENDING = "pending"  # accepted; its action is to run in a worker (act: later)
    DONE = "done"
    REFUSED = "refused"  # the action cannot act on this event (reason, message): final
    FAILED = "failed"  # every attempt failed (reason, message); an operator may act again


# A later action not done yet: pending (a worker will act) or failed (an operator may act again).
OPEN_ACTIONS = [ActionState.PENDING, ActionState.FAILED]

ACCEPTED_ONCE = "webhook_accepted_once"
SIGNED_BODY_ONCE = "webhook_signed_body_once"


class WebhookDelivery(models.Model):
    source = models.CharField(max_length=100)
    # For a delivery rejected before its signature held, the id its headers claim (webhook-id,
    # X-GitHub-Delivery; blank for stripe, whose id is in the unread body): unverified, anyone's to
    # write, kept so that a search for an id finds its rejections too.
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
    # A keyed digest of the body as received (HMAC-SHA256 under SECRET_KEY), once the signature
    # held. A duplicate whose body is the accepted delivery's keeps only this, not the body again: a
    # captured delivery replayed within the signature's tolerance, however often, stores its headers
    # and no copy of its body. Keyed, and never shown: a plain hash of a body with personal data
    # would let anyone who reads the row test guesses of what the redaction took out.
    body_digest = models.CharField(max_length=64, blank=True, default="", db_default="")
    # For a scheme that signs the body only (github): a keyed digest of the source and the body,
    # unique among accepted rows, so that a captured delivery sent again under a new event id is a
    # duplicate, as one under its own id is. Blank for the schemes that sign the id. Never shown.
    replay_key = models.CharField(max_length=64, blank=True, default="", db_default="")
    # What it did.
    run = models.ForeignKey("workflows.WorkflowRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    operation_key = models.CharField(max_length=255, blank=True)
    submission = models.ForeignKey(
        "agents.Submission", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    result = models.JSONField(null=True, blank=True)
    # Where the action of an accepted delivery is; blank for a duplicate or a rejection.
    # (Blank too for a row accepted before action states were recorded: it was acted on then.)
    # Database defaults as well, so that a web process of the release before them can still insert.
    action_state = models.CharField(max_length=10, choices=ActionState.choices, blank=True, default="", db_default="")
    action_attempts = models.PositiveSmallIntegerField(default=0, db_default=0, help_text="Tries of a later action.")
    act_after = models.DateTimeField(null=True, blank=True, help_text="When a pending action is due (again).")
    swept_at = models.DateTimeField(null=True, blank=True, help_text="When the sweep last sent its task again.")
    acted_at = models.DateTimeField(null=True, blank=True)
    # The body as received, personal data and all: what a later action acts on. Kept only while the
    # action is pending or failed (an operator may act again), never shown.
    raw_body = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-received_at", "-id"]
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["source", "event_id"], condition=Q(outcome=Outcome.ACCEPTED), name=ACCEPTED_ONCE
            ),
            models.UniqueConstraint(
                fields=["source", "replay_key"],
                condition=Q(outcome=Outcome.ACCEPTED) & ~Q(replay_key=""),
                name=SIGNED_BODY_ONCE,
            ),
        ]
        indexes = [
            models.Index(fields=["source", "event_id"], name="webhook_source_event"),
            models.Index(fields=["received_at"], name="webhook_received"),
            # What the sweep asks (pending actions overdue: their message may be lost) and the
            # metrics count (pending and failed ones): a few rows, however long the history.
            models.Index(
                fields=["action_state", "act_after"],
                condition=Q(action_state__in=[ActionState.PENDING, ActionState.FAILED]),
                name="webhook_act_open",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.source} {self.event_id or '?'} {self.outcome}"

    @property
    def event_id_verified(self) -> bool:
        """Whether the signature vouched for the event id: every row's but a rejection's from before
        the signature held, whose id is only what its headers claim."""
        return not (self.outcome == Outcome.REJECTED and self.reason in UNVERIFIED_REASONS)


# The reasons a delivery is refused before its signature holds (webhooks.verify's, and a body too large
# to check): its event id is as claimed, by anyone.
UNVERIFIED_REASONS = frozenset(get_args(Reason)) | {"payload_too_large"}
