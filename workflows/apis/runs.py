"""HTTP API of workflow runs: start, list, inspect, send events, control.

One class per operation; each parses its input, calls one service or selector and renders.
Visibility: a caller sees its own runs (staff with ``view_workflowrun`` see all), but none of a
workflow whose ``view_permission`` it lacks (``selectors.run_list``); another owner's run is a 404.
Control and events need ownership or ``control_workflowrun`` (else 403).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any
from uuid import UUID

from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    extend_schema_serializer,
)
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from workflows import services
from workflows.apis.common import (
    CURSOR,
    IDEMPOTENCY_KEY,
    IDEMPOTENCY_KEY_MAX,
    QUERY_ON_GET,
    ApiBase,
    JsonObjectField,
    JsonValueField,
    NoFields,
    RunCursorPagination,
    StrictCharField,
    StrictIntegerField,
    StrictSerializer,
    authenticated_user,
    controllable_run,
    idempotency_key_header,
    visible_run,
)
from workflows.apis.errors import error_responses
from workflows.conf import conf
from workflows.models import RunEvent, RunStatus, WorkflowRun
from workflows.selectors import attempt_status, public_error, run_attempts, run_list, run_timeline, waiting_for

RUN_ID = OpenApiParameter("run_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The run's id.")
TAGS = ["runs"]


def idempotency_key_parameter(description: str) -> OpenApiParameter:
    """The schema's optional ``Idempotency-Key`` header, as ``idempotency_key_header`` checks it."""
    return OpenApiParameter(
        "Idempotency-Key",
        {"type": "string", "pattern": f"^(?:{IDEMPOTENCY_KEY})$", "minLength": 1, "maxLength": IDEMPOTENCY_KEY_MAX},
        OpenApiParameter.HEADER,
        required=False,
        description=f"1-{IDEMPOTENCY_KEY_MAX} printable ASCII characters, no space at either end. {description}",
    )


# --- Shapes shared by several operations --------------------------------------------------------
@extend_schema_field(
    {
        "type": "string",
        "enum": list(RunStatus.values),
        "description": "queued, running, sleeping, waiting, "
        "retrying, paused, completed, failed or terminated (the last three are final).",
    },
    component_name="RunStatus",
)
class RunStatusField(serializers.ChoiceField):
    """The run status, named RunStatus in the schema (another app's "status" enum would otherwise
    compete for the generic name StatusEnum)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=RunStatus.choices, **kwargs)


@extend_schema_serializer(component_name="RunSummary")
class RunSummarySerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    workflow = serializers.CharField()
    workflow_version = serializers.CharField()
    status = RunStatusField()
    attempt = serializers.IntegerField(help_text="The current attempt; restart adds one.")
    owner = serializers.CharField(source="owner.username", allow_null=True)
    idempotency_key = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


@extend_schema_serializer(component_name="RunStep")
class RunStepSerializer(serializers.Serializer[dict[str, Any]]):
    attempt = serializers.IntegerField()
    position = serializers.IntegerField(help_text="1 for the first step of the attempt.")
    name = serializers.CharField()
    kind = serializers.CharField(help_text="do, sleep or wait")
    status = serializers.CharField()
    tries = serializers.IntegerField()
    result = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    wake_at = serializers.DateTimeField(
        allow_null=True,
        help_text="The step's timer while it can fire: the end of its sleep or wait, its next try, or a dispatched "
        "step's deadline. Null once its run has ended or restarted.",
    )
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


@extend_schema_serializer(component_name="RunAttempt")
class RunAttemptSerializer(serializers.Serializer[dict[str, Any]]):
    number = serializers.IntegerField()
    status = serializers.CharField()
    result = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


@extend_schema_serializer(component_name="RunWaitingFor")
class RunWaitingForSerializer(serializers.Serializer[dict[str, Any]]):
    step = serializers.CharField()
    event_type = serializers.CharField(allow_null=True, help_text="null for a sleep or a retry backoff")
    until = serializers.DateTimeField(allow_null=True)


@extend_schema_serializer(component_name="RunDetail")
class RunDetailSerializer(RunSummarySerializer):
    payload = serializers.JSONField()
    result = serializers.JSONField(allow_null=True, help_text="The run's result once completed.")
    error = serializers.JSONField(allow_null=True, help_text="Why the run failed: type and message.")
    failure_reason = serializers.CharField(allow_blank=True)
    progress = serializers.JSONField(allow_null=True)
    current_step = serializers.CharField(allow_blank=True)
    pause_requested = serializers.BooleanField()
    waiting_for = RunWaitingForSerializer(allow_null=True)
    steps = RunStepSerializer(many=True, help_text="Every step of every attempt, oldest attempt first.")
    attempts = RunAttemptSerializer(many=True)


def run_detail_data(*, run: WorkflowRun, user: AbstractUser | AnonymousUser) -> dict[str, Any]:
    """Everything GET /api/runs/<id> shows, read from the database (the authority)."""
    steps = run_timeline(run=run)
    for step in steps:
        step["error"] = public_error(step["error"], user=user)
    attempts = [
        {
            "number": a.number,
            "status": attempt_status(run, a),
            "result": a.result,
            "error": public_error(a.error, user=user),
            "started_at": a.started_at,
            "finished_at": a.finished_at,
        }
        for a in run_attempts(run=run)
    ]
    return {
        "id": run.id,
        "workflow": run.workflow,
        "workflow_version": run.workflow_version,
        "status": run.status,
        "attempt": run.attempt,
        # Nested the way RunSummarySerializer's source="owner.username" reads it.
        "owner": {"username": run.owner.username} if run.owner is not None else None,
        "idempotency_key": run.idempotency_key,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "payload": run.payload,
        "result": run.result,
        "error": public_error(run.error, user=user),
        "failure_reason": run.failure_reason,
        "progress": run.progress,
        "current_step": run.current_step,
        "pause_requested": run.pause_requested,
        "waiting_for": waiting_for(run),
        "steps": steps,
        "attempts": attempts,
    }


def _run_location(run_id: UUID) -> str:
    return reverse("api-run-detail", kwargs={"run_id": str(run_id)})


# --- Operations ---------------------------------------------------------------------------------
class RunStartApi(ApiBase):
    """POST /api/workflows/<name>/runs: start a run of the named workflow, if it is public
    (``@workflow(name, public=True)``); its ``validate_payload`` checks the payload."""

    @extend_schema_serializer(component_name="RunStartInput")
    class InputSerializer(StrictSerializer):
        payload = JsonObjectField(
            required=False,
            default=dict,
            help_text="The workflow's input (a JSON object, default {}); run() sees it as event.payload. "
            "The workflow's validate_payload may refuse it (400 invalid_payload).",
        )

    OutputSerializer = RunSummarySerializer

    @extend_schema(
        operation_id="run_start",
        tags=TAGS,
        request=InputSerializer,
        parameters=[
            idempotency_key_parameter(
                "Scoped to the caller and the workflow. Same key and payload again: 200 with the existing run. "
                "Same key, other payload: 409."
            )
        ],
        responses={
            201: OutputSerializer,
            200: OutputSerializer,
            **error_responses(400, 401, 403, 404, 409, 413, 415, 429),
        },
        examples=[OpenApiExample("start", value={"payload": {"order_id": 1042}}, request_only=True)],
    )
    def post(self, request: Request, name: str) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        payload = serializer.validated_data["payload"]
        key = idempotency_key_header(request)
        services.check_startable(workflow=name)
        run, created = services.run_start(
            workflow=name,
            payload=payload,
            idempotency_key=key,
            owner=authenticated_user(request),
            quota=True,
            queue=conf()["PUBLIC_QUEUE"] or None,
        )
        return Response(
            self.OutputSerializer(run).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
            headers={"Location": _run_location(run.id)},
        )


class RunListApi(ApiBase):
    """GET /api/runs: the runs the caller may see, newest first, cursor-paginated."""

    query_methods = QUERY_ON_GET

    @extend_schema_serializer(component_name="RunListFilter")
    class FilterSerializer(StrictSerializer):
        status = RunStatusField(required=False)
        workflow = StrictCharField(required=False, max_length=100)
        # The paginator reads these two; declared so that they are not refused as unknown.
        cursor = StrictCharField(
            required=False, pattern=CURSOR, help_text="From the previous page's next/previous link."
        )
        page_size = serializers.IntegerField(required=False, min_value=1, max_value=RunCursorPagination.max_page_size)

    @extend_schema_serializer(component_name="RunPage")
    class OutputSerializer(serializers.Serializer[dict[str, Any]]):
        next = serializers.URLField(allow_null=True)
        previous = serializers.URLField(allow_null=True)
        results = RunSummarySerializer(many=True)

    @extend_schema(
        operation_id="run_list",
        tags=TAGS,
        parameters=[FilterSerializer],
        responses={200: OutputSerializer, **error_responses(400, 401)},
    )
    def get(self, request: Request) -> Response:
        filters = self.FilterSerializer(data=request.query_params.dict())
        filters.is_valid(raise_exception=True)
        runs = run_list(
            user=request.user,
            status=filters.validated_data.get("status"),
            workflow=filters.validated_data.get("workflow"),
        ).select_related("owner")
        paginator = RunCursorPagination()
        page = paginator.paginate_queryset(runs, request, view=self)
        return paginator.get_paginated_response(RunSummarySerializer(page, many=True).data)


class RunDetailApi(ApiBase):
    """GET /api/runs/<id>: the run with its steps, attempts, what it waits for, result or error."""

    OutputSerializer = RunDetailSerializer

    @extend_schema(
        operation_id="run_retrieve",
        tags=TAGS,
        parameters=[RUN_ID],
        responses={200: OutputSerializer, **error_responses(401, 404)},
    )
    def get(self, request: Request, run_id: str) -> Response:
        run = visible_run(user=request.user, run_id=run_id)
        return Response(self.OutputSerializer(run_detail_data(run=run, user=request.user)).data)


class RunSendEventApi(ApiBase):
    """POST /api/runs/<id>/events: record an event; a run waiting for its type resumes."""

    @extend_schema_serializer(component_name="RunEventInput")
    class InputSerializer(StrictSerializer):
        type = StrictCharField(max_length=200, help_text="What step.wait_for_event(type=...) waits for.")
        payload = JsonValueField(required=False, default=dict, help_text="Any JSON; default {}.")
        idempotency_key = StrictCharField(
            required=False,
            allow_null=True,
            max_length=IDEMPOTENCY_KEY_MAX,
            pattern=IDEMPOTENCY_KEY,
            error_messages={
                "pattern": f"The key must be 1 to {IDEMPOTENCY_KEY_MAX} printable ASCII characters, "
                "not starting or ending with a space (as a run's Idempotency-Key)."
            },
            help_text="Per run; 1 to 255 printable ASCII characters, no space at either end. "
            "Same key, type and payload again: 200 with the stored event. Otherwise 409.",
        )

    @extend_schema_serializer(component_name="RunEvent")
    class OutputSerializer(serializers.Serializer[RunEvent]):
        id = serializers.IntegerField()
        run = serializers.UUIDField(source="run_id")
        type = serializers.CharField()
        payload = serializers.JSONField()
        idempotency_key = serializers.CharField(allow_null=True)
        created_at = serializers.DateTimeField()
        consumed_at = serializers.DateTimeField(allow_null=True, help_text="When a waiting step took it.")

    @extend_schema(
        operation_id="run_send_event",
        tags=TAGS,
        parameters=[RUN_ID],
        request=InputSerializer,
        responses={
            201: OutputSerializer,
            200: OutputSerializer,
            **error_responses(400, 401, 403, 404, 409, 413, 415, 429),
        },
    )
    def post(self, request: Request, run_id: str) -> Response:
        # Access first: whatever the body, a caller who may not see the run learns only "not found".
        run = controllable_run(user=request.user, run_id=run_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        event, created = services.run_send_event(
            run_id=run.id,
            type=data["type"],
            payload=data["payload"],
            idempotency_key=data.get("idempotency_key"),
        )
        return Response(
            self.OutputSerializer(event).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )


class RunControlApi(ApiBase):
    """Base of the four control operations: the caller must be allowed to control the run; the
    service refuses a transition the run's state does not allow (409 with that state)."""

    InputSerializer: type[StrictSerializer] = NoFields  # pause, resume and terminate take no body

    OutputSerializer = RunDetailSerializer

    def control(self, request: Request, run_id: str, action: Callable[..., WorkflowRun]) -> Response:
        run = controllable_run(user=request.user, run_id=run_id)
        # The body is read once the caller may control the run: to anyone else, only "not found".
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run = action(run_id=run.id, **serializer.validated_data)
        return Response(self.OutputSerializer(run_detail_data(run=run, user=request.user)).data)


def _control_schema(operation: str, description: str) -> Callable[[Callable[..., Response]], Callable[..., Response]]:
    return extend_schema(
        operation_id=f"run_{operation}",
        tags=TAGS,
        parameters=[RUN_ID],
        request=None,
        description=f"{description} No body, or an empty object.",
        responses={200: RunDetailSerializer, **error_responses(400, 401, 403, 404, 409)},
    )


class RunPauseApi(RunControlApi):
    @_control_schema(
        "pause",
        "Pause between steps; a running run pauses at its next step boundary (pause_requested is true until then).",
    )
    def post(self, request: Request, run_id: str) -> Response:
        return self.control(request, run_id, services.run_pause)


class RunResumeApi(RunControlApi):
    @_control_schema("resume", "Resume a paused run, or withdraw a pause that is not yet effective.")
    def post(self, request: Request, run_id: str) -> Response:
        return self.control(request, run_id, services.run_resume)


class RunTerminateApi(RunControlApi):
    @_control_schema("terminate", "Stop the run for good; a step in flight finishes, no later step starts.")
    def post(self, request: Request, run_id: str) -> Response:
        return self.control(request, run_id, services.run_terminate)


class RunRestartApi(RunControlApi):
    @extend_schema_serializer(component_name="RunRestartInput")
    class InputSerializer(StrictSerializer):
        attempt = StrictIntegerField(
            required=False,
            min_value=1,
            max_value=2**31 - 1,
            help_text="The attempt to replace (the run's `attempt` as you saw it): 409 if the run is on "
            "another now, restarted already by a second click or someone else. Without it, the current one.",
        )

    @extend_schema(
        operation_id="run_restart",
        tags=TAGS,
        parameters=[RUN_ID],
        request=InputSerializer,
        description="Start a new attempt from the first step; earlier attempts stay visible. An empty body "
        "restarts whatever attempt is current. Your own run brought back from its end counts against "
        "your limit of unfinished runs, as a start does (429).",
        responses={200: RunDetailSerializer, **error_responses(400, 401, 403, 404, 409, 429)},
    )
    def post(self, request: Request, run_id: str) -> Response:
        return self.control(request, run_id, partial(services.run_restart, quota_for=authenticated_user(request)))
