"""A turn's stream over Server-Sent Events, in the shape of the AI SDK UI message stream:
``GET /api/agents/<kind>/<name>/turns/<id>/stream``.

Each stored chunk is one event with ``id: <seq>``, so a client that reconnects with
``Last-Event-ID: N`` gets the chunks after N and nothing twice; the stream ends with
``data: [DONE]`` after the turn's ``finish`` chunk (or at once if the turn ended without one). A
turn that ended long ago may have no stream left (``manage.py agents purge-chunks``): from the
start, it is its answer whole, in one text part without ids, then its finish. The
AI SDK's text parts open and close (``text-start``, ``text-end``): those events are derived here,
carry no id, and a resumed stream opens its text part again.

How it follows a live turn: the database is read (chunks with ``seq`` above the last sent, in
order, so nothing is skipped or repeated whatever the channel layer does), and the agent's group is
only a wake-up: the view joins it before its first read, so a chunk committed after any read wakes
it, and a lost push costs at most ``POLL_SECONDS`` of latency, never a chunk. Polling alone would
cost each open stream a query (and, in daphne, a connection) every 100 ms.

An async view (daphne serves it) outside DRF, as DRF's views cannot stream asynchronously: it
authenticates as the API does (a ``Token`` header or the session) and answers errors in the API's
shape. A client that goes away cancels the response; the group is left on the way out.

Database connections: an open stream holds none while it waits. Every visit goes through
``database_sync_to_async`` in the request's own thread, which gives the connection back to daphne's
pool after it (``CONN_MAX_AGE`` is 0 there), the checks before the stream included. Reads in
threads of their own kept a pooled connection each for good, and a stream held its request's until
it ended: twenty streams opened at once took every connection of the pool and waited for one
another. A read that fails ends the stream (the client resumes with ``Last-Event-ID``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from rest_framework.authtoken.models import Token

from agents import selectors, streams
from agents.apis import AgentQuerySerializer
from agents.models import TURN_ENDED, TURN_FINISH_REASONS, Agent, Turn
from agents.selectors import ChunkData
from workflows.apis.common import repeated_parameters
from workflows.apis.errors import error_body
from workflows.consumers import MAX_SEQ
from workflows.storable import text_problem

# How long the stream waits for a push before it reads the database anyway.
POLL_SECONDS = 1.0
# An idle stream sends a comment this often: proxies keep it open, and a gone client is noticed.
KEEPALIVE_SECONDS = 15.0
TEXT_PART = "text"
TOKEN_KEY_MAX = 40  # rest_framework.authtoken.models.Token.key
logger = logging.getLogger("agents")


def error(code: str, message: str, http_status: int, detail: Any = None) -> JsonResponse:
    return JsonResponse(error_body(code, message, detail), status=http_status)


@csrf_exempt  # it only reads: a POST gets the API's JSON 405 below, not the CSRF check's HTML page
async def turn_stream(request: HttpRequest, kind: str, name: str, turn_id: str) -> HttpResponseBase:
    if request.method != "GET":
        return error("method_not_allowed", f'Method "{request.method}" not allowed.', 405)
    user = await _authenticated(request)
    if user is None:
        refused = error("not_authenticated", "Authentication credentials were not provided.", 401)
        refused["WWW-Authenticate"] = "Token"
        return refused
    after = _last_event_id(request)
    if after is None:
        return error("invalid", "Last-Event-ID must be a non-negative integer (a seq this stream sent).", 400)
    # The query as the turn's API reads it: ?account= once, nothing else (a 400 otherwise).
    problems = repeated_parameters(request.GET)
    params = AgentQuerySerializer(data=request.GET.dict())
    if problems or not params.is_valid():
        return error("invalid", "The request is not valid.", 400, problems or params.errors)
    # After it the request's connection (the session, the user, the agent) is back in the pool.
    account = params.validated_data.get("account")
    found = await database_sync_to_async(_visible_turn)(user, kind, name, turn_id, account)
    if found is None:
        return error("not_found", "Not found.", 404)
    agent, turn = found
    response = StreamingHttpResponse(events(agent=agent, turn=turn, after=after), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    response["x-vercel-ai-ui-message-stream"] = "v1"
    return response


async def _authenticated(request: HttpRequest) -> AbstractBaseUser | None:
    """The caller as the API finds them (``workflows.apis.common.ApiBase``: the token, then the
    session). ``Authorization: Token <key>`` is read as DRF's TokenAuthentication reads it (split
    at ASCII whitespace, the keyword in any case, the key as UTF-8: any key a token can have, one
    staff typed in the admin too), and a bad one is refused whatever the session; a header of
    another scheme is left for the session."""
    parts = request.headers.get("Authorization", "").encode("latin-1").split()
    if parts and parts[0].lower() == b"token":
        try:
            key = parts[1].decode() if len(parts) == 2 else ""
        except UnicodeDecodeError:
            return None
        if not key or not _storable_key(key):
            return None
        token = await Token.objects.select_related("user").filter(key=key).afirst()
        return token.user if token is not None and token.user.is_active else None
    user = await request.auser()
    return None if isinstance(user, AnonymousUser) or not user.is_authenticated else user


def _storable_key(key: str) -> bool:
    """A key a token row can hold (at most 40 characters PostgreSQL can store): anything else
    matches no token, and is not sent to the database."""
    return len(key) <= TOKEN_KEY_MAX and text_problem(key) is None


def _last_event_id(request: HttpRequest) -> int | None:
    value = request.headers.get("Last-Event-ID", "").strip()
    if not value:
        return 0
    if not value.isascii() or not value.isdigit() or int(value) >= MAX_SEQ:
        return None
    return int(value)


def _visible_turn(
    user: AbstractBaseUser, kind: str, name: str, turn_id: str, account: str | None
) -> tuple[Agent, Turn] | None:
    try:
        parsed = UUID(turn_id)
    except ValueError:
        return None
    if str(parsed) != turn_id.lower():
        return None
    # A stream is of a turn, and a new agent has none: following one never creates the agent.
    agent = selectors.agent_get(user=user, kind=kind, name=name, account=account, create=False)  # type: ignore[arg-type]
    turn = selectors.turn_get(agent=agent, turn_id=parsed) if agent is not None else None
    return (agent, turn) if agent is not None and turn is not None else None


def _read(turn_id: UUID, after: int) -> tuple[list[ChunkData], bool]:
    """The chunks after ``after`` and whether the turn had ended before they were read (then they
    are all there is)."""
    status = Turn.objects.filter(pk=turn_id).values_list("status", flat=True).first()
    return selectors.chunks_after(turn_id=turn_id, after=after), status is None or status in TURN_ENDED


async def events(*, agent: Agent, turn: Turn, after: int) -> AsyncIterator[str]:
    layer = get_channel_layer()
    group = streams.group_name(agent.pk)
    channel = await layer.new_channel() if layer is not None else None
    if layer is not None:
        await layer.group_add(group, channel)
    text_open = False
    last = after
    quiet_since = time.monotonic()
    try:
        while True:
            try:
                chunks, ended = await database_sync_to_async(_read)(turn.pk, last)
            except DatabaseError:
                logger.warning("stream of turn %s ended: its read failed", turn.pk, exc_info=True)
                return
            for chunk in chunks:
                for event in ui_events(chunk, turn_id=str(turn.pk), text_open=text_open):
                    yield event
                text_open = chunk["type"] == "text-delta"
                last = chunk["seq"]
                if chunk["type"] == "finish":
                    yield "data: [DONE]\n\n"
                    return
            if ended and not chunks:
                if text_open:
                    yield _event(None, {"type": "text-end", "id": TEXT_PART})
                elif last == 0:  # an ended turn with no stream at all: purged, or it never had one
                    for event in await database_sync_to_async(_answer_events)(turn.pk):
                        yield event
                yield "data: [DONE]\n\n"
                return
            # Seconds, not wake-ups: pushes for the agent's other turns wake the stream too.
            if chunks or time.monotonic() - quiet_since >= KEEPALIVE_SECONDS:
                if not chunks:
                    yield ": keep-alive\n\n"
                quiet_since = time.monotonic()
            await _wake(layer, channel)
    finally:
        if layer is not None:
            await layer.group_discard(group, channel)


def _answer_events(turn_id: UUID) -> list[str]:
    """The answer of an ended turn whose stream is gone (``manage.py agents purge-chunks``), as one
    stream without ids: its text whole, then its finish. Its tool calls went with the stream. None
    for a turn without text (one cancelled before it ran never streamed)."""
    row = Turn.objects.filter(pk=turn_id).values_list("status", "text").first()
    if row is None or not row[1]:
        return []
    status, text = row
    return [
        _event(None, {"type": "start", "messageId": str(turn_id)}),
        _event(None, {"type": "text-start", "id": TEXT_PART}),
        _event(None, {"type": "text-delta", "id": TEXT_PART, "delta": text}),
        _event(None, {"type": "text-end", "id": TEXT_PART}),
        _event(None, {"type": "finish", "messageMetadata": {"reason": TURN_FINISH_REASONS.get(status, status)}}),
    ]


async def _wake(layer: Any, channel: str | None) -> None:
    """Wait for any push to the agent's group (or POLL_SECONDS): only a hint to read again."""
    if layer is None or channel is None:
        await asyncio.sleep(POLL_SECONDS)
        return
    try:
        await asyncio.wait_for(layer.receive(channel), timeout=POLL_SECONDS)
    except TimeoutError:
        pass


def ui_events(chunk: ChunkData, *, turn_id: str, text_open: bool) -> list[str]:
    """The SSE events of one stored chunk, in the AI SDK UI message stream's shape."""
    type_, data, seq = chunk["type"], chunk["data"], chunk["seq"]
    fields = data if isinstance(data, dict) else {}
    before: list[str] = []
    if type_ == "text-delta":
        if not text_open:
            before.append(_event(None, {"type": "text-start", "id": TEXT_PART}))
        return [*before, _event(seq, {"type": "text-delta", "id": TEXT_PART, "delta": fields.get("delta", "")})]
    if text_open:
        before.append(_event(None, {"type": "text-end", "id": TEXT_PART}))
    if type_ == "start":
        payload: dict[str, Any] = {"type": "start", "messageId": turn_id}
    elif type_ == "finish":
        payload = {"type": "finish", "messageMetadata": {"reason": fields.get("reason", "")}}
    elif type_.startswith("data-"):
        payload = {"type": type_, "data": data}
    else:  # tool-input-available, tool-output-available: stored in the stream's own shape
        payload = {**fields, "type": type_}
    return [*before, _event(seq, payload)]


def _event(seq: int | None, payload: dict[str, Any]) -> str:
    text = json.dumps(payload, separators=(",", ":"))
    return f"data: {text}\n\n" if seq is None else f"id: {seq}\ndata: {text}\n\n"
