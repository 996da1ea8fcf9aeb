"""Agents in the admin: each conversation, its turns, and for each turn its stream, the tool calls
and results it added, how often it was recovered and why it ended, with a link to the run that
drove it. Read-only: turns move only through the services (the status is a protected FSM field),
and chunks and messages are history."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from agents.models import Agent, Chunk, Fiber, Message, Submission, Turn
from workflows.admin import ReadOnlyAdmin, ReadOnlyInline, run_admin_link


class TurnInline(ReadOnlyInline[Turn, Agent]):
    model = Turn
    fields = ("number", "status", "requested_by", "recoveries", "end_reason", "created_at", "finished_at")
    readonly_fields = fields
    ordering = ("-number",)
    show_change_link = True


class MessageInline(ReadOnlyInline[Message, Turn]):
    model = Message
    fields = ("role", "text", "parts", "author", "created_at")
    readonly_fields = fields
    ordering = ("id",)


class ChunkInline(ReadOnlyInline[Chunk, Turn]):
    model = Chunk
    fields = ("seq", "type", "data", "created_at")
    readonly_fields = fields
    ordering = ("seq",)


class FiberInline(ReadOnlyInline[Fiber, Agent]):
    model = Fiber
    fields = ("name", "status", "fn", "attempts", "stash_version", "end_reason", "created_at", "finished_at")
    readonly_fields = fields
    ordering = ("-created_at",)
    show_change_link = True


@admin.register(Agent)
class AgentAdmin(ReadOnlyAdmin[Any]):
    list_display = ("kind", "name", "account", "state_version", "updated_at")
    list_filter = ("kind",)
    list_select_related = ("account",)
    search_fields = ("name", "account__slug")
    fields = ("account", "kind", "name", "state", "state_version", "created_at", "updated_at")
    readonly_fields = fields
    inlines = (TurnInline, FiberInline)


@admin.register(Turn)
class TurnAdmin(ReadOnlyAdmin[Any]):
    list_display = ("__str__", "status", "requested_by", "recoveries", "end_reason", "created_at", "run_link")
    list_filter = ("status", "agent__kind")
    list_select_related = ("agent__account", "requested_by")
    search_fields = ("id", "agent__name", "agent__account__slug")
    fields = (
        "agent",
        "number",
        "status",
        "source",
        "requested_by",
        "run_link",
        "text",
        "recoveries",
        "end_reason",
        "created_at",
        "started_at",
        "finished_at",
    )
    readonly_fields = fields
    inlines = (MessageInline, ChunkInline)

    @admin.display(description="run")
    def run_link(self, obj: Turn) -> str:
        return run_admin_link(obj.run_id)


@admin.register(Fiber)
class FiberAdmin(ReadOnlyAdmin[Any]):
    """An agent's background jobs: what each stashed last, how often its worker was lost, how it
    ended, and the run that drove it."""

    list_display = ("name", "agent", "status", "attempts", "stash_version", "end_reason", "created_at", "run_link")
    list_filter = ("status", "agent__kind")
    list_select_related = ("agent__account",)
    search_fields = ("id", "name", "idempotency_key", "agent__name", "agent__account__slug")
    fields = (
        "agent",
        "name",
        "fn",
        "status",
        "idempotency_key",
        "requested_by",
        "run_link",
        "input",
        "stash",
        "stash_version",
        "attempts",
        "result",
        "error",
        "end_reason",
        "created_at",
        "updated_at",
        "finished_at",
    )
    readonly_fields = fields

    @admin.display(description="run")
    def run_link(self, obj: Fiber) -> str:
        return run_admin_link(obj.run_id)


@admin.register(Submission)
class SubmissionAdmin(ReadOnlyAdmin[Any]):
    """Work other systems handed an agent (the API, a webhook, a schedule, the command): what was
    submitted, under which key, and the turn that took it up."""

    list_display = ("id", "agent", "status", "caller", "idempotency_key", "submitted_by", "created_at", "finished_at")
    list_filter = ("status", "agent__kind")
    list_select_related = ("agent__account", "submitted_by")
    search_fields = ("=id", "=idempotency_key", "agent__name", "agent__account__slug")
    fields = (
        "agent",
        "status",
        "turn",
        "caller",
        "idempotency_key",
        "fingerprint",
        "submitted_by",
        "messages",
        "metadata",
        "created_at",
        "delivered_at",
        "finished_at",
    )
    readonly_fields = fields
