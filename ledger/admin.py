"""The operations console: those needing attention first, reconcile now, resolve by hand with a note.

Nothing here writes an operation directly (a form loaded a minute ago would overwrite what a
worker recorded since): the change page is read-only and every change is an action that calls
``ledger.services``, which locks the row. Operational records are read-only too.
"""

from __future__ import annotations

from typing import Any, Literal

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.db.models.expressions import Combinable
from django.http import HttpRequest
from django.template.response import TemplateResponse

from ledger import services
from ledger.conf import conf as ledger_conf
from ledger.exceptions import ResolutionRefused
from ledger.models import ExternalOperation, OperationalRecord, OperationEvent
from ledger.redaction import redact
from ledger.selectors import (
    ATTENTION_LABELS,
    NONE_RANK,
    attention_label,
    can_resolve_operations,
    can_see_operations,
    operation_list,
    resolvable_by_hand,
)
from workflows.admin import ReadOnlyAdmin, ReadOnlyInline
from workflows.admin import pretty_json as workflows_pretty_json


def pretty_json(value: Any, *, limit: int = 20_000) -> str:
    """Redacted, indented JSON in a <pre>, cut at ``limit`` characters."""
    return workflows_pretty_json(redact(value), limit=limit)


class AttentionFilter(admin.SimpleListFilter):
    title = "needs attention"
    parameter_name = "attention"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        return [("any", "any reason"), *((str(rank), label) for rank, label in ATTENTION_LABELS.items())]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "any":
            return queryset.exclude(attention_rank=NONE_RANK)
        if self.value() in {str(rank) for rank in ATTENTION_LABELS}:
            return queryset.filter(attention_rank=int(str(self.value())))
        return queryset


class OperationEventInline(ReadOnlyInline[OperationEvent, ExternalOperation]):
    """The audit trail: every submit, lookup and manual resolution, oldest first."""

    model = OperationEvent
    verbose_name_plural = "what happened (every submit, lookup and resolution)"
    ordering = ("created_at", "id")
    fields = readonly_fields = (
        "created_at",
        "kind",
        "outcome",
        "status_before",
        "status_after",
        "note",
        "detail_pretty",
    )

    @admin.display(description="detail")
    def detail_pretty(self, event: OperationEvent) -> str:
        return pretty_json(event.detail, limit=4_000)

    def has_view_permission(self, request: HttpRequest, obj: ExternalOperation | None = None) -> bool:
        return can_see_operations(request.user)


class ResolveForm(forms.Form):
    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80}),
        strip=True,
        help_text="Required: how you know the outcome (e.g. checked the provider's dashboard, reference …).",
    )


OPERATION_FIELDS = ("key", "system", "action", "status", "attention", "note", "submit_count", "lookup_count")
DATA_FIELDS = ("request_pretty", "response_pretty", "error_pretty")
RESOLUTION_FIELDS = ("resolved_by", "resolved_at", "resolution_note")
TIME_FIELDS = ("created_at", "submitted_at", "looked_up_at", "finished_at", "updated_at")


@admin.register(ExternalOperation)
class ExternalOperationAdmin(admin.ModelAdmin[ExternalOperation]):
    list_display = (
        "key",
        "system",
        "action",
        "status",
        "attention",
        "submit_count",
        "submitted_at",
        "resolved_by",
        "created_at",
    )
    list_filter = ("status", "system", AttentionFilter)
    # Stored as the caller gave them and shown only redacted, so never filtered on in the URL
    # (config.admin): ?request__address__startswith=a would read a redacted value out a character
    # at a time. The hash of the request would confirm a guess of all of it.
    unfilterable_fields = ("request", "response", "error", "request_hash")
    list_select_related = ("resolved_by",)
    search_fields = ("=key", "key")
    search_help_text = "An operation key (exact or part of it)."
    list_per_page = 50
    show_full_result_count = False
    inlines = (OperationEventInline,)
    actions = ("reconcile_now", "mark_succeeded", "mark_failed")
    fieldsets = (
        (None, {"fields": OPERATION_FIELDS}),
        ("Data (personal data redacted)", {"fields": DATA_FIELDS}),
        ("Resolved by hand", {"fields": RESOLUTION_FIELDS}),
        ("Times", {"fields": TIME_FIELDS}),
    )
    readonly_fields = OPERATION_FIELDS + DATA_FIELDS + RESOLUTION_FIELDS + TIME_FIELDS

    # --- permissions: view to see, resolve to act; nothing is added, edited or deleted here ---
    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return can_see_operations(request.user)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # operations are created by perform(), which sends them

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # changes go through the actions (the services), which lock the row

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the record that an effect happened (or may have) is the point of the ledger

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        return can_resolve_operations(request.user)

    # --- list: those needing attention first ---
    def get_queryset(self, request: HttpRequest) -> QuerySet[ExternalOperation]:
        # Not super(): it orders before we could annotate, and the order is by the annotation.
        return operation_list().order_by(*self.get_ordering(request))

    def get_ordering(self, request: HttpRequest) -> list[str | Combinable]:
        # Here rather than in ``ordering``, which may only name model fields, not annotations.
        return ["attention_rank", "-created_at"]

    @admin.display(description="needs attention", ordering="attention_rank")
    def attention(self, op: ExternalOperation) -> str:
        # Annotated by get_queryset, which the change page's get_object uses too.
        return attention_label(getattr(op, "attention_rank", None)) or "-"

    @admin.display(description="request")
    def request_pretty(self, op: ExternalOperation) -> str:
        return pretty_json(op.request)

    @admin.display(description="response")
    def response_pretty(self, op: ExternalOperation) -> str:
        return pretty_json(op.response)

    @admin.display(description="error")
    def error_pretty(self, op: ExternalOperation) -> str:
        return pretty_json(op.error)

    # --- actions: thin, one service call per operation, each result reported ---
    @admin.action(description="Reconcile now (look the selected operations up)", permissions=["resolve"])
    def reconcile_now(self, request: HttpRequest, queryset: QuerySet[ExternalOperation]) -> None:
        # Ids only: the service re-reads and locks each row; a status read here could be stale.
        for operation_id in queryset.values_list("pk", flat=True):
            result = services.operation_reconcile(operation_id=operation_id)
            level = {"resolved": messages.SUCCESS, "flagged": messages.WARNING}.get(result.verdict, messages.INFO)
            change = f"{result.before} → {result.after}"
            self.message_user(request, f"Operation {result.key}: {change}: {result.note}", level)

    @admin.action(description="Mark succeeded (resolve by hand, with a note)", permissions=["resolve"])
    def mark_succeeded(self, request: HttpRequest, queryset: QuerySet[ExternalOperation]) -> TemplateResponse | None:
        return self._resolve(request, queryset, "succeeded")

    @admin.action(description="Mark failed (resolve by hand, with a note)", permissions=["resolve"])
    def mark_failed(self, request: HttpRequest, queryset: QuerySet[ExternalOperation]) -> TemplateResponse | None:
        return self._resolve(request, queryset, "failed")

    def _resolve(
        self, request: HttpRequest, queryset: QuerySet[ExternalOperation], outcome: Literal["succeeded", "failed"]
    ) -> TemplateResponse | None:
        """First a page asking for the note; then, with a non-empty note, the service per operation."""
        form = ResolveForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            for operation_id, key in queryset.values_list("pk", "key"):
                try:
                    op = services.operation_resolve(
                        operation_id=operation_id, outcome=outcome, note=form.cleaned_data["note"], user=request.user
                    )
                except ResolutionRefused as exc:
                    self.message_user(request, f"Operation {key}: not resolved: {exc}", messages.ERROR)
                else:
                    self.message_user(request, f"Operation {key}: resolved by hand as {op.status}", messages.SUCCESS)
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": f"Mark {len(queryset)} operation(s) {outcome}",
            "opts": self.model._meta,
            "operations": list(queryset),
            "outcome": outcome,
            "action": request.POST.get("action", ""),
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "unresolvable": [op.key for op in queryset if not resolvable_by_hand(op)],
            # Marking failed what was sent: the provider may still act on it (see the page).
            "sent": [op.key for op in queryset if op.submit_count] if outcome == "failed" else [],
            "recheck_days": ledger_conf()["RECHECK_RESOLVED_DAYS"],
        }
        return TemplateResponse(request, "admin/ledger/externaloperation/resolve.html", context)


@admin.register(OperationalRecord)
class OperationalRecordAdmin(ReadOnlyAdmin[OperationalRecord]):
    """Read-only: records are written by record_create (redacted) and removed only by purge_records."""

    list_display = ("created_at", "request_id", "tool", "step", "run", "approval_pending", "observed_at")
    list_filter = ("approval_pending", "tool")
    search_fields = ("=request_id",)
    search_help_text = "A request id (exact)."
    list_per_page = 50
    show_full_result_count = False
    fields = readonly_fields = (
        "request_id",
        "run",
        "operation",
        "step",
        "tool",
        "observed_at",
        "approval_pending",
        "response_pretty",
        "created_at",
    )

    @admin.display(description="external response (redacted)")
    def response_pretty(self, record: OperationalRecord) -> str:
        return pretty_json(record.response)
