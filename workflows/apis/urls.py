"""/api/...: workflow runs. Paths have no trailing slash (docs/decisions/0010-api-paths-and-error-format.md)."""

from django.urls import URLPattern, path

from workflows.apis.runs import (
    RunDetailApi,
    RunListApi,
    RunPauseApi,
    RunRestartApi,
    RunResumeApi,
    RunSendEventApi,
    RunStartApi,
    RunTerminateApi,
)

# run_id is matched as text and parsed by the view: a malformed id is then the API's JSON 404,
# not Django's HTML one.
urlpatterns: list[URLPattern] = [
    path("workflows/<str:name>/runs", RunStartApi.as_view(), name="api-run-start"),
    path("runs", RunListApi.as_view(), name="api-run-list"),
    path("runs/<str:run_id>", RunDetailApi.as_view(), name="api-run-detail"),
    path("runs/<str:run_id>/events", RunSendEventApi.as_view(), name="api-run-send-event"),
    path("runs/<str:run_id>/pause", RunPauseApi.as_view(), name="api-run-pause"),
    path("runs/<str:run_id>/resume", RunResumeApi.as_view(), name="api-run-resume"),
    path("runs/<str:run_id>/terminate", RunTerminateApi.as_view(), name="api-run-terminate"),
    path("runs/<str:run_id>/restart", RunRestartApi.as_view(), name="api-run-restart"),
]
