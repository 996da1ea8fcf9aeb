"""HTTP API of approvals: list, inspect, decide.

One class per operation, with the runs API's conventions (workflows.apis): token or session
authentication, strict JSON input, errors as ``{"error": {code, message, detail}}``.
Visibility: a caller sees the requests of their approvers groups (all with
``approvals.decide_any``, or as staff with ``view_approvalrequest``); any other request is a 404.
A decision refused because of who asks (not an approver, or the requester: four eyes) is a 403;
refused because of the request's state or version, a 409 whose detail names the state.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractUser, AnonymousUser
from drf_spectacular.utils import (
    OpenApiExample,
    extend_schema,
    extend_schema_field,
    extend_schema_serializer,
)
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from approvals.exceptions import FORBIDDEN, ApprovalRefused
from approvals.models import NOTE_MAX, VERSION_MAX, ApprovalRequest, ApprovalStatus, DecisionChannel
from approvals.selectors import approval_get, approval_list, may_decide_now, superseded_by
from approvals.services import approval_decide
from workflows.apis.common import CURSOR, QUERY_ON_GET, ApiBase, RunCursorPagination, StrictCharField, StrictSerializer
from workflows.apis.converters import id_parameter
from workflows.apis.errors import error_response, error_responses

REQUEST_ID = id_parameter("request_id", "The approval request's id.")
TAGS = ["approvals"]


# --- Shapes ---------------------------------------------------------------------------------------
@extend_schema_field(
    {
        "type": "string",
        "enum": list(ApprovalStatus.values),
        "description": "pending, then approved, rejected, expired, superseded or cancelled.",
    },
    component_name="ApprovalStatus",
)
class ApprovalStatusField(serializers.ChoiceField):
    """Named ApprovalStatus in the schema (the runs' status enum would compete for StatusEnum)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=ApprovalStatus.choices, **kwargs)


class StrictBooleanField(serializers.BooleanField):
    """true or false, and only those: DRF's BooleanField also takes "yes", 1, "on"..."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


@extend_schema_serializer(component_name="ApprovalSubject")
class SubjectSerializer(serializers.Serializer[dict[str, Any]]):
    type = serializers.CharField(help_text="app_label.model, or the type the workflow named")
    id = serializers.CharField()


@extend_schema_serializer(component_name="ApprovalSummary")
class ApprovalSummarySerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    status = ApprovalStatusField()
    subject = SubjectSerializer()
    version = serializers.CharField(help_text="The exact version under review; send it back to decide.")
    summary = serializers.CharField(help_text="The proposed consequence.")
    approvers = serializers.CharField(help_text="The group whose members decide.")
    requested_by = serializers.CharField(allow_null=True, help_text="May not decide it (four eyes).")
    run = serializers.UUIDField(help_text="The workflow run waiting for the decision.")
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    decided_by = serializers.CharField(allow_null=True)
    decided_at = serializers.DateTimeField(allow_null=True)
    note = serializers.CharField(allow_blank=True)
    can_decide = serializers.BooleanField(help_text="Whether the caller may decide it now.")


@extend_schema_serializer(component_name="ApprovalDetail")
class ApprovalDetailSerializer(ApprovalSummarySerializer):
    content = serializers.JSONField(allow_null=True, help_text="A snapshot of the version under review.")
    replaces = serializers.IntegerField(allow_null=True, help_text="The request this one superseded.")
    superseded_by = serializers.IntegerField(allow_null=True, help_text="The request that superseded this one.")


def approval_data(
    *, request: ApprovalRequest, user: AbstractUser | AnonymousUser, detail: bool = False
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": request.pk,
        "status": request.status,
        "subject": {"type": request.subject_type, "id": request.subject_id},
        "version": request.version,
        "summary": request.summary,
        "approvers": request.approvers,
        "requested_by": request.requested_by.get_username() if request.requested_by else None,
        "run": request.run_id,
        "created_at": request.created_at,
        "expires_at": request.expires_at,
        "decided_by": request.decided_by.get_username() if request.decided_by else None,
        "decided_at": request.decided_at,
        "note": request.note,
        "can_decide": may_decide_now(user, request),
    }
    if detail:
        replacement = superseded_by(request)
        data.update(
            content=request.content, replaces=request.replaces_id, superseded_by=replacement.pk if replacement else None
        )
    return data


def visible_approval(*, user: AbstractUser | AnonymousUser, request_id: int) -> ApprovalRequest:
    """The request if the user may see it, else NotFound (also when it exists but is not theirs)."""
    request = approval_get(user=user, request_id=request_id)
    if request is None:
        raise exceptions.NotFound()
    return request


class ApprovalCursorPagination(RunCursorPagination):
    ordering = "created_at"  # a queue: oldest first


# --- Operations -----------------------------------------------------------------------------------
class ApprovalListApi(ApiBase):
    """GET /api/approvals: the requests the caller may see (decide), oldest first, cursor-paginated."""

    query_methods = QUERY_ON_GET

    @extend_schema_serializer(component_name="ApprovalListFilter")
    class FilterSerializer(StrictSerializer):
        status = ApprovalStatusField(required=False)
        cursor = StrictCharField(
            required=False, pattern=CURSOR, help_text="From the previous page's next/previous link."
        )
        page_size = serializers.IntegerField(
            required=False, min_value=1, max_value=ApprovalCursorPagination.max_page_size
        )

    @extend_schema_serializer(component_name="ApprovalPage")
    class OutputSerializer(serializers.Serializer[dict[str, Any]]):
        next = serializers.URLField(allow_null=True)
        previous = serializers.URLField(allow_null=True)
        results = ApprovalSummarySerializer(many=True)

    @extend_schema(
        operation_id="approval_list",
        tags=TAGS,
        parameters=[FilterSerializer],
        responses={200: OutputSerializer, **error_responses(400, 401)},
    )
    def get(self, request: Request) -> Response:
        filters = self.FilterSerializer(data=request.query_params.dict())
        filters.is_valid(raise_exception=True)
        requests = approval_list(user=request.user, status=filters.validated_data.get("status"))
        paginator = ApprovalCursorPagination()
        page = paginator.paginate_queryset(requests.select_related("requested_by", "decided_by"), request, view=self)
        data = [approval_data(request=r, user=request.user) for r in page or []]
        return paginator.get_paginated_response(ApprovalSummarySerializer(data, many=True).data)


class ApprovalDetailApi(ApiBase):
    """GET /api/approvals/<id>: the request with the content of the version under review."""

    OutputSerializer = ApprovalDetailSerializer

    @extend_schema(
        operation_id="approval_retrieve",
        tags=TAGS,
        parameters=[REQUEST_ID],
        responses={200: OutputSerializer, **error_responses(401, 404)},
    )
    def get(self, request: Request, request_id: int) -> Response:
        approval = visible_approval(user=request.user, request_id=request_id)
        return Response(self.OutputSerializer(approval_data(request=approval, user=request.user, detail=True)).data)


class ApprovalDecisionApi(ApiBase):
    """POST /api/approvals/<id>/decision: approve or reject the version the caller reviewed."""

    @extend_schema_serializer(component_name="ApprovalDecisionInput")
    class InputSerializer(StrictSerializer):
        approve = StrictBooleanField(help_text="true approves, false rejects.")
        version = StrictCharField(max_length=VERSION_MAX, help_text="The version the caller reviewed.")
        note = StrictCharField(required=False, default="", allow_blank=True, max_length=NOTE_MAX)

    OutputSerializer = ApprovalDetailSerializer

    @extend_schema(
        operation_id="approval_decide",
        tags=TAGS,
        parameters=[REQUEST_ID],
        request=InputSerializer,
        description="200 with the request: decided now, or the same decision made before (nothing sent twice). "
        "403 not_authorised / four_eyes; 409 stale_version, not_pending, expired or run_finished, with "
        "detail {status, version, superseded_by}. A refusal changes nothing.",
        responses={200: OutputSerializer, **error_responses(400, 401, 403, 404, 409, 413, 415)},
        examples=[OpenApiExample("approve", value={"approve": True, "version": "3", "note": "ok"}, request_only=True)],
    )
    def post(self, request: Request, request_id: int) -> Response:
        # Access first: whatever the body, a caller who may not see the request learns only "not found".
        approval = visible_approval(user=request.user, request_id=request_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            decided = approval_decide(
                request_id=approval.pk,
                by=request.user,
                approve=data["approve"],
                version=data["version"],
                note=data["note"],
                channel=DecisionChannel.API,
            )
        except ApprovalRefused as refusal:
            http_status = status.HTTP_403_FORBIDDEN if refusal.code in FORBIDDEN else status.HTTP_409_CONFLICT
            return error_response(str(refusal.code), str(refusal), http_status, refusal.detail)
        return Response(
            self.OutputSerializer(approval_data(request=decided.request, user=request.user, detail=True)).data
        )
