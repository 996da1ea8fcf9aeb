"""Admin for orders and refund requests: read-only, with the customer's status in words and the
refund operations a run left in flight (what to reconcile after a terminate or a crash)."""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html_join

from examples.refunds.models import Order, RefundRequest
from examples.refunds.selectors import refund_status, run_pending_operations
from examples.refunds.services import CHANGEABLE, order_change


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    """An edit here is a change like any other: through ``order_change``, which bumps the version
    and supersedes a refund approval pending on the order in the same commit. Saving the form
    directly would change the data under the version a reviewer is approving."""

    list_display = ["number", "customer", "amount", "currency", "status", "version", "updated_at"]
    search_fields = ["number"]
    readonly_fields = ["version", "updated_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Order | None = None) -> list[str]:
        if obj is None:
            return self.readonly_fields
        return [*self.readonly_fields, "number", "customer"]  # who and which order: fixed once placed

    def save_model(self, request: HttpRequest, obj: Order, form: Any, change: bool) -> None:
        if not change:
            super().save_model(request, obj, form, change)  # a new order: version 1
            return
        # Compared with the stored row, not form.changed_data (which counts every JSON field as changed).
        stored = Order.objects.get(pk=obj.pk)
        changes = {name: form.cleaned_data[name] for name in CHANGEABLE
                   if name in form.cleaned_data and form.cleaned_data[name] != getattr(stored, name)}
        if changes:
            obj.version = order_change(order_id=obj.pk, **changes).version


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
