"""HTTP API of agents: the snapshot, send a message, a turn, stop it (its stream: ``agents.sse``).

One class per operation, with the runs API's conventions (``workflows.apis``): token or session
authentication, strict JSON input, errors as ``{"error": {code, message, detail}}``, no trailing
slash. An agent is named by kind and name in the path and its account by ``?account=<slug>``
(default: the caller's first account); a caller who is not a member, an unknown account or kind,
and another agent's turn are all a 404, which confirms nothing.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib.auth.models import User
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    extend_schema_serializer,
)
from rest_framework import authentication, exceptions, serializers, status
from rest_framework.permissions import SAFE_METHODS
from rest_framework.request import Request
from rest_framework.response import Response

from agents import selectors, services
from agents.consumers import max_text_chars
from agents.models import Agent, Turn, TurnStatus
from workflows.apis.common import (
    QUERY_ON_ALL,
    ApiBase,
    StrictCharField,
    StrictSerializer,
    authenticated_user,
    check_no_body,
)
from workflows.apis.converters import name_parameter
from workflows.apis.errors import error_response, error_responses
from workflows.apis.schema import NOT_BLANK

TAGS = ["agents"]
ACCOUNT_SLUG = "[-a-zA-Z0-9_]+"  # a SlugField's values
ACCOUNT_MAX = 64
KIND = name_parameter("kind", "The agent's kind (a registered ChatAgent).")
NAME = name_parameter("name", "The agent's name within the account.")
TURN_ID = OpenApiParameter("turn_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The turn's id.")


# --- Shapes ---------------------------------------------------------------------------------------
@extend_schema_field(
    {
        "type": "string",
        "enum": list(TurnStatus.values),
        "description": "queued, running, waiting (for an approval), then completed, cancelled, sealed or failed.",
    },
    component_name="AgentTurnStatus",
)
class TurnStatusField(serializers.ChoiceField):
    """Named AgentTurnStatus in the schema (the runs' status enum would compete for StatusEnum)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=TurnStatus.choices, **kwargs)


@extend_schema_serializer(component_name="AgentRef")
class AgentRefSerializer(serializers.Serializer[dict[str, Any]]):
    kind = serializers.CharField()
    name = serializers.CharField()
    account = serializers.CharField(help_text="The account's slug.")


@extend_schema_serializer(component_name="AgentMessage")
class MessageSerializer(serializers.Serializer[dict[str, Any]]):
    id = serializers.IntegerField()
    turn = serializers.UUIDField(allow_null=True)
    role = serializers.CharField(help_text="user, assistant or tool")
    text = serializers.CharField(allow_blank=True)
    parts = serializers.JSONField(help_text="Assistant: {tool_calls}; tool: {tool_call_id, name, result}.")
    created_at = serializers.DateTimeField()


@extend_schema_serializer(component_name="AgentTurnSummary")
class TurnSummarySerializer(serializers.Serializer[dict[str, Any]]):
    id = serializers.UUIDField()
    number = serializers.IntegerField()
    status = TurnStatusField()
    end_reason = serializers.CharField(allow_blank=True)


@extend_schema_serializer(component_name="AgentActiveTurn")
class ActiveTurnSerializer(serializers.Serializer[dict[str, Any]]):
    id = serializers.UUIDField()
    number = serializers.IntegerField()
    status = TurnStatusField()
    seq = serializers.IntegerField(help_text="The highest seq stored of its stream.")


@extend_schema_serializer(component_name="AgentSnapshot")
class SnapshotSerializer(serializers.Serializer[Any]):
    agent = AgentRefSerializer()
    messages = MessageSerializer(
        many=True,
        help_text="The conversation, oldest first: the newest 200 that fit in 512 KiB, after 'since' if given.",
    )
    since = serializers.IntegerField(allow_null=True, help_text="The 'since' asked for, or null.")
    more = serializers.BooleanField(help_text="Older messages (after 'since') were left out to keep it small.")
    state = serializers.JSONField(help_text="The agent's own JSON state.")
    state_version = serializers.IntegerField()
    turn = ActiveTurnSerializer(allow_null=True, help_text="The running (or waiting) turn, if any.")
    queued = TurnSummarySerializer(many=True, help_text="The turns queued behind it, in order.")
    stopped = TurnSummarySerializer(
        many=True,
        help_text="Turns of these messages stopped before they answered (cancelled while queued, say): "
        "their message was never answered, and end_reason says who stopped it.",
    )


@extend_schema_serializer(component_name="AgentTurn")
class TurnSerializer(TurnSummarySerializer):
    text = serializers.CharField(allow_blank=True, help_text="The answer as delivered (partial if sealed).")
    recoveries = serializers.IntegerField(help_text="Times its stream was recovered after a crash.")
    seq = serializers.IntegerField(help_text="The highest seq stored of its stream.")
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


def turn_detail_data(turn: Turn) -> dict[str, Any]:
    return {
        **selectors.turn_data(turn),
        "text": turn.text,
        "recoveries": turn.recoveries,
        "seq": selectors.turn_seq(turn_id=turn.pk),
        "created_at": turn.created_at,
        "started_at": turn.started_at,
        "finished_at": turn.finished_at,
    }


@extend_schema_serializer(component_name="AgentQuery")
class AgentQuerySerializer(StrictSerializer):
    account = StrictCharField(
        required=False,
        max_length=ACCOUNT_MAX,
        pattern=ACCOUNT_SLUG,
        help_text="The account's slug; default: the caller's first account.",
    )


class MessageIdField(serializers.IntegerField):
    """A message id in the query string, read as the socket reads it (``selectors.message_id``)."""

    default_error_messages = {"invalid": "A message id is 1 to 18 digits (0 to 9), nothing else."}

    def to_internal_value(self, data: Any) -> int:
        found = selectors.message_id(data) if isinstance(data, str) else None
        if found is None:
            self.fail("invalid")
        return found


@extend_schema_serializer(component_name="AgentSnapshotQuery")
class SnapshotQuerySerializer(AgentQuerySerializer):
    since = MessageIdField(
        required=False,
        min_value=0,
        max_value=10**18 - 1,
        help_text="A message id (1 to 18 digits): only the messages after it (a client that has the rest).",
    )


def query_params(request: Request, serializer: type[AgentQuerySerializer] = AgentQuerySerializer) -> dict[str, Any]:
    """The query string as ``serializer`` validates it (a 400 for an unknown or bad parameter)."""
    if not request.query_params and serializer is AgentQuerySerializer:
        return {}  # nothing to check, and nothing has a default: every API call of an agent comes here
    params = serializer(data=request.query_params.dict())
    params.is_valid(raise_exception=True)
    return dict(params.validated_data)


class AgentLimitReached(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = selectors.TooManyAgents.code


def visible_agent(
    request: Request, kind: str, name: str, *, params: dict[str, Any] | None = None, create: bool = True
) -> Agent:
    """The agent for a member of its account (created on first use unless ``create`` is false),
    else NotFound. ``params``: the query string as validated already (default: as
    AgentQuerySerializer validates it). A GET authenticated by the session creates nothing: a
    browser sends its cookie on a link followed from any site, and only a write (which needs the
    CSRF token) or a token's caller opens an agent."""
    params = query_params(request) if params is None else params
    create = create and (
        request.method not in SAFE_METHODS
        or not isinstance(request.successful_authenticator, authentication.SessionAuthentication)
    )
    try:
        agent = selectors.agent_get(
            user=request.user, kind=kind, name=name, account=params.get("account"), create=create
        )
    except selectors.TooManyAgents as exc:
        raise AgentLimitReached(str(exc)) from None
    if agent is None:
        raise exceptions.NotFound()
    return agent


def visible_turn(*, agent: Agent, turn_id: str) -> Turn:
    """The agent's turn, else NotFound (another agent's turn too). Only the hyphenated form of the
    id, in either case, as the runs API takes one."""
    try:
        parsed = UUID(turn_id)
    except ValueError:
        raise exceptions.NotFound() from None
    if str(parsed) != turn_id.lower():
        raise exceptions.NotFound()
    turn = selectors.turn_get(agent=agent, turn_id=parsed)
    if turn is None:
        raise exceptions.NotFound()
    return turn


def user_of(request: Request) -> User:
    """The signed-in caller (IsAuthenticated lets no one else in; checked again, failing closed)."""
    user = authenticated_user(request)
    if not isinstance(user, User):
        raise exceptions.NotAuthenticated()
    return user


# --- Operations -----------------------------------------------------------------------------------
class AgentSnapshotApi(ApiBase):
    """GET /api/agents/<kind>/<name>: the conversation, the state, the active and queued turns."""

    query_methods = QUERY_ON_ALL

    OutputSerializer = SnapshotSerializer

    @extend_schema(
        operation_id="agent_snapshot",
        tags=TAGS,
        parameters=[KIND, NAME, SnapshotQuerySerializer],
        responses={200: OutputSerializer, **error_responses(400, 401, 404, 409)},
    )
    def get(self, request: Request, kind: str, name: str) -> Response:
        params = query_params(request, SnapshotQuerySerializer)
        agent = visible_agent(request, kind, name, params=params)
        snapshot = selectors.agent_snapshot(agent=agent, since=params.get("since"))
        return Response(self.OutputSerializer(snapshot).data)


class AgentMessageApi(ApiBase):
    """POST /api/agents/<kind>/<name>/messages: send a message; it becomes a turn, started now if
    no turn of the agent is open, else queued behind them (202: the answer streams later)."""

    query_methods = QUERY_ON_ALL

    @extend_schema_serializer(component_name="AgentMessageInput")
    class InputSerializer(StrictSerializer):
        text = StrictCharField(pattern=NOT_BLANK, max_length=max_text_chars(), help_text="What the customer says.")

    OutputSerializer = TurnSerializer

    @extend_schema(
        operation_id="agent_message_send",
        tags=TAGS,
        parameters=[KIND, NAME, AgentQuerySerializer],
        request=InputSerializer,
        description="202 with the turn, running or queued. 429 too_many_requests when the agent has "
        "AGENTS_MAX_QUEUED_TURNS turns queued already (nothing is stored).",
        responses={202: OutputSerializer, **error_responses(400, 401, 403, 404, 409, 413, 415, 429)},
        examples=[
            OpenApiExample(
                "refund", value={"text": "I'd like a refund for order 1042, it arrived damaged"}, request_only=True
            )
        ],
    )
    def post(self, request: Request, kind: str, name: str) -> Response:
        agent = visible_agent(request, kind, name)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            turn = services.message_send(agent=agent, user=user_of(request), text=serializer.validated_data["text"])
        except services.TooManyQueuedTurns as exc:
            return error_response("too_many_requests", str(exc), status.HTTP_429_TOO_MANY_REQUESTS)
        return Response(self.OutputSerializer(turn_detail_data(turn)).data, status=status.HTTP_202_ACCEPTED)


class AgentTurnApi(ApiBase):
    """GET /api/agents/<kind>/<name>/turns/<id>: a turn, its status and its answer so far."""

    query_methods = QUERY_ON_ALL

    OutputSerializer = TurnSerializer

    @extend_schema(
        operation_id="agent_turn_retrieve",
        tags=TAGS,
        parameters=[KIND, NAME, TURN_ID, AgentQuerySerializer],
        responses={200: OutputSerializer, **error_responses(400, 401, 404, 409)},
    )
    def get(self, request: Request, kind: str, name: str, turn_id: str) -> Response:
        # A turn is never of an agent that does not exist yet: asking for one creates nothing.
        turn = visible_turn(agent=visible_agent(request, kind, name, create=False), turn_id=turn_id)
        return Response(self.OutputSerializer(turn_detail_data(turn)).data)


class AgentTurnStopApi(ApiBase):
    """POST /api/agents/<kind>/<name>/turns/<id>/stop: cancel a queued or running turn, durably."""

    query_methods = QUERY_ON_ALL

    OutputSerializer = TurnSerializer

    @extend_schema(
        operation_id="agent_turn_stop",
        tags=TAGS,
        parameters=[KIND, NAME, TURN_ID, AgentQuerySerializer],
        request=None,
        description="No body, or an empty object. 200 with the turn, cancelled. 409 turn_ended (detail "
        "{status}) if it had already ended.",
        responses={200: OutputSerializer, **error_responses(400, 401, 403, 404, 409, 415)},
    )
    def post(self, request: Request, kind: str, name: str, turn_id: str) -> Response:
        # A turn is never of an agent that does not exist yet: asking for one creates nothing.
        turn = visible_turn(agent=visible_agent(request, kind, name, create=False), turn_id=turn_id)
        check_no_body(request)  # read once the caller may see the turn: to anyone else, only "not found"
        if turn.is_ended:
            return ended(turn)
        try:
            stopped = services.turn_stop(turn=turn, user=user_of(request))
        except services.TurnNotStoppable:
            turn.refresh_from_db()
            if turn.is_ended:  # it ended between the check and the lock
                return ended(turn)
            # It kept changing while being stopped: not "already ended"; a 409 that says try again.
            raise
        return Response(self.OutputSerializer(turn_detail_data(stopped)).data)


def ended(turn: Turn) -> Response:
    return error_response(
        "turn_ended",
        f"Turn {turn.number} has already ended ({turn.status}).",
        status.HTTP_409_CONFLICT,
        {"status": turn.status},
    )
