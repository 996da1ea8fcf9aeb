"""/api/...: ledger operations. No trailing slash, as in DESIGN.md section 7."""

from django.urls import URLPattern, path

from ledger.apis import OperationListApi

urlpatterns: list[URLPattern] = [
    path("operations", OperationListApi.as_view(), name="api-operation-list"),
]
