"""The approvals console: the pending queue, a request's page with the version under review, and
Approve / Reject buttons that carry that version.

Requests are never added, edited or deleted here. The only write is the decision, POSTed (with
CSRF) to ``<id>/decide/``, which calls ``approvals.services.approval_decide``: that service checks
everything again with the rows locked and logs every attempt, refusals included.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.timesince import timesince, timeuntil

from approvals.exceptions import FORBIDDEN, ApprovalRefused
from approvals.models import NOTE_MAX, VERSION_MAX, ApprovalRequest, ApprovalStatus, DecisionChannel, DecisionLog
from approvals.selectors import approval_list, can_see_all, group_names, may_decide_now, superseded_by
from approvals.services import approval_decide
from workflows.admin import ReadOnlyAdmin, ReadOnlyInline, pretty_json

ALL = "all"


class DecisionForm(forms.Form):
    """The decision as the change page posts it: the version reviewed rides in a hidden field."""

    version = forms.CharField(max_length=VERSION_MAX, widget=forms.HiddenInput)
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    note = forms.CharField(max_length=NOTE_MAX, required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}))


class StatusFilter(admin.SimpleListFilter):
    """Status, pending by default: the changelist opens on the queue of work to do."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        return [*ApprovalStatus.choices, (ALL, "All")]

    def value(self) -> str:
        return str(super().value() or ApprovalStatus.PENDING)

    def queryset(self, request: HttpRequest, queryset: QuerySet[ApprovalRequest]) -> QuerySet[ApprovalRequest]:
        value = self.value()
        return queryset if value == ALL else queryset.filter(status=value)

    def choices(self, changelist: Any) -> Any:
        # Without the default "All" entry (value None), which here would mean "pending".
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == str(lookup),
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }


class DecisionLogInline(ReadOnlyInline[DecisionLog, ApprovalRequest]):
    model = DecisionLog
    verbose_name = "decision"
    verbose_name_plural = "decision log (every attempt, refusals included)"
    fields = readonly_fields = (
        "created_at",
        "actor_name",
        "action",
        "version",
        "result",
        "code",
        "message",
        "note",
        "channel",
    )

    def has_view_permission(self, request: HttpRequest, obj: ApprovalRequest | None = None) -> bool:
        return True  # whoever may see the request (checked by the parent admin) sees its log


REQUEST_FIELDS = (
    "id",
    "status",
    "summary",
    "subject",
    "version",
    "approvers",
    "requested_by",
    "replaces",
    "superseded_by_link",
)
CONTENT_FIELDS = ("content_pretty",)
TIME_FIELDS = ("created_at", "age", "expires_at", "expiry", "decided_by", "decided_at", "note")
RUN_FIELDS = ("run_link", "attempt", "step_name")


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(admin.ModelAdmin[ApprovalRequest]):
    list_display = ("id", "summary", "subject", "version", "status", "requested_by", "approvers", "age", "expiry")
    list_filter = (StatusFilter, "approvers")
    list_select_related = ("requested_by",)
    search_fields = ("summary", "=subject_id", "=version")
    search_help_text = "Summary text, or an exact subject id or version."
    ordering = ("created_at", "id")  # the queue: oldest first
    list_per_page = 50
    inlines = (DecisionLogInline,)
    change_form_template = "admin/approvals/approvalrequest/change_form.html"
    fieldsets = (
        (None, {"fields": REQUEST_FIELDS}),
        ("The version under review", {"fields": CONTENT_FIELDS}),
        ("Times and decision", {"fields": TIME_FIELDS}),
        ("Workflow", {"fields": RUN_FIELDS}),
    )
    readonly_fields = REQUEST_FIELDS + CONTENT_FIELDS + TIME_FIELDS + RUN_FIELDS

    # --- permissions: reviewers see their groups' requests; nothing is added, edited or deleted ---
    def get_queryset(self, request: HttpRequest) -> QuerySet[ApprovalRequest]:
        return approval_list(user=request.user).select_related("requested_by", "decided_by")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        if not (user.is_active and user.is_staff):
            return False
        if obj is None:
            return can_see_all(user) or bool(group_names(user))
        return approval_list(user=user).filter(pk=obj.pk).exists()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # requests are raised by workflows (wait_for_approval)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the decision is the only change, through the buttons below

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a request is part of the audit trail

    # --- columns and fields ---
    @admin.display(description="subject")
    def subject(self, obj: ApprovalRequest) -> str:
        return f"{obj.subject_type} {obj.subject_id}"

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: ApprovalRequest) -> str:
        return timesince(obj.created_at)

    @admin.display(description="expiry", ordering="expires_at")
    def expiry(self, obj: ApprovalRequest) -> str:
        if not obj.is_pending:
            return "-"
        if obj.is_overdue():
            return f"overdue since {timesince(obj.expires_at)}"
        return f"in {timeuntil(obj.expires_at)}"

    @admin.display(description="content of this version")
    def content_pretty(self, obj: ApprovalRequest) -> str:
        return pretty_json(obj.content)

    @admin.display(description="superseded by")
    def superseded_by_link(self, obj: ApprovalRequest) -> str:
        replacement = superseded_by(obj)
        if replacement is None:
            return "-"
        url = reverse("admin:approvals_approvalrequest_change", args=[replacement.pk])
        return format_html(
            '<a href="{}">request {} (version {}, {})</a>', url, replacement.pk, replacement.version, replacement.status
        )

    @admin.display(description="run")
    def run_link(self, obj: ApprovalRequest) -> str:
        url = reverse("admin:workflows_workflowrun_change", args=[obj.run_id])
        return format_html('<a href="{}">{}</a> (waits for event “{}”)', url, obj.run_id, obj.event_type)

    # --- the change page offers the decision to those who may make it ---
    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = dict(extra_context or {})
        obj = self.get_object(request, object_id)
        if obj is not None and may_decide_now(request.user, obj):
            context["decision_form"] = DecisionForm(initial={"version": obj.version})
            context["decide_url"] = reverse("admin:approvals_approvalrequest_decide", args=[obj.pk])
        return super().change_view(request, object_id, form_url, context)

    def get_urls(self) -> list[URLPattern]:
        # admin_view: staff login and CSRF protection (csrf_protect) for the POST.
        decide = path(
            "<path:object_id>/decide/",
            self.admin_site.admin_view(self.decide_view),
            name="approvals_approvalrequest_decide",
        )
        return [decide, *super().get_urls()]

    def decide_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST only: parse the form, call the service once, report its answer."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = self.get_object(request, object_id)
        if obj is None or not self.has_view_permission(request, obj):
            raise Http404("No such approval request.")
        change_url = reverse("admin:approvals_approvalrequest_change", args=[obj.pk])
        form = DecisionForm(request.POST)
        if not form.is_valid():
            self.message_user(request, f"The decision was not understood: {form.errors.as_text()}", messages.ERROR)
            return HttpResponseRedirect(change_url)
        data = form.cleaned_data
        approve = data["decision"] == "approve"
        try:
            decided = approval_decide(
                request_id=obj.pk,
                by=request.user,
                approve=approve,
                version=data["version"],
                note=data["note"],
                channel=DecisionChannel.ADMIN,
            )
        except ApprovalRefused as refusal:
            if refusal.code in FORBIDDEN:
                return self._forbidden(request, obj, refusal)
            self.message_user(request, f"Refused: {refusal}", messages.ERROR)
            if refusal.superseded_by is not None:  # straight to the version to review now
                change_url = reverse("admin:approvals_approvalrequest_change", args=[refusal.superseded_by])
            return HttpResponseRedirect(change_url)
        word = "approved" if approve else "rejected"
        if decided.created:
            self.log_change(request, decided.request, f"{word} version {decided.request.version}")
            self.message_user(
                request, f"Request {obj.pk} {word} (version {obj.version}); the workflow resumes.", messages.SUCCESS
            )
        else:
            self.message_user(
                request, f"Request {obj.pk} was already {decided.request.status}; nothing changed.", messages.INFO
            )
        return HttpResponseRedirect(reverse("admin:approvals_approvalrequest_changelist"))

    def _forbidden(self, request: HttpRequest, obj: ApprovalRequest, refusal: ApprovalRefused) -> HttpResponse:
        """403 with the reason: the buttons were never offered to this user (the refusal is logged)."""
        context = {
            **self.admin_site.each_context(request),
            "title": "Not allowed",
            "opts": self.opts,
            "original": obj,
            "reason": str(refusal),
        }
        return TemplateResponse(request, "admin/approvals/approvalrequest/forbidden.html", context, status=403)


@admin.register(DecisionLog)
class DecisionLogAdmin(ReadOnlyAdmin[DecisionLog]):
    """Every attempt to decide, and what the system did to requests: read-only, for audit."""

    list_display = ("created_at", "request", "actor_name", "action", "version", "result", "code", "channel")
    list_filter = ("result", "action", "channel", "code")
    search_fields = ("actor_name", "=request__id", "message")
    list_select_related = ("request",)
    list_per_page = 100
    readonly_fields = (
        "request",
        "actor",
        "actor_name",
        "action",
        "version",
        "result",
        "code",
        "message",
        "note",
        "channel",
        "created_at",
    )

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff and can_see_all(request.user))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)
