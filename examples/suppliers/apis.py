"""/api/assessments: the supplier-assessment example over HTTP.

    POST /api/assessments                  {supplier_name, sources: {source: content}}  201
    GET  /api/assessments[?status=]        the caller's (a reviewer's: all), newest first
    GET  /api/assessments/<id>             status, latest source revisions, current report, pending review
    POST /api/assessments/<id>/sources     {source, content}: revision n+1 of a source           201
    POST /api/assessments/<id>/submit      {input, review_timeout_seconds?}: starts the workflow
    POST /api/assessments/<id>/review      {approve, report_version, note?}: the report the page showed

The requester sees their own assessments, reviewers (``supplier-reviewers``) all of them; any other
is a 404. Refusals: 403 for who (not the requester, not a reviewer, four eyes), 409 for when (the
assessment's state, a stale report version: "review the current version"), with nothing changed.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from approvals.apis import StrictBooleanField
from approvals.exceptions import FORBIDDEN, ApprovalRefused
from approvals.models import NOTE_MAX, DecisionChannel
from examples.suppliers import services
from examples.suppliers.models import SOURCE_NAME_MAX, AssessmentStatus, SupplierAssessment
from examples.suppliers.selectors import assessment_data, assessment_get, assessment_list, assessment_status
from workflows.apis.common import (
    CURSOR,
    QUERY_ON_GET,
    ApiBase,
    JsonObjectField,
    JsonValueField,
    RunCursorPagination,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    StrictSerializer,
    authenticated_user,
)
from workflows.apis.converters import id_parameter
from workflows.apis.errors import error_response, error_responses
from workflows.apis.schema import NOT_BLANK
from workflows.services import check_json_size

TAGS = ["supplier assessments"]
# The largest version AssessmentReport.version (a PositiveIntegerField) holds: a larger one made a
# version label longer than any column takes, a 500 when the refused decision was logged.
REPORT_VERSION_MAX = 2**31 - 1
ASSESSMENT_ID = id_parameter("assessment_id", "The assessment's id.")


# --- Shapes ---------------------------------------------------------------------------------------
@extend_schema_serializer(component_name="AssessmentSummary")
class AssessmentSummarySerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    supplier_name = serializers.CharField()
    status = serializers.ChoiceField(choices=AssessmentStatus.choices)
    requested_by = serializers.CharField()
    run = serializers.UUIDField(allow_null=True, help_text="The workflow run, once the input is submitted.")
    decided_by = serializers.CharField(allow_null=True)
    decided_version = serializers.IntegerField(allow_null=True, help_text="The report version decided on.")
    failure_reason = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


@extend_schema_serializer(component_name="AssessmentSource")
class SourceSerializer(serializers.Serializer[dict[str, Any]]):
    source = serializers.CharField()  # type: ignore[assignment]  # a field, not Field.source
    revision = serializers.IntegerField()
    content = serializers.JSONField()
    created_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()


@extend_schema_serializer(component_name="AssessmentReport")
class ReportSerializer(serializers.Serializer[dict[str, Any]]):
    version = serializers.IntegerField()
    source_revisions = serializers.DictField(
        child=serializers.IntegerField(), help_text="{source: revision} the report was built from."
    )
    body = serializers.JSONField()
    created_at = serializers.DateTimeField()


@extend_schema_serializer(component_name="AssessmentReview")
class ReviewSerializer(serializers.Serializer[dict[str, Any]]):
    request = serializers.IntegerField(help_text="The approval request (also at /api/approvals/<id>).")
    report_version = serializers.IntegerField(help_text="The report version under review; send it back to decide.")
    expires_at = serializers.DateTimeField()
    can_decide = serializers.BooleanField(help_text="Whether the caller may decide it now.")


@extend_schema_serializer(component_name="AssessmentDetail")
class AssessmentDetailSerializer(AssessmentSummarySerializer):
    input = serializers.JSONField()
    sources = SourceSerializer(many=True, help_text="The latest revision of each source.")
    report = ReportSerializer(
        allow_null=True,
        help_text="While a review is pending, the report version it is of (the one to send back); else the latest.",
    )
    review = ReviewSerializer(allow_null=True, help_text="The review pending now, if any.")


def visible_assessment(request: Request, assessment_id: int) -> SupplierAssessment:
    assessment = assessment_get(user=request.user, assessment_id=assessment_id)
    if assessment is None:
        raise exceptions.NotFound()
    return assessment


def detail_response(request: Request, assessment_id: int, *, http_status: int = status.HTTP_200_OK) -> Response:
    assessment = visible_assessment(request, assessment_id)
    data = assessment_data(assessment=assessment, user=request.user, detail=True)
    return Response(AssessmentDetailSerializer(data).data, status=http_status)


def state_error(exc: services.AssessmentStateError, assessment_id: int) -> Response:
    return error_response(
        "invalid_state", str(exc), status.HTTP_409_CONFLICT, {"status": assessment_status(assessment_id)}
    )


# --- Operations -----------------------------------------------------------------------------------
class AssessmentListCreateApi(ApiBase):
    query_methods = QUERY_ON_GET

    @extend_schema_serializer(component_name="AssessmentCreateInput")
    class InputSerializer(StrictSerializer):
        supplier_name = StrictCharField(max_length=200, pattern=NOT_BLANK, help_text="Not only whitespace.")
        sources = JsonObjectField(
            allow_empty=False,
            key_pattern=NOT_BLANK,
            key_max_length=SOURCE_NAME_MAX,
            child=JsonValueField(),  # each is a source record's content: not null
            help_text="{source name: content}: revision 1 of each. A name is 1 to 100 "
            "characters, not only whitespace; a content any JSON but null.",
        )

    @extend_schema_serializer(component_name="AssessmentListFilter")
    class FilterSerializer(StrictSerializer):
        status = serializers.ChoiceField(choices=AssessmentStatus.choices, required=False)
        cursor = StrictCharField(
            required=False, pattern=CURSOR, help_text="From the previous page's next/previous link."
        )
        page_size = serializers.IntegerField(required=False, min_value=1, max_value=RunCursorPagination.max_page_size)

    @extend_schema_serializer(component_name="AssessmentPage")
    class PageSerializer(serializers.Serializer[dict[str, Any]]):
        next = serializers.URLField(allow_null=True)
        previous = serializers.URLField(allow_null=True)
        results = AssessmentSummarySerializer(many=True)

    @extend_schema(
        operation_id="assessment_list",
        tags=TAGS,
        parameters=[FilterSerializer],
        description="The caller's assessments (a reviewer's: all), newest first, cursor-paginated.",
        responses={200: PageSerializer, **error_responses(400, 401)},
    )
    def get(self, request: Request) -> Response:
        filters = self.FilterSerializer(data=request.query_params.dict())
        filters.is_valid(raise_exception=True)
        assessments = assessment_list(user=request.user, status=filters.validated_data.get("status"))
        paginator = RunCursorPagination()
        page = paginator.paginate_queryset(assessments, request, view=self)
        data = [assessment_data(assessment=a, user=request.user) for a in page or []]
        return paginator.get_paginated_response(AssessmentSummarySerializer(data, many=True).data)

    @extend_schema(
        operation_id="assessment_create",
        tags=TAGS,
        request=InputSerializer,
        description="A new assessment awaiting input, with revision 1 of each source. 429 past "
        "SUPPLIER_MAX_OPEN_ASSESSMENTS open assessments of yours, or SUPPLIER_MAX_SOURCE_RECORDS sources.",
        responses={201: AssessmentDetailSerializer, **error_responses(400, 401, 403, 413, 415, 429)},
    )
    def post(self, request: Request) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        check_json_size(data["sources"], what="sources")  # first: a NUL in a name is invalid_payload, as anywhere
        try:
            assessment = services.assessment_create(
                supplier_name=data["supplier_name"], requested_by=authenticated_user(request), sources=data["sources"]
            )
        except services.InvalidSourceName as exc:
            raise exceptions.ValidationError({"sources": [str(exc)]}) from None
        except services.TooMany as exc:
            return error_response("too_many_requests", str(exc), status.HTTP_429_TOO_MANY_REQUESTS)
        except ValueError as exc:
            raise exceptions.ValidationError({"supplier_name": [str(exc)]}) from None
        response = detail_response(request, assessment.pk, http_status=status.HTTP_201_CREATED)
        response["Location"] = f"/api/assessments/{assessment.pk}"
        return response


class AssessmentDetailApi(ApiBase):
    @extend_schema(
        operation_id="assessment_retrieve",
        tags=TAGS,
        parameters=[ASSESSMENT_ID],
        description="Status, the latest revision of each source, the current report and the review "
        "pending now (with the report_version to send back).",
        responses={200: AssessmentDetailSerializer, **error_responses(401, 404)},
    )
    def get(self, request: Request, assessment_id: int) -> Response:
        return detail_response(request, assessment_id)


class AssessmentSourceApi(ApiBase):
    @extend_schema_serializer(component_name="AssessmentSourceInput")
    class InputSerializer(StrictSerializer):
        source = StrictCharField(  # type: ignore[assignment]  # a field, not Field.source
            max_length=SOURCE_NAME_MAX,
            pattern=NOT_BLANK,
            help_text="e.g. companies-house, sanctions, credit; not only whitespace",
        )
        content = JsonValueField(help_text="The evidence, as JSON.")

    @extend_schema(
        operation_id="assessment_source_add",
        tags=TAGS,
        parameters=[ASSESSMENT_ID],
        request=InputSerializer,
        description="A new source, or the next revision of one. During a review this supersedes "
        "the pending request: the workflow builds the next report version and asks again. 429 past "
        "SUPPLIER_MAX_SOURCE_RECORDS records (sources and their revisions) in the assessment.",
        responses={201: SourceSerializer, **error_responses(400, 401, 403, 404, 409, 413, 415, 429)},
    )
    def post(self, request: Request, assessment_id: int) -> Response:
        visible_assessment(request, assessment_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        check_json_size(data["content"], what="source content")
        try:
            record = services.source_record_add(
                assessment_id=assessment_id, source=data["source"], content=data["content"], by=request.user
            )
        except services.AssessmentStateError as exc:
            return state_error(exc, assessment_id)
        except services.TooMany as exc:
            return error_response("too_many_requests", str(exc), status.HTTP_429_TOO_MANY_REQUESTS)
        body = {
            "source": record.source,
            "revision": record.revision,
            "content": record.content,
            "created_by": request.user.get_username(),
            "created_at": record.created_at,
        }
        return Response(SourceSerializer(body).data, status=status.HTTP_201_CREATED)


class AssessmentSubmitApi(ApiBase):
    @extend_schema_serializer(component_name="AssessmentSubmitInput")
    class InputSerializer(StrictSerializer):
        input = JsonObjectField(required=False, default=dict, help_text="Scope, questions: part of every report.")
        review_timeout_seconds = StrictFloatField(
            required=False,
            min_value=1,
            max_value=services.MAX_REVIEW_TIMEOUT_SECONDS,
            help_text="How long reviewers have (default 7 days, at most 90).",
        )

    @extend_schema(
        operation_id="assessment_submit",
        tags=TAGS,
        parameters=[ASSESSMENT_ID],
        request=InputSerializer,
        description="The requester submits the input, once: the workflow run starts.",
        responses={200: AssessmentDetailSerializer, **error_responses(400, 401, 403, 404, 409, 413, 415)},
    )
    def post(self, request: Request, assessment_id: int) -> Response:
        visible_assessment(request, assessment_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        check_json_size(data["input"], what="input")
        try:
            services.assessment_submit_input(
                assessment_id=assessment_id,
                by=request.user,
                data=data["input"],
                review_timeout_seconds=data.get("review_timeout_seconds"),
            )
        except services.AssessmentStateError as exc:
            return state_error(exc, assessment_id)
        return detail_response(request, assessment_id)


class AssessmentReviewApi(ApiBase):
    @extend_schema_serializer(component_name="AssessmentReviewInput")
    class InputSerializer(StrictSerializer):
        approve = StrictBooleanField(help_text="true approves, false rejects.")
        report_version = StrictIntegerField(
            min_value=1, max_value=REPORT_VERSION_MAX, help_text="The report version the page showed."
        )
        note = StrictCharField(required=False, default="", allow_blank=True, max_length=NOTE_MAX)

    @extend_schema(
        operation_id="assessment_review",
        tags=TAGS,
        parameters=[ASSESSMENT_ID],
        request=InputSerializer,
        description="A reviewer's decision on the report version their page showed. 403 not_authorised "
        "/ four_eyes; 409 stale_version (review the current version), invalid_state (no review "
        "pending), not_pending or expired. The assessment moves once the workflow applies it.",
        responses={200: AssessmentDetailSerializer, **error_responses(400, 401, 403, 404, 409, 413, 415)},
    )
    def post(self, request: Request, assessment_id: int) -> Response:
        visible_assessment(request, assessment_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            services.assessment_review(
                assessment_id=assessment_id,
                by=request.user,
                approve=data["approve"],
                report_version=data["report_version"],
                note=data["note"],
                channel=DecisionChannel.API,
            )
        except services.AssessmentStateError as exc:
            return state_error(exc, assessment_id)
        except ApprovalRefused as refusal:
            http_status = status.HTTP_403_FORBIDDEN if refusal.code in FORBIDDEN else status.HTTP_409_CONFLICT
            return error_response(str(refusal.code), str(refusal), http_status, refusal.detail)
        return detail_response(request, assessment_id)
