"""An agent instance, its conversation and its turns.

An agent is ``(account, kind, name)``: the kind names a registered ``ChatAgent`` class, the name
one instance of it inside the account. Each user message starts a *turn*, run by the engine as a
run of the ``agents.turn`` workflow; the turn's answer streams as *chunks* numbered ``seq`` 1, 2, …
within the turn, stored (in batches, fenced by the run's lease) before they are published, so any
client can resume a stream from the database without a gap or a duplicate.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django_fsm import RETURN_VALUE, FSMField, transition

from accounts.models import Account
from workflows.fsm import FSMModelMixin


class Agent(models.Model):
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="agents")
    kind = models.CharField(max_length=64)
    name = models.CharField(max_length=128)
    state = models.JSONField(default=dict, blank=True, help_text="The agent's own JSON state.")
    state_version = models.PositiveIntegerField(default=0, help_text="Raised by one at every state change.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["account", "kind", "name"], name="agents_one_instance")]
        ordering = ["account", "kind", "name"]

    def __str__(self) -> str:
        return f"{self.kind}/{self.name} ({self.account})"


class TurnStatus(models.TextChoices):
    QUEUED = "queued"  # waiting for the turns before it (FIFO per agent)
    RUNNING = "running"  # its run is going: the model streams or a tool runs
    WAITING = "waiting"  # waiting for a person to approve a tool call (exempt from the budgets)
    COMPLETED = "completed"  # answered
    CANCELLED = "cancelled"  # stopped by someone; never runs again
    SEALED = "sealed"  # ended without a full answer: too old, or out of recovery budget; says why
    FAILED = "failed"  # an error ended it


TURN_ACTIVE = [TurnStatus.RUNNING, TurnStatus.WAITING]
TURN_OPEN = [TurnStatus.QUEUED, *TURN_ACTIVE]
TURN_ENDED = [TurnStatus.COMPLETED, TurnStatus.CANCELLED, TurnStatus.SEALED, TurnStatus.FAILED]
# The reason the last chunk of an ended turn's stream (``finish``) carries, by how the turn ended:
# the AI SDK's "stop" and "error", and ours for a turn stopped by someone or sealed.
TURN_FINISH_REASONS: dict[str, str] = {
    TurnStatus.COMPLETED: "stop",
    TurnStatus.CANCELLED: "stopped",
    TurnStatus.SEALED: "sealed",
    TurnStatus.FAILED: "error",
}


class Turn(FSMModelMixin, models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="turns")
    number = models.PositiveIntegerField(help_text="The turn's place in the agent's queue (1, 2, …).")
    status = FSMField(default=TurnStatus.QUEUED, choices=TurnStatus.choices, protected=True)
    run = models.OneToOneField(
        "workflows.WorkflowRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="agent_turn"
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    source = models.CharField(max_length=16, default="chat", help_text="chat, submission or system.")
    text = models.TextField(blank=True, help_text="The answer as delivered (partial for a sealed turn).")
    end_reason = models.CharField(max_length=500, blank=True, help_text="Why the turn ended, in words.")
    recoveries = models.PositiveIntegerField(default=0, help_text="Times its stream was recovered after a crash.")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["agent", "number"], name="agents_turn_number")]
        indexes = [
            models.Index(fields=["agent", "status", "number"], name="agents_turn_queue"),
            # /metrics counts the open turns at each scrape: only these rows, however many ended.
            models.Index(fields=["status"], name="agents_turn_open", condition=models.Q(status__in=TURN_OPEN)),
        ]
        ordering = ["agent", "number"]

    def __str__(self) -> str:
        return f"turn {self.number} of {self.agent}"

    @property
    def is_ended(self) -> bool:
        return self.status in TURN_ENDED

    # --- Transitions: services and the turn's steps call them inside atomic() and save. ---
    @transition(field=status, source=TurnStatus.QUEUED, target=TurnStatus.RUNNING)
    def begin(self) -> None:
        """Its run was started (the turn before it ended, or there was none)."""

    @transition(field=status, source=TurnStatus.RUNNING, target=TurnStatus.WAITING)
    def await_approval(self) -> None:
        """A tool call waits for a person's decision."""

    @transition(field=status, source=TurnStatus.WAITING, target=TurnStatus.RUNNING)
    def resume(self) -> None:
        """The decision came (either way)."""

    @transition(field=status, source=TURN_ACTIVE, target=TurnStatus.COMPLETED)
    def complete(self) -> None:
        pass

    @transition(field=status, source=TURN_OPEN, target=TurnStatus.CANCELLED)
    def cancel(self) -> None:
        pass

    @transition(field=status, source=TURN_ACTIVE, target=TurnStatus.SEALED)
    def seal(self) -> None:
        pass

    @transition(field=status, source=TURN_OPEN, target=TurnStatus.FAILED)
    def fail(self) -> None:
        pass


class MessageRole(models.TextChoices):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Message(models.Model):
    """The conversation: user messages (written when sent) and, when a turn ends, what it added
    (assistant text, the tool calls it made and their results), in order."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="messages")
    turn = models.ForeignKey(Turn, null=True, blank=True, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=16, choices=MessageRole.choices)
    text = models.TextField(blank=True)
    # Assistant: {"tool_calls": [{"id", "name", "arguments"}]}; tool: {"tool_call_id", "name", "result"}.
    parts = models.JSONField(default=dict, blank=True)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["agent", "id"]

    def __str__(self) -> str:
        return f"{self.role} message {self.pk}"


class Chunk(models.Model):
    """One piece of a turn's stream, in the shape of the AI SDK UI message stream: ``start``,
    ``text-delta``, ``tool-input-available``, ``tool-output-available``, ``finish``, ``data-*``."""

    id = models.BigAutoField(primary_key=True)
    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="chunks")
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=40)
    data = models.JSONField(default=dict, blank=True)
    # Names a chunk that must be written once whatever retries (e.g. a tool call's output); blank otherwise.
    key = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["turn", "seq"], name="agents_chunk_seq"),
            models.UniqueConstraint(fields=["turn", "key"], condition=~models.Q(key=""), name="agents_chunk_key"),
        ]
        ordering = ["turn", "seq"]

    def __str__(self) -> str:
        return f"{self.type} #{self.seq}"


class FiberStatus(models.TextChoices):
    PENDING = "pending"  # its run has not begun it yet
    RUNNING = "running"  # its function runs (or will again, after its worker died)
    COMPLETED = "completed"  # the function returned; ``result`` is what it returned
    FAILED = "failed"  # the function raised (not retried), or its run failed; ``error`` says why
    CANCELLED = "cancelled"  # stopped by someone, or by ``on_fiber_recovered``; never runs again


FIBER_OPEN = [FiberStatus.PENDING, FiberStatus.RUNNING]
FIBER_ENDED = [FiberStatus.COMPLETED, FiberStatus.FAILED, FiberStatus.CANCELLED]


class Fiber(FSMModelMixin, models.Model):
    """A durable background job of an agent (``ChatAgent.run_fiber``): a module-level function run in
    a worker as one step of an ``agents.fiber`` run. What it ``stash``-es is stored at once (fenced by
    the run's lease), so after a crash ``on_fiber_recovered`` gets the last stash and decides."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="fibers")
    name = models.CharField(max_length=100)
    fn = models.CharField(max_length=300, help_text="The function's import path, module:name.")
    input = models.JSONField(default=dict, blank=True, help_text="What the function is given (ctx.input).")
    status = FSMField(default=FiberStatus.PENDING, choices=FiberStatus.choices, protected=True)
    stash = models.JSONField(null=True, blank=True, help_text="The last checkpoint the function stashed.")
    stash_version = models.PositiveIntegerField(default=0, help_text="Raised by one at every stash (and clearing).")
    attempts = models.PositiveIntegerField(default=0, help_text="Times the function was started (2+: recovered).")
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    end_reason = models.CharField(max_length=500, blank=True, help_text="Why the fiber ended, in words.")
    run = models.OneToOneField(
        "workflows.WorkflowRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="agent_fiber"
    )
    idempotency_key = models.CharField(max_length=255, blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["agent", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="agents_fiber_idempotency_key",
            )
        ]
        indexes = [models.Index(fields=["agent", "status"], name="agents_fiber_status")]
        ordering = ["agent", "-created_at"]

    def __str__(self) -> str:
        return f"fiber {self.name} of {self.agent}"

    @property
    def is_ended(self) -> bool:
        return self.status in FIBER_ENDED

    # --- Transitions: the fiber's steps and services call them inside atomic() and save. ---
    @transition(field=status, source=FiberStatus.PENDING, target=FiberStatus.RUNNING)
    def begin(self) -> None:
        """Its run reached it."""

    @transition(field=status, source=FiberStatus.RUNNING, target=FiberStatus.COMPLETED)
    def complete(self) -> None:
        pass

    @transition(field=status, source=FIBER_OPEN, target=FiberStatus.FAILED)
    def fail(self) -> None:
        pass

    @transition(field=status, source=FIBER_OPEN, target=FiberStatus.CANCELLED)
    def cancel(self) -> None:
        pass


class SubmissionStatus(models.TextChoices):
    PENDING = "pending"  # accepted and stored; its turn is queued (or soon will be) behind the agent's others
    RUNNING = "running"  # its turn started: its messages are now part of the conversation
    COMPLETED = "completed"  # its turn answered
    CANCELLED = "cancelled"  # stopped by someone: pending, its messages were never added
    SKIPPED = "skipped"  # its turn was sealed (it waited too long, or was interrupted too often)
    ERROR = "error"  # its turn failed


SUBMISSION_OPEN = [SubmissionStatus.PENDING, SubmissionStatus.RUNNING]
SUBMISSION_ENDED = [
    SubmissionStatus.COMPLETED,
    SubmissionStatus.CANCELLED,
    SubmissionStatus.SKIPPED,
    SubmissionStatus.ERROR,
]
# How a submission ends when its turn does.
SUBMISSION_OF_TURN = {
    TurnStatus.COMPLETED: SubmissionStatus.COMPLETED,
    TurnStatus.CANCELLED: SubmissionStatus.CANCELLED,
    TurnStatus.SEALED: SubmissionStatus.SKIPPED,
    TurnStatus.FAILED: SubmissionStatus.ERROR,
}


# A submission in its agent's inbox: accepted, its turn not queued yet.
INBOX = models.Q(turn__isnull=True, status=SubmissionStatus.PENDING)


class Submission(FSMModelMixin, models.Model):
    """Messages another system handed to an agent (``POST .../submissions``, ``agents.submit``):
    stored (and committed) before anything runs, answered by one turn that waits in the agent's
    queue with the chat's own. Its messages join the conversation only when that turn starts
    (``delivered_at``), so a submission cancelled while pending leaves no trace in it; one cancelled
    while running was delivered, and its turn stopped."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="submissions")
    # Empty while it waits in the agent's inbox: accepted over HTTP, its turn not queued yet (the
    # worker's ``submissions_queue`` numbers it, before any later turn of the agent).
    turn = models.OneToOneField(Turn, null=True, blank=True, on_delete=models.PROTECT, related_name="submission")
    status = FSMField(default=SubmissionStatus.PENDING, choices=SubmissionStatus.choices, protected=True)
    # "" when the caller gave none: then every call is a new submission. A key is the caller's own:
    # another caller's same key is another submission (a member cannot take a webhook's or a
    # schedule's key first, nor two members each other's).
    idempotency_key = models.CharField(max_length=255, blank=True)
    caller = models.CharField(
        max_length=300,
        blank=True,
        help_text="Whose idempotency key it is: user:<id>, webhook:<source>, schedule:<name>, command or system.",
    )
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of the messages and metadata as JSON.")
    messages = models.JSONField(help_text='[{"role": "user", "content": "..."}, ...]')
    metadata = models.JSONField(default=dict, blank=True)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When its turn started and its messages joined the conversation; empty if they never did.",
    )
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["agent", "caller", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="agents_submission_caller_key",
            )
        ]
        indexes = [
            models.Index(fields=["agent", "status", "created_at"], name="agents_submission_list"),
            # The inbox: accepted, its turn not queued yet. Small (a worker empties it within
            # moments), read by agent to queue it and by submitter to count their open work.
            models.Index(fields=["agent", "created_at"], name="agents_submission_inbox", condition=INBOX),
            models.Index(fields=["submitted_by"], name="agents_submission_inbox_by", condition=INBOX),
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"submission {self.pk} to {self.agent}"

    @property
    def is_ended(self) -> bool:
        return self.status in SUBMISSION_ENDED

    @transition(field=status, source=SubmissionStatus.PENDING, target=SubmissionStatus.RUNNING)
    def begin(self) -> None:
        """Its turn started."""

    @transition(field=status, source=SUBMISSION_OPEN, target=RETURN_VALUE(*SUBMISSION_ENDED))
    def end(self, status: str) -> str:
        """Its turn ended (or it was cancelled while pending); ``status``: one of SUBMISSION_ENDED."""
        return status
