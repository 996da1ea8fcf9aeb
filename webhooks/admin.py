"""Admin: every delivery, read-only (rows are written by the endpoint and the later actions'
worker, and removed only by ``manage.py webhooks purge``), with the configured sources above the
list, never their secrets. One action: act now on failed or pending later actions."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from webhooks.conf import source_get
from webhooks.models import OPEN_ACTIONS, WebhookDelivery
from webhooks.selectors import source_summaries
from webhooks.services import delivery_act_again
from webhooks.verify import ID_UNSIGNED
from workflows.admin import ReadOnlyAdmin, pretty_json, run_admin_link


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin[WebhookDelivery]):
    change_list_template = "admin/webhooks/webhookdelivery/change_list.html"
    list_display = (
        "received_at",
        "source",
        "event_id_shown",
        "outcome",
        "action_state",
        "reason",
        "size",
        "run_link",
        "operation_key",
    )
    list_filter = ("source", "outcome", "action_state", "reason")
    # Never shown, so never filtered on in the URL either (config.admin): a filter would read the raw
    # body out a character at a time (?raw_body__data__email__startswith=a).
    unfilterable_fields = ("raw_body", "body_digest", "replay_key")
    actions = ("act_again",)
    search_fields = ("=event_id",)
    search_help_text = "An event id (exact)."
    date_hierarchy = "received_at"
    list_per_page = 50
    show_full_result_count = False
    fields = readonly_fields = (
        "source",
        "event_id_shown",
        "outcome",
        "reason",
        "message",
        "received_at",
        "size",
        "action_state",
        "action_attempts",
        "act_after",
        "acted_at",
        "run_link",
        "operation_key",
        "submission_link",
        "result_pretty",
        "headers_pretty",
        "body_pretty",
    )

    @admin.display(description="event id", ordering="event_id")
    def event_id_shown(self, delivery: WebhookDelivery) -> str:
        """The id, and for a rejection before the signature held, that nobody vouched for it: anyone
        can send a forgery under a real event's id."""
        if delivery.event_id and not delivery.event_id_verified:
            return f"{delivery.event_id} (claimed, unverified)"
        source = source_get(delivery.source)
        if delivery.event_id and source is not None and source.scheme in ID_UNSIGNED:
            # github: the body is signed, its delivery id is not (the body identifies it too)
            return f"{delivery.event_id} (not covered by the signature)"
        return delivery.event_id or "-"

    @admin.display(description="run")
    def run_link(self, delivery: WebhookDelivery) -> str:
        return run_admin_link(delivery.run_id)

    @admin.display(description="submission")
    def submission_link(self, delivery: WebhookDelivery) -> str:
        if delivery.submission_id is None:
            return "-"
        url = reverse("admin:agents_submission_change", args=[delivery.submission_id])
        return format_html('<a href="{}">{}</a>', url, delivery.submission_id)

    @admin.display(description="what it did")
    def result_pretty(self, delivery: WebhookDelivery) -> str:
        return pretty_json(delivery.result)

    @admin.display(description="headers (signatures redacted)")
    def headers_pretty(self, delivery: WebhookDelivery) -> str:
        return pretty_json(delivery.headers)

    @admin.display(description="body (redacted; kept once the signature held)")
    def body_pretty(self, delivery: WebhookDelivery) -> str:
        return pretty_json(delivery.body)

    def has_act_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("webhooks.change_webhookdelivery")

    @admin.action(description="Act now on the selected failed or pending deliveries", permissions=["act"])
    def act_again(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
        selected = queryset.count()
        open_ = queryset.filter(action_state__in=OPEN_ACTIONS)  # not every selected id, when all are
        ids = delivery_act_again(list(open_.values_list("pk", flat=True)), by=f"admin user {request.user.pk}")
        for delivery in WebhookDelivery.objects.filter(pk__in=ids):
            self.log_change(request, delivery, f"Acted on again now; {delivery.message.split('; ', 1)[-1]}.")
        self.message_user(request, f"{len(ids)} delivery(ies) will be acted on now.", messages.SUCCESS)
        if skipped := selected - len(ids):
            self.message_user(
                request,
                f"{skipped} neither failed nor pending, or a try is acting on it now: left as they were.",
                messages.WARNING,
            )

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        context = {**(extra_context or {}), "webhook_sources": source_summaries()}
        response: TemplateResponse = super().changelist_view(request, extra_context=context)  # type: ignore[assignment]
        return response
