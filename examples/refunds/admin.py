"""Admin for orders and refund requests: read-only, with the customer's status in words and the
refund operations a run left in flight (what to reconcile after a terminate or a crash)."""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html_join

from examples.refunds.models import Order, RefundRequest
from examples.refunds.selectors import refund_status, run_pending_operations


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["number", "customer", "amount", "currency", "status", "version", "updated_at"]
    search_fields = ["number"]
    readonly_fields = ["version", "updated_at"]


@admin.register(RefundRequest)
class RefundRequestAdmin(admin.ModelAdmin):
    list_display = ["id", "order", "customer", "amount", "status_in_words", "run", "created_at"]
    readonly_fields = ["order", "customer", "amount", "reason", "idempotency_key", "run", "created_at",
                       "status_in_words", "pending_operations"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # requests come from customers through the service, which starts the run

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="customer sees")
    def status_in_words(self, obj: RefundRequest) -> str:
        return refund_status(obj)

    @admin.display(description="operations needing reconciliation")
    def pending_operations(self, obj: RefundRequest) -> str:
        if obj.run is None:
            return "-"
        ops = run_pending_operations(obj.run)
        if not ops:
            return "none"
        return format_html_join(", ", '<a href="/admin/ledger/externaloperation/{}/change/">{} ({})</a>',
                                ((op.pk, op.key, op.status) for op in ops))
