"""Admin for orders and refund requests: read-only, with the customer's status in words and the
refund operations a run left in flight (what to reconcile after a terminate or a crash)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html_join

from examples.refunds.models import Order, RefundRequest
from examples.refunds.selectors import refund_status, run_pending_operations
from examples.refunds.services import CHANGEABLE, StaleOrder, order_change
from workflows.admin import JSON_FORM_FIELDS


class OrderForm(forms.ModelForm[Order]):
    """Carries the version the page showed: a save against an order that changed since is refused
    (another edit, or the refund workflow marking it refunded) instead of writing the page's stale
    values over the new ones."""

    seen_version = forms.IntegerField(widget=forms.HiddenInput, required=False)
    # Set by OrderAdmin when order_change refused this very submission: shown as the form's error.
    refusal: str | None = None

    class Meta:
        model = Order
        fields = "__all__"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["seen_version"].initial = self.instance.version

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.refusal is not None:
            raise forms.ValidationError(self.refusal, code="stale")
        # The instance is the row as this request loaded it (version is not a form field, so the
        # posted values never touch it); order_change checks again under the row lock.
        current = self.instance.version
        if self.instance.pk is not None and data.get("seen_version") != current:
            raise forms.ValidationError(
                f"This order changed since the page was opened (it is now version {current}); "
                "reload it and make your change again.",
                code="stale",
            )
        return data


class _Refused(Exception):
    """order_change refused the admin's save: raised out of save_model, so that the admin neither
    reports success nor logs a change (see OrderAdmin.changeform_view)."""


_REFUSAL = "_order_admin_refusal"  # the request attribute that carries it to the second rendering


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin[Order]):
    """An edit here is a change like any other: through ``order_change``, which bumps the version
    and supersedes a refund approval pending on the order in the same commit. Saving the form
    directly would change the data under the version a reviewer is approving."""

    form = OrderForm
    formfield_overrides = JSON_FORM_FIELDS
    list_display = ["number", "customer", "amount", "currency", "status", "version", "updated_at"]
    search_fields = ["number"]
    readonly_fields = ["version", "updated_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Order | None = None) -> list[str]:
        if obj is None:
            return self.readonly_fields
        return [*self.readonly_fields, "number", "customer"]  # who and which order: fixed once placed

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except _Refused as refusal:
            # The order changed between the form's check and order_change (which wrote nothing).
            # The admin's transaction has rolled back before its change message and LogEntry, so
            # nothing says "changed"; the same submission is shown again with the refusal as the
            # form's error, the way the form's own check shows a stale page.
            setattr(request, _REFUSAL, str(refusal))
            return super().changeform_view(request, object_id, form_url, extra_context)

    def get_form(
        self, request: HttpRequest, obj: Order | None = None, change: bool = False, **kwargs: Any
    ) -> type[forms.ModelForm[Order]]:
        form: type[OrderForm] = super().get_form(request, obj, change, **kwargs)  # type: ignore[assignment]
        refusal = getattr(request, _REFUSAL, None)
        return form if refusal is None else type(form.__name__, (form,), {"refusal": refusal})

    def save_model(self, request: HttpRequest, obj: Order, form: Any, change: bool) -> None:
        if not change:
            super().save_model(request, obj, form, change)  # a new order: version 1
            return
        seen = form.cleaned_data["seen_version"]  # the form checked it is still the current one
        # Compared with the row as loaded (form.initial), not form.changed_data (which counts every
        # JSON field as changed).
        changes = {
            name: form.cleaned_data[name]
            for name in CHANGEABLE
            if name in form.cleaned_data and form.cleaned_data[name] != form.initial.get(name)
        }
        if not changes:
            return
        try:
            obj.version = order_change(order_id=obj.pk, expected_version=seen, **changes).version
        except StaleOrder as exc:  # changed since the form's check: see changeform_view
            raise _Refused(f"Not saved: {exc}.") from exc


@admin.register(RefundRequest)
class RefundRequestAdmin(admin.ModelAdmin[RefundRequest]):
    list_display = ["id", "order", "customer", "amount", "status_in_words", "run", "created_at"]
    # Never shown here (it is part of the ledger's operation key, for those who may see operations):
    # never filtered on in the URL either (config.admin), or it would be read a character at a time.
    unfilterable_fields = ("key_salt",)
    readonly_fields = [
        "order",
        "customer",
        "amount",
        "reason",
        "idempotency_key",
        "run",
        "agent",  # the chat it was asked in, which its run tells of each change
        "created_at",
        "status_in_words",
        "pending_operations",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # requests come from customers through the service, which starts the run

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a request holds its order's money (or records that it was paid): never removed

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
        return format_html_join(
            ", ",
            '<a href="/admin/ledger/externaloperation/{}/change/">{} ({})</a>',
            ((op.pk, op.key, op.status) for op in ops),
        )
