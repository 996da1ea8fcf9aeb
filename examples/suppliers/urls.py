"""/api/assessments...: the supplier example. No trailing slash (docs/decisions/0010-api-paths-and-error-format.md)."""

from django.urls import URLPattern, path

from examples.suppliers.apis import (
    AssessmentDetailApi,
    AssessmentListCreateApi,
    AssessmentReviewApi,
    AssessmentSourceApi,
    AssessmentSubmitApi,
)
from workflows.apis import converters  # noqa: F401  registers <id:...>

urlpatterns: list[URLPattern] = [
    path("assessments", AssessmentListCreateApi.as_view(), name="api-assessment-list"),
    path("assessments/<id:assessment_id>", AssessmentDetailApi.as_view(), name="api-assessment-detail"),
    path("assessments/<id:assessment_id>/sources", AssessmentSourceApi.as_view(), name="api-assessment-sources"),
    path("assessments/<id:assessment_id>/submit", AssessmentSubmitApi.as_view(), name="api-assessment-submit"),
    path("assessments/<id:assessment_id>/review", AssessmentReviewApi.as_view(), name="api-assessment-review"),
]
