"""The runs console: read-only pages over the engine's tables, and controls that go through the services.

Nothing here writes a run directly. The engine owns every field (a save from a form loaded a moment
ago would overwrite what a worker wrote since), so the change page is view-only and the only way
to change a run is an action that calls ``workflows.services``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import display_for_value
from django.core.exceptions import ValidationError
from django.db.models import JSONField, Model, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from workflows import hooks, services
from workflows.exceptions import TransitionNotAllowed
from workflows.models import RunAttempt, RunEvent, RunStatus, StepResult, WorkflowRun
from workflows.selectors import (
    can_control_all_runs,
    can_see_all_runs,
    describe_wait,
    hidden_workflows,
    step_timer,
    waiting_event_types,
)
from workflows.storable import MAX_JSON_DEPTH

# An inline's rows, and the object whose page shows them.
_Row = TypeVar("_Row", bound=Model)
_Page = TypeVar("_Page", bound=Model)

# A step result may be up to 1 MiB of JSON; a page that printed all of it would be unusable.
PREVIEW_CHARS = 4_000


def pretty_json(value: Any, *, limit: int = 50_000) -> str:
    """The value as indented JSON in a <pre>, cut at ``limit`` characters."""
    if value is None:
        return "-"
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    if len(text) > limit:
        text = f"{text[:limit]}\n… ({len(text) - limit:,} more characters)"
    return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', text)


def pretty_error(error: dict[str, Any] | None, *, limit: int = 50_000) -> str:
    """An error record, with its traceback (if any) as plain text rather than one escaped JSON line."""
    if not error:
        return "-"
    fields = {key: value for key, value in error.items() if key != "traceback"}
    traceback = error.get("traceback")
    if not traceback:
        return pretty_json(fields, limit=limit)
    return format_html(
        '{}<pre style="white-space: pre-wrap; margin: 0.5em 0 0">{}</pre>',
        SafeString(pretty_json(fields, limit=limit)),
        str(traceback)[:limit],
    )


class WaitingForFilter(admin.SimpleListFilter):
    """Waiting runs by the event type they wait for."""

    title = "waiting for"
    parameter_name = "waiting_for"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        return [(event_type, f"event “{event_type}”") for event_type in waiting_event_types()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        if self.value():
            return queryset.filter(status=RunStatus.WAITING, wait_event_type=self.value())
        return queryset


def run_admin_link(run_id: UUID | None) -> str:
    """A link to a run's admin page, for the apps' admins that show the run behind a row ("-" for none)."""
    if run_id is None:
        return "-"
    return format_html('<a href="{}">{}</a>', reverse("admin:workflows_workflowrun_change", args=[run_id]), run_id)


class JSONFormField(forms.JSONField):
    """Django's form field for JSON, with JSON nested past what the parser reads a field error: its
    ``to_python`` (the form's check) and ``bound_data`` (the page drawn again with the error) let
    the RecursionError through, a 500 for "[[[…" typed into a payload."""

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except RecursionError:
            raise ValidationError(f"Nested more than {MAX_JSON_DEPTH} levels deep.", code="invalid") from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return forms.fields.InvalidJSONInput(data)


# ModelAdmin.formfield_overrides of an admin whose forms edit a JSON field.
JSON_FORM_FIELDS: dict[type, dict[str, Any]] = {JSONField: {"form_class": JSONFormField}}


class ReadOnlyAdmin(admin.ModelAdmin[_Row]):
    """A model's rows written by services (a record, a log, a delivery), listed and shown, never
    added, edited or deleted here. Who may view them is the model's view permission, unless the
    subclass says otherwise."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline[_Row, _Page]):
    """Rows written by services (an audit trail, a timeline), shown and never edited here. The
    apps' admins subclass it and say who may view them."""

    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: _Page | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: _Page | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: _Page | None = None) -> bool:
        return False


class _ReadOnlyInline(ReadOnlyInline[_Row, WorkflowRun]):
    """Rows the engine writes, shown to whoever may see the run (no separate per-model permission)."""

    def has_view_permission(self, request: HttpRequest, obj: WorkflowRun | None = None) -> bool:
        return can_see_all_runs(request.user)


class StepResultInline(_ReadOnlyInline[StepResult]):
    """The step timeline of every attempt, oldest attempt first."""

    model = StepResult
    verbose_name = "step"
    verbose_name_plural = "step timeline (every attempt)"
    ordering = ("attempt", "position")
    fields = readonly_fields = (
        "attempt",
        "position",
        "name",
        "kind",
        "status",
        "tries",
        "started_at",
        "finished_at",
        "timer",
        "result_preview",
        "error_preview",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[StepResult]:
        return super().get_queryset(request).select_related("run")  # for the timer: one query, not one a step

    @admin.display(description="timer")
    def timer(self, step: StepResult) -> str:
        """The step's timer while it can fire, as the API shows it (``step_timer``). Shown as the
        admin shows a date (a read-only callable's value would be printed raw: "None", an ISO time
        with microseconds)."""
        return display_for_value(step_timer(step, step.run), self.get_empty_value_display())

    @admin.display(description="result")
    def result_preview(self, step: StepResult) -> str:
        return pretty_json(step.result, limit=PREVIEW_CHARS)

    @admin.display(description="error")
    def error_preview(self, step: StepResult) -> str:
        return pretty_error(step.error, limit=PREVIEW_CHARS)


class RunAttemptInline(_ReadOnlyInline[RunAttempt]):
    model = RunAttempt
    verbose_name = "attempt"
    ordering = ("number",)
    fields = readonly_fields = ("number", "status", "started_at", "finished_at", "result_preview", "error_preview")

    @admin.display(description="result")
    def result_preview(self, attempt: RunAttempt) -> str:
        return pretty_json(attempt.result, limit=PREVIEW_CHARS)

    @admin.display(description="error")
    def error_preview(self, attempt: RunAttempt) -> str:
        return pretty_error(attempt.error, limit=PREVIEW_CHARS)


class RunEventInline(_ReadOnlyInline[RunEvent]):
    model = RunEvent
    verbose_name = "event"
    ordering = ("created_at", "id")
    fields = readonly_fields = (
        "type",
        "payload_preview",
        "idempotency_key",
        "created_at",
        "consumed_attempt",
        "consumed_position",
        "consumed_at",
    )

    @admin.display(description="payload")
    def payload_preview(self, event: RunEvent) -> str:
        return pretty_json(event.payload, limit=PREVIEW_CHARS)


# The change page's groups of fields; all read-only.
RUN_FIELDS = ("id", "workflow", "workflow_version", "status", "attempt", "owner", "idempotency_key", "failure_reason")
WHERE_FIELDS = (
    "waiting_for",
    "wait_step",
    "wait_event_type",
    "wake_at",
    "current_step",
    "pause_requested",
    "attention",
)
DATA_FIELDS = ("payload_pretty", "result_pretty", "error_pretty", "progress_pretty")
ENGINE_FIELDS = ("lease_owner", "lease_expires_at", "enqueued_at", "recovery_count", "dedupe_key")
TIME_FIELDS = ("created_at", "updated_at", "started_at", "finished_at")

# A control service: run_pause, run_resume, run_terminate or run_restart.
Control = Callable[..., WorkflowRun]
# An attempt as the restart confirmation posts it back: ASCII digits, within the column's range.
ATTEMPT = re.compile(r"[1-9][0-9]{0,8}")


@admin.register(WorkflowRun)
class WorkflowRunAdmin(admin.ModelAdmin[WorkflowRun]):
    list_display = (
        "id",
        "workflow",
        "status",
        "owner",
        "attempt",
        "waiting_for",
        "failure_reason",
        "created_at",
    )
    list_filter = ("status", "workflow", "failure_reason", WaitingForFilter)
    list_select_related = ("owner",)
    # The id is matched exactly in get_search_results (a UUID lookup uses the primary key index).
    search_fields = ("workflow", "=idempotency_key")
    search_help_text = "A run id, a workflow name, or an idempotency key."
    list_per_page = 50
    show_full_result_count = False  # COUNT(*) over a large runs table on every page is not free
    inlines = (StepResultInline, RunAttemptInline, RunEventInline)
    actions = ("pause_runs", "resume_runs", "terminate_runs", "restart_runs")
    fieldsets = (
        (None, {"fields": RUN_FIELDS}),
        ("Where it is", {"fields": WHERE_FIELDS}),
        ("Data", {"fields": DATA_FIELDS}),
        ("Engine", {"classes": ("collapse",), "fields": ENGINE_FIELDS}),
        ("Times", {"fields": TIME_FIELDS}),
    )
    readonly_fields = RUN_FIELDS + WHERE_FIELDS + DATA_FIELDS + ENGINE_FIELDS + TIME_FIELDS

    # --- permissions: view to see, control to act; nothing is added, edited or deleted here ---
    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return can_see_all_runs(request.user)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # runs are started through workflows.start(), which schedules them

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # View-only for everyone: saving a form loaded a moment ago would overwrite what a worker
        # wrote since. Changes go through the actions (the services), which lock the row.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a run is its own audit trail; deleting one mid-flight would strand its worker

    def has_control_permission(self, request: HttpRequest) -> bool:
        return can_control_all_runs(request.user)

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowRun]:
        # Not a workflow's runs that need a permission the user lacks (a chat turn's hold the
        # conversation): not listed, and their pages are not found.
        runs = super().get_queryset(request)
        if hidden := hidden_workflows(request.user):
            runs = runs.exclude(workflow__in=hidden)
        return runs

    # --- list ---
    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[WorkflowRun], search_term: str
    ) -> tuple[QuerySet[WorkflowRun], bool]:
        found, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        try:
            run_id = UUID(search_term.strip())
        except ValueError:
            return found, may_have_duplicates
        return found | queryset.filter(pk=run_id), may_have_duplicates

    @admin.display(description="waiting for")
    def waiting_for(self, run: WorkflowRun) -> str:
        return describe_wait(run) or "-"

    # --- change page ---
    @admin.display(description="payload")
    def payload_pretty(self, run: WorkflowRun) -> str:
        return pretty_json(run.payload)

    @admin.display(description="result")
    def result_pretty(self, run: WorkflowRun) -> str:
        return pretty_json(run.result)

    @admin.display(description="needs attention")
    def attention(self, run: WorkflowRun) -> str:
        """What other apps flag for this run (workflows.hooks.run_sections), e.g. the external
        operations a terminated run left in flight that someone must reconcile."""
        sections = hooks.run_sections(run)
        if not sections:
            return "-"
        return format_html_join(
            "",
            '<p><strong>{}</strong> {}</p><pre style="margin: 0">{}</pre>',
            (
                (s["title"], s["note"], "\n".join("  ".join(row) for row in [s["columns"], *s["rows"]]))
                for s in sections
            ),
        )

    @admin.display(description="error")
    def error_pretty(self, run: WorkflowRun) -> str:
        return pretty_error(run.error)

    @admin.display(description="progress (last reported)")
    def progress_pretty(self, run: WorkflowRun) -> str:
        return pretty_json(run.progress)

    # --- actions: thin, one service call per run, its refusal reported as it is ---
    @admin.action(description="Pause selected runs", permissions=["control"])
    def pause_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        self._control(request, queryset, services.run_pause, "paused")

    @admin.action(description="Resume selected runs", permissions=["control"])
    def resume_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        self._control(request, queryset, services.run_resume, "resumed")

    @admin.action(description="Terminate selected runs", permissions=["control"])
    def terminate_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        self._control(request, queryset, services.run_terminate, "terminated")

    @admin.action(description="Restart selected runs (new attempt from the first step)", permissions=["control"])
    def restart_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> TemplateResponse | None:
        """After a page that lists each run's attempt, and restarts that attempt only: the page sent
        twice (a double click, a second tab) finds the run on the attempt the first made, and leaves it."""
        if "apply" not in request.POST:
            context = {
                **self.admin_site.each_context(request),
                "title": "Restart runs",
                "opts": self.model._meta,
                "runs": list(queryset),  # in the order the list shows them, and the results will
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            }
            return TemplateResponse(request, "admin/workflows/workflowrun/restart.html", context)

        def restart_seen(*, run_id: UUID) -> WorkflowRun:
            seen = request.POST.get(f"attempt-{run_id}", "")
            if not ATTEMPT.fullmatch(seen):  # never "whatever attempt is current": that is the API's empty body
                raise TransitionNotAllowed(
                    "not restarted: the confirmation did not say which attempt you saw; select it again",
                    status="",
                )
            return services.run_restart(run_id=run_id, attempt=int(seen))

        self._control(request, queryset, restart_seen, "restarted")
        return None

    def _control(self, request: HttpRequest, queryset: QuerySet[WorkflowRun], control: Control, done: str) -> None:
        # Ids only: each service locks and re-reads its run, so a status read here could be stale.
        for run_id, workflow in queryset.values_list("id", "workflow"):
            label = f"Run {workflow} {run_id}"  # a noun first: the admin capitalises a message
            try:
                run = control(run_id=run_id)
            except TransitionNotAllowed as exc:
                self.message_user(request, f"{label}: {exc}", messages.ERROR)
            except WorkflowRun.DoesNotExist:
                self.message_user(request, f"{label}: the run no longer exists", messages.ERROR)
            else:
                self.message_user(request, f"{label}: {_outcome(run, done)}", messages.SUCCESS)


def _outcome(run: WorkflowRun, done: str) -> str:
    if run.status == RunStatus.RUNNING and run.pause_requested:
        return "pause requested; it pauses at its next step boundary"
    if done == "resumed" and run.status == RunStatus.RUNNING:
        return "pause request withdrawn; it keeps running"
    return f"{done} (now {run.status}, attempt {run.attempt})"
