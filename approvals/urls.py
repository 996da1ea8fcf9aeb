"""/api/approvals...: paths without a trailing slash (docs/decisions/0010-api-paths-and-error-format.md)."""

from django.urls import URLPattern, path

from approvals.apis import ApprovalDecisionApi, ApprovalDetailApi, ApprovalListApi
from workflows.apis import converters  # noqa: F401  registers <id:...>

# Any other request_id (², a thousand digits) matches no route: the API's catch-all JSON 404.
urlpatterns: list[URLPattern] = [
    path("approvals", ApprovalListApi.as_view(), name="api-approval-list"),
    path("approvals/<id:request_id>", ApprovalDetailApi.as_view(), name="api-approval-detail"),
    path("approvals/<id:request_id>/decision", ApprovalDecisionApi.as_view(), name="api-approval-decision"),
]
