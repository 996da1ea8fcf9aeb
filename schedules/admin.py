"""Admin: schedules (added, edited, enabled, disabled, fired now, deleted) and their firings,
read-only (written by the tick and by "fire now" only). Edits go through the services, which keep
the tick's next due time as the tick wrote it unless the timing changed."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import OuterRef, QuerySet, Subquery
from django.forms import ModelForm
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from schedules.models import Outcome, Schedule, ScheduleFiring
from schedules.services import (
    ScheduleChanged,
    schedule_fire,
    schedule_lock_as_seen,
    schedule_save,
    schedule_settings,
    schedules_enable,
)
from workflows.admin import JSON_FORM_FIELDS, ReadOnlyAdmin, run_admin_link

RECENT_FIRINGS = 20
HEADER = "<tr><th>due</th><th>trigger</th><th>outcome</th><th>run or submission</th><th>error</th></tr>"


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S %Z") if value else "-"


def _what(firing: ScheduleFiring) -> str:
    return run_admin_link(firing.run_id) if firing.run_id else str(firing.submission_id or "-")


class ScheduleForm(ModelForm[Schedule]):
    """Carries the schedule's settings as the page loaded them (``seen``): a save from a page opened
    before someone else changed the schedule (disabled it, say) is refused, not written over it."""

    seen = forms.CharField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = Schedule
        fields = "__all__"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["seen"].initial = json.dumps(schedule_settings(self.instance))

    def clean_seen(self) -> dict[str, Any] | None:
        # The refusal is the form's, above every field: on the hidden field itself, the admin
        # hides it with the field, leaving only "Please correct the error below."
        if self.instance.pk is None:
            return None
        try:
            seen = json.loads(self.cleaned_data.get("seen") or "")
        except (ValueError, RecursionError):  # (a page's own is a flat object; "[[[…" is not)
            seen = None
        # Checked against the row as it is now, locked until the admin's change view (one
        # transaction) has saved it: schedule_save then finds it as checked here.
        try:
            if not isinstance(seen, dict):
                raise ScheduleChanged("the page did not say what it showed")
            schedule_lock_as_seen(pk=self.instance.pk, seen=seen)
        except ScheduleChanged:
            self.add_error(None, forms.ValidationError(STALE, code="stale"))
            return None
        return seen


STALE = "This schedule changed since the page was opened; reload it and make your change again."


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin[Schedule]):
    """Schedules are configuration with the system's own reach: one may start any workflow, private
    ones with any payload, and submit to any account's agent. So only superusers add, change, fire
    or delete them; staff with the view permission see them and their firings."""

    form = ScheduleForm
    list_display = ("name", "what", "when", "enabled", "next_due_at", "last_fired_at", "latest_outcome", "firings_link")
    list_filter = ("enabled", "action")
    search_fields = ("name", "workflow", "account", "agent_kind", "agent_name")
    formfield_overrides = JSON_FORM_FIELDS
    actions = ("enable", "disable", "fire_now")
    readonly_fields = ("next_due_at", "last_fired_at", "created_at", "updated_at", "recent_firings")
    fieldsets = (
        (None, {"fields": ("name", "description", "enabled", "seen")}),
        ("When", {"fields": ("cron", "interval_seconds", "timezone", "next_due_at", "last_fired_at")}),
        ("What: a workflow", {"fields": ("action", "workflow", "payload")}),
        ("What: a submission to an agent", {"fields": ("account", "agent_kind", "agent_name", "message")}),
        ("Firings", {"fields": ("recent_firings", "created_at", "updated_at")}),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        # The latest firing's outcome, in the list's one query: a schedule that fails every night
        # says so there (its last_fired_at is when it last fired, however that went).
        latest = ScheduleFiring.objects.filter(schedule=OuterRef("pk")).order_by("-fired_at", "-id")
        return super().get_queryset(request).annotate(latest_outcome=Subquery(latest.values("outcome")[:1]))

    @admin.display(description="latest outcome", ordering="latest_outcome")
    def latest_outcome(self, schedule: Schedule) -> str:
        outcome = getattr(schedule, "latest_outcome", None)
        if outcome == Outcome.FAILED:
            return format_html('<strong style="color: var(--error-fg)">{}</strong>', outcome)
        return outcome or "-"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser) and super().has_add_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser) and super().has_delete_permission(request, obj)

    @admin.display(description="what")
    def what(self, schedule: Schedule) -> str:
        return schedule.describe_action()

    @admin.display(description="when")
    def when(self, schedule: Schedule) -> str:
        return schedule.describe_spec()

    @admin.display(description="firings")
    def firings_link(self, schedule: Schedule) -> str:
        url = reverse("admin:schedules_schedulefiring_changelist")
        return format_html('<a href="{}?schedule__id__exact={}">firings</a>', url, schedule.pk)

    @admin.display(description=f"latest {RECENT_FIRINGS} firings")
    def recent_firings(self, schedule: Schedule) -> str:
        if schedule.pk is None:
            return "-"
        rows = ScheduleFiring.objects.filter(schedule=schedule).order_by("-due_at")[:RECENT_FIRINGS]
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    _when(f.due_at),
                    f.trigger,
                    f.outcome,
                    run_admin_link(f.run_id) if f.run_id else f.submission_id or "-",
                    f.error or "",
                )
                for f in rows
            ),
        )
        if not rows:
            return "none yet"
        return format_html('<table class="schedule-firings">{}{}</table>', mark_safe(HEADER), body)

    def save_model(self, request: HttpRequest, obj: Schedule, form: ModelForm[Schedule], change: bool) -> None:
        # The admin's change view is one transaction: the row checked in the form is the one saved.
        seen = form.cleaned_data.get("seen") if change else None
        schedule_save(schedule=obj, changed=form.changed_data if change else (), seen=seen)

    # --- actions: thin, one service call ---
    @admin.action(description="Enable selected schedules (next due from now)", permissions=["change"])
    def enable(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        changed = schedules_enable(schedules=list(queryset), enabled=True)
        self.message_user(request, f"{changed} schedule(s) enabled.", messages.SUCCESS)

    @admin.action(description="Disable selected schedules", permissions=["change"])
    def disable(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        changed = schedules_enable(schedules=list(queryset), enabled=False)
        self.message_user(request, f"{changed} schedule(s) disabled.", messages.SUCCESS)

    @admin.action(description="Fire selected schedules now", permissions=["change"])
    def fire_now(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for schedule in queryset:
            firing = schedule_fire(schedule=schedule)
            if firing is None:
                self.message_user(
                    request, f"Schedule {schedule.name}: fired at this instant already.", messages.WARNING
                )
            elif firing.outcome == "failed":
                self.message_user(request, f"Schedule {schedule.name}: failed: {firing.error}", messages.ERROR)
            else:
                self.message_user(request, f"Schedule {schedule.name}: {firing.outcome}.", messages.SUCCESS)


@admin.register(ScheduleFiring)
class ScheduleFiringAdmin(ReadOnlyAdmin[ScheduleFiring]):
    list_display = ("due_at", "schedule", "trigger", "outcome", "run_link", "submission_id", "fired_at", "short_error")
    list_filter = ("schedule", "outcome", "trigger")
    list_select_related = ("schedule",)
    search_fields = ("=idempotency_key",)
    search_help_text = "An idempotency key (exact): schedule:<name>:<due time>."
    date_hierarchy = "due_at"
    show_full_result_count = False
    fields = readonly_fields = (
        "schedule",
        "due_at",
        "fired_at",
        "trigger",
        "outcome",
        "idempotency_key",
        "run_link",
        "submission_id",
        "error",
    )

    @admin.display(description="run")
    def run_link(self, firing: ScheduleFiring) -> str:
        return run_admin_link(firing.run_id)

    @admin.display(description="error")
    def short_error(self, firing: ScheduleFiring) -> str:
        return firing.error[:120]
