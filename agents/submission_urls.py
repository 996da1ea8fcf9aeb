from django.urls import path

from agents.submission_apis import SubmissionCancelApi, SubmissionDetailApi

urlpatterns = [
    path("<str:submission_id>", SubmissionDetailApi.as_view(), name="api-submission"),
    path("<str:submission_id>/cancel", SubmissionCancelApi.as_view(), name="api-submission-cancel"),
]
