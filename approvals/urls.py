"""/api/approvals...: paths without a trailing slash, as in DESIGN.md section 7."""
from django.urls import URLPattern, path

from approvals.apis import ApprovalDecisionApi, ApprovalDetailApi, ApprovalListApi

# request_id is matched as text and parsed by the view: a malformed id is the API's JSON 404.
urlpatterns: list[URLPattern] = [
    path("approvals", ApprovalListApi.as_view(), name="api-approval-list"),
    path("approvals/<str:request_id>", ApprovalDetailApi.as_view(), name="api-approval-detail"),
    path("approvals/<str:request_id>/decision", ApprovalDecisionApi.as_view(), name="api-approval-decision"),
]
