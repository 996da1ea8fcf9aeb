"""WebSocket consumers: thin. They authorise, send a snapshot from the database, then forward the
run's progress stream (``workflows.streams``) without a gap or a duplicate.

Protocol of ``/ws/runs/<id>/`` (also in docs/architecture.md#interfaces):

- server, first: ``{"type": "snapshot", "seq": S, "run": {...}}``. ``S`` is the stream's counter
  read *before* the database, so the snapshot reflects every event with ``seq <= S`` (events are
  published after their database change commits) and every event after ``S`` is sent live.
- server, live: stream events ``{"type": "progress" | "status" | "broadcast", "seq", "run", "data",
  "at"}`` in increasing ``seq``; an event missed by the channel layer is filled in from the stored
  stream before the next one.
- client: ``{"type": "resume", "after": N}`` -> the stored events with ``seq > N`` not yet sent on
  this connection, each with ``"replay": true``, then ``{"type": "replay_complete", "seq": H}``
  where H is the highest seq sent; live events follow.
- client: ``{"type": "snapshot"}`` -> a fresh snapshot (the page asks after a status change, to
  redraw the timeline).
- a client sending more than WEBSOCKET_MAX_FRAMES_PER_SECOND messages a second (in bursts of up
  to twice as many) gets ``{"type": "error", "message": "too many messages: ...", "retry_after":
  seconds, "about"?}`` for each one past it, which is not acted on; the connection stays open.
- bad client messages get ``{"type": "error", "message": ..., "about"?: "resume" | "snapshot"}``
  (``about``: the type of the message refused, when it was one of these); the connection stays open: a
  binary frame, text that is not JSON (or nested past the parser's limit), a message over
  MAX_MESSAGE_CHARS, a JSON value that is not an object, an unknown type, a bad ``after``. (Text
  that is not UTF-8, and a message over daphne's own size limit, never reach the consumer: daphne
  fails the connection, as the WebSocket protocol requires.)
- close codes: 4401 not authenticated, 4404 no such run *or* another user's run (indistinguishable).
- what connect checked is checked again while the socket is open (``StreamConsumer``): at once
  when the user's access changes (``workflows.access``: they sign out, are deactivated, change
  their password, leave an account), before every client message, and before a push at most every
  WEBSOCKET_RECHECK_SECONDS. A user signed out (the session gone), deactivated or whose password
  changed is closed with 4401; one who may no longer see the run (or the agent: removed from its
  account) with 4404.

Any other ``/ws/`` path (a malformed id, no trailing slash, no such socket) is accepted and closed
with 4404 by ``NotFoundConsumer``, signed in or not.
"""

from __future__ import annotations

import json
import logging
import re
import reprlib
import time
from dataclasses import dataclass, field
from importlib import import_module
from types import SimpleNamespace
from typing import Any
from uuid import UUID

import redis
from asgiref.sync import sync_to_async
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth import get_user

from workflows import access, streams
from workflows.selectors import run_get, run_snapshot

logger = logging.getLogger(__name__)

# Checked by their handlers themselves: a connect and a disconnect, and a change of access (now).
UNGUARDED = ("websocket.connect", "websocket.disconnect", access.MESSAGE_TYPE)
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
# Seqs skipped while waiting for a late live event; more than the stream keeps is pointless.
MAX_MISSING = 1000
# JSON numbers beyond this lose precision in browsers.
MAX_SEQ = 2**53
# Client messages are a few dozen characters; anything longer is refused before it is parsed
# (daphne's own limit, 1 MiB, is the one that closes the connection).
MAX_MESSAGE_CHARS = 4096
# The type of a message refused unread (past the frame budget), found without parsing it: a frame
# as the pages write it, its "type" first. Parsing a refused frame of tens of kilobytes would cost
# more than the refusal saves; a client that writes its type elsewhere is told nothing more.
LEADING_TYPE = re.compile(r'\s*\{\s*"type"\s*:\s*"([a-z_]{1,32})"')
# What an error message quotes of a client's value: a bounded repr (a 10,000-character "type" is
# not sent back, and a deeply nested one is not walked).
QUOTE = reprlib.Repr()
QUOTE.maxstring = QUOTE.maxother = 60
QUOTE.maxlevel = 2


@dataclass
class Cursor:
    """Which seqs of the stream one connection has sent.

    Every seq in ``(low, high]`` has been sent except those in ``missing`` (absent from the store
    when a later event was sent; still sent if they turn up). Nothing at or below ``low`` has been
    sent: the snapshot stands for it, and a resume asks for it explicitly.
    """

    low: int
    high: int
    missing: set[int] = field(default_factory=set)

    def was_sent(self, seq: int) -> bool:
        return self.low < seq <= self.high and seq not in self.missing

    def wants_live(self, seq: int) -> bool:
        """Live events at or below the snapshot are in it; above it, only what was not sent."""
        return seq > self.low and not self.was_sent(seq)

    def mark_sent(self, seq: int) -> None:
        if seq > self.high:
            self.missing.update(range(self.high + 1, seq))
            self.high = seq
            if len(self.missing) > MAX_MISSING:
                self.missing = set(sorted(self.missing)[-MAX_MISSING:])
        else:
            self.missing.discard(seq)


class NotFoundConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]  # channels has no types: its classes are Any
    """A socket path that matches no route: closed with 4404 like an unknown run, instead of the
    router's ValueError (an HTTP 500 and a logged traceback for a path anyone may send)."""

    # An alias with no configured layer: get_channel_layer() gives None, so no Redis channel is
    # opened for a socket that is closed at once.
    channel_layer_alias = "none: a refused socket needs no channel layer"

    async def connect(self) -> None:
        await self.accept()  # as in RunConsumer: a close code needs an accepted socket
        await self.close(code=CLOSE_NOT_FOUND, reason="not found")


class ClientError(Exception):
    """A message from the client that the protocol does not allow; answered, never fatal."""


class StreamConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]  # channels has no types: its classes are Any
    """The base of the project's sockets: channels' consumer without its per-message connection sweep.

    Since channels 4.2 ``AsyncConsumer.dispatch`` runs ``close_old_connections`` in the thread pool
    before every message it hands to a handler, for handlers that use the async ORM. A socket that
    streams gets a channel-layer message per pushed batch: with a hundred sockets on an agent that
    hop was the largest part of daphne's CPU (a profile of ``bench/chat.py``'s delivery phase put
    a quarter of it there), and delivery queued behind it. These consumers touch the database only
    through ``database_sync_to_async`` or a ``sync_to_async`` helper, and the former closes old
    connections on each visit itself; so a message goes straight to its handler.
    """

    # When what connect checked was last checked again (time.monotonic()); None until connect
    # accepted the user (a socket refused at connect is closing: nothing of it is guarded).
    authorized_at: float | None = None
    access_group: str | None = None  # the user's (workflows.access), joined once they are known

    frames: FrameBudget | None = None  # the client's, made with its first message
    client_types: tuple[str, ...] = ()  # the types of message a client may send (``receive_json``)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:  # however the socket ended, a handler's error included: its user's group is left
            if self.access_group is not None:
                await self.channel_layer.group_discard(self.access_group, self.channel_name)

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        if message["type"] == "websocket.receive" and self.authorized_at is None:
            # A socket connect refused, or closed since: it is closing, and its client's messages
            # are not read (channels hands a consumer its messages one at a time, so none is
            # handled before connect has ended).
            return
        if message["type"] == "websocket.receive" and not self.frame_allowed():
            # Before the re-check below: a flood costs the server no database visit.
            assert self.frames is not None  # made by frame_allowed, which only a budget refuses
            # What it was (a page gives back the text of a message refused), read from its start only.
            text = message.get("text")
            leading = LEADING_TYPE.match(text, 0, 64) if isinstance(text, str) else None
            about = self.about({"type": leading.group(1)}) if leading is not None else {}
            await self.send_json(
                {
                    "type": "error",
                    "message": f"too many messages: at most {self.frames.rate:g} a second; this one was not read",
                    "retry_after": max(round(1 / self.frames.rate, 3), 0.001),  # seconds until one more is read
                    **about,
                }
            )
            return
        if self.authorized_at is not None and message["type"] not in UNGUARDED:
            # A client's message is acted on only for who may still act; a push is forwarded
            # for a while on the last check, then checked again.
            if not await self.still_authorized(every_time=message["type"] == "websocket.receive"):
                return
        await handler(message)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        content = None
        try:
            content = parse_frame(text_data, max_chars=self.max_frame_chars())
            await self.receive_json(content)
        except ClientError as exc:
            await self.send_json({"type": "error", "message": str(exc), **self.about(content)})

    def about(self, content: Any) -> dict[str, str]:
        """``{"about": <type>}`` for an error answering a client's message of one of the socket's
        types, so that a page tells the refusal of its message from that of its resume; else {}."""
        kind = content.get("type") if isinstance(content, dict) else None
        return {"about": kind} if isinstance(kind, str) and kind in self.client_types else {}

    def max_frame_chars(self) -> int:
        """A client's message longer than this is refused unparsed."""
        return MAX_MESSAGE_CHARS

    def frame_allowed(self) -> bool:
        """Whether the client's message may be read (WEBSOCKET_MAX_FRAMES_PER_SECOND)."""
        rate = float(settings.WEBSOCKET_MAX_FRAMES_PER_SECOND)
        if rate <= 0:
            return True
        if self.frames is None:
            self.frames = FrameBudget(rate)
        return self.frames.take(time.monotonic())

    async def follow_access(self) -> None:
        """Call in connect once the user is known to be signed in, before what they may see is
        checked: a change of their access from then on reaches the socket (handled once connect
        has let them in, by ``access_changed``). The check after it reads the session again
        (``session_user``): the handshake read it before anything was pushed here."""
        self.access_group = access.group_name(self.scope["user"].pk)
        await self.channel_layer.group_add(self.access_group, self.channel_name)

    def authorized(self) -> None:
        """Call at the end of a connect that let the user in: from then on it is checked again."""
        self.authorized_at = time.monotonic()

    async def access_changed(self, message: dict[str, Any]) -> None:
        """The user's access changed (``workflows.access``): a sign-out of this socket's session
        closes it (the session may not be gone yet); anything else is checked now. Before connect
        let the user in, or once the socket is closing, there is nothing to do."""
        if self.authorized_at is None:
            return
        session = getattr(self.scope.get("session"), "session_key", None)
        signed_out = message.get("session")
        if signed_out is not None and session and signed_out == access.session_mark(session):
            self.authorized_at = None
            await self.close(code=CLOSE_UNAUTHENTICATED, reason="signed out")
            return
        await self.still_authorized(every_time=True)

    async def still_authorized(self, *, every_time: bool) -> bool:
        """Whether the socket's user is still signed in (the session as Django reads a request's:
        still there, the user active, the password unchanged) and may still see what connect let
        them see (``may_still_see``); otherwise the socket is closed (4401, 4404) and False.
        ``every_time``: check now, not only when the last check is WEBSOCKET_RECHECK_SECONDS old."""
        assert self.authorized_at is not None
        now = time.monotonic()
        if not every_time and now - self.authorized_at < float(settings.WEBSOCKET_RECHECK_SECONDS):
            return True
        refused = await database_sync_to_async(self._refusal)()  # one visit to the thread pool
        if refused is None:
            self.authorized_at = now
            return True
        self.authorized_at = None  # nothing more is forwarded, or acted on, on this socket
        await self.close(code=refused[0], reason=refused[1])
        return False

    def _refusal(self) -> tuple[int, str] | None:
        """Why the socket may no longer be used (its close code and reason), or None; the user as
        the session has them now is the scope's from here on."""
        user = session_user(self.scope)
        if user is None:
            return CLOSE_UNAUTHENTICATED, "signed out"
        if not self.may_still_see(user):
            return CLOSE_NOT_FOUND, "not found"
        self.scope["user"] = user
        return None

    def may_still_see(self, user: Any) -> bool:
        """Whether ``user`` may still see what the socket shows (in a thread: the ORM is allowed)."""
        raise NotImplementedError


class FrameBudget:
    """A token bucket: ``rate`` messages a second, in bursts of up to twice as many (at least one)."""

    def __init__(self, rate: float) -> None:
        self.rate, self.burst = rate, max(1.0, 2 * rate)
        self.tokens, self.at = self.burst, time.monotonic()

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def session_user(scope: dict[str, Any]) -> Any:
    """The socket's user as a request with its session would have them now, or None: signed out
    (the session deleted), deactivated, their password changed (the session's hash no longer
    matches), or another user's session."""
    session = scope.get("session")
    key = getattr(session, "session_key", None)
    if not key:
        return None
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=key)
    user = get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]  # all get_user reads
    connected = scope.get("user")
    if not user.is_authenticated or connected is None or user.pk != connected.pk:
        return None
    return user


class RunConsumer(StreamConsumer):
    """Snapshot, then the run's live events; ``resume`` replays what a reconnecting client missed."""

    run_id: UUID
    group: str | None = None
    cursor: Cursor | None = None  # set with the snapshot; nothing is forwarded before it
    client_types = ("resume", "snapshot")

    async def connect(self) -> None:
        # Accept first: a close code (4401, 4404) can only be sent on an accepted socket; a refusal
        # before accepting is an HTTP 403 the client cannot tell apart from a bad origin.
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED, reason="authentication required")
            return
        await self.follow_access()
        # The route takes the hyphenated form in either case (config/routing.py); UUID() normalises it.
        self.run_id = UUID(self.scope["url_route"]["kwargs"]["run_id"])
        # The session read again, now that a sign-out is pushed here: one since the handshake was not.
        refused = await database_sync_to_async(self._refusal)()
        if refused is not None:
            await self.close(code=refused[0], reason="run not found" if refused[0] == CLOSE_NOT_FOUND else refused[1])
            return
        # Join before reading the counter: every event with a higher seq is then delivered live.
        self.group = streams.group_name(self.run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        snapshot = await self._snapshot()
        if snapshot is None:  # deleted between the check and the read
            await self.channel_layer.group_discard(self.group, self.channel_name)
            self.group = None
            await self.close(code=CLOSE_NOT_FOUND, reason="run not found")
            return
        self.cursor = Cursor(low=snapshot["seq"], high=snapshot["seq"])
        await self.send_json(snapshot)
        self.authorized()

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    # --- from the client ---------------------------------------------------------------------------
    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            raise ClientError("a message is a JSON object with a 'type'")
        kind = content.get("type")
        if kind == "resume":
            await self._resume(check_after(content.get("after")))
        elif kind == "snapshot":
            snapshot = await self._snapshot()
            if snapshot is not None:
                await self.send_json(snapshot)
        else:
            raise ClientError(f"unknown message type {QUOTE.repr(kind)}; expected 'resume' or 'snapshot'")

    async def _resume(self, after: int) -> None:
        assert self.cursor is not None  # client messages are dispatched only after connect()
        try:
            stored = await sync_to_async(streams.events_after, thread_sensitive=False)(self.run_id, after)
        except redis.RedisError:
            logger.warning("replay for run %s failed", self.run_id, exc_info=True)
            raise ClientError("the event stream is unavailable; the snapshot is the current state") from None
        for event in stored:
            if not self.cursor.was_sent(event["seq"]):
                await self._send_event(event, replay=True)
        # From here on, everything after ``after`` counts as sent or missing, so a second resume
        # with the same ``after`` sends nothing twice.
        self.cursor.low = min(self.cursor.low, after)
        await self.send_json({"type": "replay_complete", "seq": self.cursor.high})

    # --- from the channel layer --------------------------------------------------------------------
    async def run_event(self, message: dict[str, Any]) -> None:
        """A live event. Channels dispatches one message at a time, so a live event that arrives
        during a replay waits in the channel layer and is handled here after it, never lost."""
        if self.cursor is None:
            return
        event: streams.StreamEvent = message["event"]
        seq = event["seq"]
        if not self.cursor.wants_live(seq):
            return
        if seq > self.cursor.high + 1:
            # The channel layer lost or reordered something (it is best effort): fill the gap from
            # the store; what is not stored yet is remembered and sent if it arrives late.
            for missed in await self._stored_between(self.cursor.high, seq - 1):
                if self.cursor.wants_live(missed["seq"]):
                    await self._send_event(missed)
        await self._send_event(event)

    async def _send_event(self, event: streams.StreamEvent, *, replay: bool = False) -> None:
        assert self.cursor is not None
        payload: dict[str, Any] = dict(event)
        if replay:
            payload["replay"] = True
        self.cursor.mark_sent(event["seq"])
        await self.send_json(payload)

    async def _stored_between(self, after: int, until: int) -> list[streams.StreamEvent]:
        try:
            return await sync_to_async(streams.events_after, thread_sensitive=False)(self.run_id, after, until=until)
        except redis.RedisError:
            logger.warning("gap fill for run %s failed", self.run_id, exc_info=True)
            return []

    # --- reads ---------------------------------------------------------------------------------------
    def may_still_see(self, user: Any) -> bool:
        return run_get(user=user, run_id=self.run_id) is not None

    @database_sync_to_async  # type: ignore[untyped-decorator]  # channels has no types
    def _snapshot(self) -> dict[str, Any] | None:
        seq = streams.current_seq(self.run_id)  # before the database: see the module docstring
        run = run_get(user=self.scope["user"], run_id=self.run_id)
        if run is None:
            return None
        return {"type": "snapshot", "seq": seq, "run": run_snapshot(run=run, user=self.scope["user"])}


def parse_frame(text_data: str | None, *, max_chars: int) -> Any:
    """A client's frame as JSON, or ClientError: a binary frame, one over ``max_chars`` (refused
    before it is parsed), or text that is not JSON (or nested past the parser's limit)."""
    if text_data is None:
        raise ClientError("messages are JSON text frames")
    if len(text_data) > max_chars:
        raise ClientError(f"a message is at most {max_chars} characters")
    try:
        return json.loads(text_data)
    except (ValueError, RecursionError):  # "[[[[..." deeper than the parser's recursion
        raise ClientError("the message is not valid JSON") from None


def check_after(value: Any) -> int:
    # bool is an int subclass; ``true`` is not a sequence number.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_SEQ:
        raise ClientError("'after' must be a non-negative integer sequence number")
    return value
