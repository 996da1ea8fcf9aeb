"""The submissions API: other systems hand an agent messages, durably and exactly once.

- ``POST /api/agents/<kind>/<name>/submissions`` (``Idempotency-Key``): 202 ``{id, status:
  "pending", accepted: true}``; the same key and body again 200 with the first one (``accepted:
  false``); the same key with another body 409. The row is committed before anything runs, and a
  worker queues its turn (``agents.submissions.submission_accept``).
- ``GET /api/agents/<kind>/<name>/submissions?status=``: the agent's, newest first, cursor-paginated.
- ``GET /api/submissions/<id>``, ``POST /api/submissions/<id>/cancel`` (409 with the status once ended).

Only members of the agent's account reach any of them; anyone else gets the same 404.

A POST that another system makes with its token is accepted by one statement when it can be
(``agent_submissions``); every other request is AgentSubmissionsApi's.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    extend_schema_serializer,
)
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from agents import selectors, services, statements
from agents.apis import (
    KIND,
    NAME,
    AgentQuerySerializer,
    AgentRefSerializer,
    TurnSummarySerializer,
    user_of,
    visible_agent,
)
from agents.consumers import max_text_chars
from agents.models import Submission, SubmissionStatus
from agents.submissions import (
    QUEUE_TASK,
    check_submission,
    fingerprint,
    submission_accept,
    submission_cancel,
)
from workflows import outbox
from workflows.apis.common import (
    CURSOR,
    QUERY_ON_ALL,
    ApiBase,
    JsonObjectField,
    RunCursorPagination,
    StrictCharField,
    StrictSerializer,
    check_no_body,
    idempotency_key_header,
    idempotency_key_valid,
)
from workflows.apis.errors import body_limit, error_response, error_responses
from workflows.apis.runs import idempotency_key_parameter
from workflows.apis.schema import NOT_BLANK
from workflows.conf import conf as workflows_conf
from workflows.exceptions import InvalidPayload
from workflows.storable import MAX_JSON_DEPTH, json_loads_strict

TAGS = ["submissions"]
# What InputSerializer takes, fixed when the module loads (as DRF fixes a field's limits).
MAX_MESSAGES = int(settings.AGENTS_MAX_SUBMISSION_MESSAGES)
MAX_CONTENT_CHARS = max_text_chars()
SUBMISSION_ID = OpenApiParameter(
    "submission_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The submission's id."
)


@extend_schema_field(
    {
        "type": "string",
        "enum": list(SubmissionStatus.values),
        "description": "pending, running, then completed, cancelled, skipped (its turn was sealed) or error.",
    },
    component_name="SubmissionStatus",
)
class SubmissionStatusField(serializers.ChoiceField):
    """Named SubmissionStatus in the schema (the runs' status enum would compete for StatusEnum)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=SubmissionStatus.choices, **kwargs)


@extend_schema_serializer(component_name="SubmissionMessage")
class SubmittedMessageSerializer(serializers.Serializer[dict[str, Any]]):
    role = serializers.CharField(help_text="Always 'user'.")
    content = serializers.CharField()


@extend_schema_serializer(component_name="Submission")
class SubmissionSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    agent = AgentRefSerializer()
    status = SubmissionStatusField(
        help_text="pending, running, then completed, cancelled, skipped (its turn was sealed) or error."
    )
    messages = SubmittedMessageSerializer(many=True)
    metadata = serializers.JSONField()
    turn = TurnSummarySerializer(
        allow_null=True,
        help_text="The turn that answers it. Null for a moment after it is accepted, until a worker queues its turn.",
    )
    created_at = serializers.DateTimeField()
    delivered_at = serializers.DateTimeField(
        allow_null=True,
        help_text=(
            "When its turn started and its messages joined the conversation. Null: they never did "
            "(still pending, or cancelled before its turn); a cancelled one with a time was stopped while running."
        ),
    )
    finished_at = serializers.DateTimeField(allow_null=True)


@extend_schema_serializer(component_name="SubmissionAccepted")
class AcceptedSerializer(serializers.Serializer[dict[str, Any]]):
    id = serializers.UUIDField()
    status = SubmissionStatusField()
    accepted = serializers.BooleanField(help_text="False: the same key and body were submitted before; this is that.")


@extend_schema_serializer(component_name="SubmissionMessageInput")
class MessageInputSerializer(StrictSerializer):
    role = serializers.ChoiceField(choices=["user"], required=False, help_text="Only 'user' (the default).")
    content = StrictCharField(
        pattern=NOT_BLANK,
        max_length=MAX_CONTENT_CHARS,
        help_text="What the system says.",
        # One answer for "" and for spaces, in the chat's words.
        error_messages=dict.fromkeys(("pattern", "blank"), "A message must be a non-empty string, not only spaces."),
    )


def plainly_valid(data: Any) -> dict[str, Any] | None:
    """The input as ``AgentSubmissionsApi.InputSerializer`` validates it, read without DRF when it
    is plainly valid (what a well-behaved caller always sends); None for anything else, which the
    serializer then refuses with its field-by-field errors. DRF builds and deep-copies a serializer
    with its nested fields for every request: a tenth of a submission's CPU, for a check this one
    makes in a few comparisons (``agents/tests/test_submissions.py`` holds the two alike)."""
    if not isinstance(data, dict) or not set(data) <= {"messages", "metadata"}:
        return None
    messages, metadata = data.get("messages"), data.get("metadata", {})
    if not isinstance(messages, list) or not 1 <= len(messages) <= MAX_MESSAGES or not isinstance(metadata, dict):
        return None
    for item in messages:
        if not isinstance(item, dict) or not set(item) <= {"role", "content"} or item.get("role", "user") != "user":
            return None
        try:
            # The chat's own check: text, not blank (NOT_BLANK: a character str.strip keeps), within
            # AGENTS_MAX_MESSAGE_CHARS (MAX_CONTENT_CHARS), storable (no NUL, no lone surrogate).
            services.check_message(item.get("content"))
        except services.InvalidMessage:
            return None
    return {"messages": messages, "metadata": metadata}


def visible_submission(request: Request, submission_id: str) -> Submission:
    submission = selectors.submission_get(user=user_of(request), submission_id=submission_id)
    if submission is None or str(submission.pk) != submission_id.lower():
        raise exceptions.NotFound()
    return submission


class AgentSubmissionsApi(ApiBase):
    """GET and POST /api/agents/<kind>/<name>/submissions: list the agent's, or submit."""

    query_methods = QUERY_ON_ALL

    @extend_schema_serializer(component_name="SubmissionInput")
    class InputSerializer(StrictSerializer):
        messages = serializers.ListField(
            child=MessageInputSerializer(),
            min_length=1,
            max_length=MAX_MESSAGES,
            help_text="1 to AGENTS_MAX_SUBMISSION_MESSAGES (20) user messages, in order.",
        )
        metadata = JsonObjectField(required=False, default=dict, help_text="Yours, kept with the submission.")

    @extend_schema_serializer(component_name="SubmissionListFilter")
    class FilterSerializer(AgentQuerySerializer):
        status = SubmissionStatusField(required=False)
        cursor = StrictCharField(required=False, pattern=CURSOR, help_text="From the previous page's link.")
        page_size = serializers.IntegerField(required=False, min_value=1, max_value=RunCursorPagination.max_page_size)

    @extend_schema_serializer(component_name="SubmissionPage")
    class PageSerializer(serializers.Serializer[dict[str, Any]]):
        next = serializers.URLField(allow_null=True)
        previous = serializers.URLField(allow_null=True)
        results = SubmissionSerializer(many=True)

    @extend_schema(
        operation_id="submission_create",
        tags=TAGS,
        parameters=[
            KIND,
            NAME,
            AgentQuerySerializer,
            idempotency_key_parameter(
                "Scoped to the agent and the caller (another member's same key is another submission). Same "
                "key and body again: 200 with the first submission. Same key, other body: 409."
            ),
        ],
        request=InputSerializer,
        responses={
            202: AcceptedSerializer,
            200: AcceptedSerializer,
            **error_responses(400, 401, 403, 404, 409, 413, 415, 429),
        },
        examples=[
            OpenApiExample(
                "crm",
                value={"messages": [{"role": "user", "content": "Order 1042 arrived damaged"}]},
                request_only=True,
            )
        ],
    )
    def post(self, request: Request, kind: str, name: str) -> Response:
        # The request first: resolving the agent creates it, and a refused request creates nothing.
        key = idempotency_key_header(request)
        data = plainly_valid(request.data)
        if data is None:
            serializer = self.InputSerializer(data=request.data)
            serializer.is_valid(raise_exception=True)
            data = serializer.validated_data
        messages, metadata = check_submission(data["messages"], data["metadata"])
        agent = visible_agent(request, kind, name)
        try:
            result = submission_accept(
                agent=agent, user=user_of(request), messages=messages, metadata=metadata, idempotency_key=key
            )
        except services.TooManyQueuedTurns as exc:
            return error_response("too_many_requests", str(exc), status.HTTP_429_TOO_MANY_REQUESTS)
        # AcceptedSerializer's fields, written out: the answer to every submission.
        body = {"id": str(result.submission.pk), "status": result.submission.status, "accepted": result.accepted}
        return Response(
            body,
            status=status.HTTP_202_ACCEPTED if result.accepted else status.HTTP_200_OK,
            headers={"Location": f"/api/submissions/{result.submission.pk}"},
        )

    @extend_schema(
        operation_id="submission_list",
        tags=TAGS,
        parameters=[KIND, NAME, FilterSerializer],
        responses={200: PageSerializer, **error_responses(400, 401, 404, 409)},
    )
    def get(self, request: Request, kind: str, name: str) -> Response:
        filters = self.FilterSerializer(data=request.query_params.dict())
        filters.is_valid(raise_exception=True)
        agent = visible_agent(request, kind, name, params=filters.validated_data)
        rows = selectors.submissions_of(agent=agent, status=filters.validated_data.get("status"))
        paginator = RunCursorPagination()
        page = paginator.paginate_queryset(rows, request, view=self)
        return paginator.get_paginated_response(
            SubmissionSerializer([selectors.submission_data(s) for s in page or []], many=True).data
        )


class SubmissionDetailApi(ApiBase):
    """GET /api/submissions/<id>: the submission, its status and the turn that answers it."""

    @extend_schema(
        operation_id="submission_retrieve",
        tags=TAGS,
        parameters=[SUBMISSION_ID],
        responses={200: SubmissionSerializer, **error_responses(401, 404)},
    )
    def get(self, request: Request, submission_id: str) -> Response:
        submission = visible_submission(request, submission_id)
        return Response(SubmissionSerializer(selectors.submission_data(submission)).data)


class SubmissionCancelApi(ApiBase):
    """POST /api/submissions/<id>/cancel: a pending one is cancelled (its messages never join the
    conversation), a running one's turn is stopped; an ended one is a 409 with its status."""

    @extend_schema(
        operation_id="submission_cancel",
        tags=TAGS,
        parameters=[SUBMISSION_ID],
        request=None,
        description="No body, or an empty object.",
        responses={200: SubmissionSerializer, **error_responses(400, 401, 404, 409, 415)},
    )
    def post(self, request: Request, submission_id: str) -> Response:
        submission = visible_submission(request, submission_id)
        check_no_body(request)  # read once the caller may see it: to anyone else, only "not found"
        cancelled = submission_cancel(submission=submission, user=user_of(request))
        fresh = selectors.submission_get(user=user_of(request), submission_id=cancelled.pk)
        assert fresh is not None
        return Response(SubmissionSerializer(selectors.submission_data(fresh)).data)


_submissions_api = AgentSubmissionsApi.as_view()
# What agent_submissions answers itself: bodies of at most this many bytes (a submission of a few
# messages; larger ones are DRF's), with no more brackets than a submission of
# AGENTS_MAX_SUBMISSION_MESSAGES messages and some metadata has (MAX_JSON_DEPTH is far above it),
# to a caller who accepts JSON as DRF's JSONRenderer writes it.
QUICK_BODY_BYTES = min(16 * 1024, body_limit(), settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 16 * 1024)
QUICK_BRACKETS = min(MAX_MESSAGES + 32, MAX_JSON_DEPTH + 1)
PLAIN_ACCEPT = {"*/*", "application/json"}
# What DRF adds to AgentSubmissionsApi's answers (APIView.finalize_response): the same here.
API_HEADERS = {"Allow": "GET, POST, HEAD, OPTIONS"}


@csrf_exempt  # as DRF's views: a token is no cookie, and the session's requests go to DRF, which checks CSRF
def agent_submissions(request: HttpRequest, kind: str, name: str) -> HttpResponseBase:
    """``/api/agents/<kind>/<name>/submissions``. A POST another system makes with its token, with no
    query and a plainly valid JSON body, to an agent that exists, is accepted here by one statement
    (``statements.accept_by_token``: the token, its user, the agent, the key and the caps checked by
    the INSERT itself), and answered 202 as AgentSubmissionsApi answers. Every other request, and
    one that statement stores nothing for (a bad token, a new agent, a retry, a cap reached), is
    AgentSubmissionsApi's, which answers it as it always does: the statement writes nothing unless
    it is a new submission the API would accept.

    Why: a daphne answers each request in a thread, and each wait on PostgreSQL or Redis costs the
    thread the interpreter's lock, taken back among fifteen others. Through DRF a submission made
    four such waits (the token, the agent, the insert, the task), and its CPU a request was more
    than a signed webhook's; here it makes two (docs/inbound-performance.md)."""
    if request.method == "POST" and not request.GET:
        accepted = _accept_by_token(request, kind, name)
        if accepted is not None:
            return accepted
    return _submissions_api(request, kind=kind, name=name)


# The schema generator (drf-spectacular) and Django read the view class from these, as from as_view's.
for _attribute in ("cls", "initkwargs", "view_class", "view_initkwargs"):
    setattr(agent_submissions, _attribute, getattr(_submissions_api, _attribute))


def _accept_by_token(request: HttpRequest, kind: str, name: str) -> HttpResponse | None:
    """The 202 for a new submission this request makes, stored; None, with nothing stored, for
    anything AgentSubmissionsApi is to answer."""
    parts = request.headers.get("Authorization", "").encode("latin-1").split()
    if len(parts) != 2 or parts[0].lower() != b"token":
        return None
    token = parts[1].decode("latin-1")
    # A key DRF makes: 40 hex digits. Any other is left to DRF's reading of it.
    if not (token.isascii() and token.isalnum() and len(token) <= 40):
        return None
    key = request.headers.get("Idempotency-Key")
    if key is not None and not idempotency_key_valid(key):
        return None
    if (
        request.content_type != "application/json"
        or (request.content_params or {}).get("charset", "utf-8").lower() != "utf-8"
    ):
        return None
    if request.headers.get("Accept", "*/*") not in PLAIN_ACCEPT:  # DRF negotiates anything else
        return None
    try:
        length = int(request.headers.get("Content-Length", ""))
    except ValueError:
        return None
    # The token is checked by the statement, after the body is read: only a small body is read
    # here, and one nested deeper than a submission's shape needs goes to DRF unparsed, so a caller
    # without a valid token costs little more than DRF's own refusal.
    if not 0 < length <= QUICK_BODY_BYTES:
        return None
    body = request.body  # kept: AgentSubmissionsApi reads it again if it answers
    if body.count(b"[") + body.count(b"{") > QUICK_BRACKETS:
        return None
    try:
        data = json_loads_strict(body.decode())
    except ValueError:
        return None
    plain = plainly_valid(data)
    if plain is None or not selectors.addressable(kind, name):
        return None
    try:
        messages, metadata = check_submission(plain["messages"], plain["metadata"])
    except InvalidPayload:
        return None
    submission = Submission(
        turn=None,
        idempotency_key=key or "",
        fingerprint=fingerprint(messages, metadata),
        messages=messages,
        metadata=metadata,
    )
    agent_id = statements.accept_by_token(
        submission,
        token=token,
        kind=kind,
        name=name,
        user_limit=int(settings.AGENTS_MAX_OPEN_TURNS_PER_USER),
        pending_limit=int(settings.AGENTS_MAX_PENDING_SUBMISSIONS),
    )
    if agent_id is not None:
        outbox.send_on_commit(QUEUE_TASK, (agent_id,), queue=workflows_conf()["QUEUE"])
        return accepted_response(submission.pk, submission.status, accepted=True)
    # Nothing stored: a retry of the same body is answered here too (a second statement); a key
    # reused for another body, and everything else, as the API answers it.
    earlier = statements.submission_by_token_and_key(token=token, kind=kind, name=name, key=key or "")
    if earlier is None or earlier[2] != submission.fingerprint:
        return None
    return accepted_response(earlier[0], earlier[1], accepted=False)


def accepted_response(submission_id: UUID, status: str, *, accepted: bool) -> HttpResponse:
    """AgentSubmissionsApi's answer to a submission, as DRF's JSONRenderer writes it."""
    body = {"id": str(submission_id), "status": status, "accepted": accepted}
    return HttpResponse(
        json.dumps(body, separators=(",", ":")).encode(),
        status=202 if accepted else 200,
        content_type="application/json",
        headers={"Location": f"/api/submissions/{submission_id}", **API_HEADERS},
    )
