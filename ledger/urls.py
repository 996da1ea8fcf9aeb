"""/api/...: ledger operations. No trailing slash (docs/decisions/0010-api-paths-and-error-format.md)."""

from django.urls import URLPattern, path

from ledger.apis import OperationListApi

urlpatterns: list[URLPattern] = [
    path("operations", OperationListApi.as_view(), name="api-operation-list"),
]
