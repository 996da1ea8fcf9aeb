"""/api/...: the refund example. No trailing slash (docs/decisions/0010-api-paths-and-error-format.md)."""

from django.urls import URLPattern, path

from examples.refunds.apis import RefundCreateApi, RefundDetailApi
from workflows.apis import converters  # noqa: F401  registers <id:...> and <name:...>

urlpatterns: list[URLPattern] = [
    path("orders/<name:number>/refunds", RefundCreateApi.as_view(), name="api-refund-create"),
    path("refunds/<id:refund_id>", RefundDetailApi.as_view(), name="api-refund-detail"),
]
