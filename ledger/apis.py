"""HTTP API of the ledger: GET /api/operations (staff with ``ledger.view_externaloperation``).

Same conventions as the runs API: token first, strict filters, cursor pagination, JSON errors.
Operations belong to no customer, so there is no "own" subset: anyone else gets 403 (401 without
credentials). Requests and responses are shown redacted.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_serializer
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from ledger.models import ExternalOperation, OperationStatus
from ledger.redaction import redact
from ledger.selectors import attention_label, can_see_operations, operation_list
from workflows.apis.common import CURSOR, QUERY_ON_GET, ApiBase, RunCursorPagination, StrictCharField, StrictSerializer
from workflows.apis.errors import error_responses

TAGS = ["operations"]


class OperationCursorPagination(RunCursorPagination):
    """Newest first by created_at, as runs are (the same cursor checks)."""


@extend_schema_field(
    {
        "type": "string",
        "enum": list(OperationStatus.values),
        "description": "pending, submitted, succeeded, failed or unknown.",
    },
    component_name="OperationStatus",
)
class OperationStatusField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=OperationStatus.choices, **kwargs)


class RedactedJSONField(serializers.JSONField):
    """Personal data (LEDGER REDACT_KEYS) never leaves through the API."""

    def to_representation(self, value: Any) -> Any:
        return super().to_representation(redact(value))


@extend_schema_serializer(component_name="Operation")
class OperationSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    key = serializers.CharField()
    system = serializers.CharField()
    action = serializers.CharField()
    status = OperationStatusField()
    attention = serializers.SerializerMethodField(
        help_text="Why it needs a person: unknown, stale submit, failed; null if it needs nobody."
    )
    request = RedactedJSONField()
    response = RedactedJSONField(allow_null=True)
    error = RedactedJSONField(allow_null=True)
    note = serializers.CharField(allow_blank=True)
    submit_count = serializers.IntegerField()
    lookup_count = serializers.IntegerField()
    submitted_at = serializers.DateTimeField(allow_null=True)
    looked_up_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    resolved_by = serializers.CharField(source="resolved_by.username", allow_null=True, default=None)
    resolved_at = serializers.DateTimeField(allow_null=True)
    resolution_note = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def get_attention(self, op: ExternalOperation) -> str | None:
        return attention_label(getattr(op, "attention_rank", None))


class OperationListApi(ApiBase):
    """GET /api/operations: external operations, newest first, cursor-paginated."""

    query_methods = QUERY_ON_GET

    @extend_schema_serializer(component_name="OperationListFilter")
    class FilterSerializer(StrictSerializer):
        status = OperationStatusField(required=False)
        system = StrictCharField(required=False, max_length=100)
        cursor = StrictCharField(
            required=False, pattern=CURSOR, help_text="From the previous page's next/previous link."
        )
        page_size = serializers.IntegerField(
            required=False, min_value=1, max_value=OperationCursorPagination.max_page_size
        )

    @extend_schema_serializer(component_name="OperationPage")
    class OutputSerializer(serializers.Serializer[dict[str, Any]]):
        next = serializers.URLField(allow_null=True)
        previous = serializers.URLField(allow_null=True)
        results = OperationSerializer(many=True)

    @extend_schema(
        operation_id="operation_list",
        tags=TAGS,
        parameters=[FilterSerializer],
        responses={200: OutputSerializer, **error_responses(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        # Permission before the filters: a caller who may not list learns nothing from a 400.
        if not can_see_operations(request.user):
            raise exceptions.PermissionDenied("Only staff with the view permission may list operations.")
        filters = self.FilterSerializer(data=request.query_params.dict())
        filters.is_valid(raise_exception=True)
        operations = operation_list(
            status=filters.validated_data.get("status"), system=filters.validated_data.get("system")
        )
        paginator = OperationCursorPagination()
        page = paginator.paginate_queryset(operations, request, view=self)
        return paginator.get_paginated_response(OperationSerializer(page, many=True).data)
