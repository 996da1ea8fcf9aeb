"""Admin: every delivery, read-only (rows are written once by the endpoint and removed only by
``manage.py webhooks purge``), with the configured sources above the list, never their secrets."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from webhooks.models import WebhookDelivery
from webhooks.selectors import source_summaries
from workflows.admin import ReadOnlyAdmin, pretty_json, run_admin_link


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin[WebhookDelivery]):
    change_list_template = "admin/webhooks/webhookdelivery/change_list.html"
    list_display = ("received_at", "source", "event_id", "outcome", "reason", "size", "run_link", "operation_key")
    list_filter = ("source", "outcome", "reason")
    search_fields = ("=event_id",)
    search_help_text = "An event id (exact)."
    date_hierarchy = "received_at"
    list_per_page = 50
    show_full_result_count = False
    fields = readonly_fields = (
        "source",
        "event_id",
        "outcome",
        "reason",
        "message",
        "received_at",
        "size",
        "run_link",
        "operation_key",
        "submission_link",
        "result_pretty",
        "headers_pretty",
        "body_pretty",
    )

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

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        context = {**(extra_context or {}), "webhook_sources": source_summaries()}
        response: TemplateResponse = super().changelist_view(request, extra_context=context)  # type: ignore[assignment]
        return response
