"""/api/...: the refund example. No trailing slash, as in DESIGN.md section 7."""
from django.urls import URLPattern, path

from examples.refunds.apis import RefundCreateApi, RefundDetailApi

urlpatterns: list[URLPattern] = [
    path("orders/<str:number>/refunds", RefundCreateApi.as_view(), name="api-refund-create"),
    path("refunds/<int:refund_id>", RefundDetailApi.as_view(), name="api-refund-detail"),
]
