"""Admin for orders and refund requests: read-only, with the customer's status in words and the
refund operations a run left in flight (what to reconcile after a terminate or a crash)."""
from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.html import format_html_join

from examples.refunds.models import Order, RefundRequest
from examples.refunds.selectors import refund_status, run_pending_operations
from examples.refunds.services import CHANGEABLE, StaleOrder, order_change


class OrderForm(forms.ModelForm):
    """Carries the version the page showed: a save against an order that changed since is refused
    (another edit, or the refund workflow marking it refunded) instead of writing the page's stale
    values over the new ones."""

    seen_version = forms.IntegerField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = Order
        fields = "__all__"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["seen_version"].initial = self.instance.version

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        # The instance is the row as this request loaded it (version is not a form field, so the
        # posted values never touch it); order_change checks again under the row lock.
        current = self.instance.version
        if self.instance.pk is not None and data.get("seen_version") != current:
            raise forms.ValidationError(
                f"This order changed since the page was opened (it is now version {current}); "
                "reload it and make your change again.", code="stale")
        return data


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    """An edit here is a change like any other: through ``order_change``, which bumps the version
    and supersedes a refund approval pending on the order in the same commit. Saving the form
    directly would change the data under the version a reviewer is approving."""

    form = OrderForm
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
        seen = form.cleaned_data["seen_version"]  # the form checked it is still the current one
        # Compared with the row as loaded (form.initial), not form.changed_data (which counts every
        # JSON field as changed).
        changes = {name: form.cleaned_data[name] for name in CHANGEABLE
                   if name in form.cleaned_data and form.cleaned_data[name] != form.initial.get(name)}
        if not changes:
            return
        try:
            obj.version = order_change(order_id=obj.pk, expected_version=seen, **changes).version
        except StaleOrder as exc:  # changed between the form's check and this save: nothing written
            self.message_user(request, f"Not saved: {exc}", messages.ERROR)


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
