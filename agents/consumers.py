"""The chat socket ``/ws/agents/<kind>/<name>/`` (``?account=<slug>&since=<message id>``, both
optional): thin, like the runs socket (``workflows.consumers``). It authorises, sends a snapshot
from the database, forwards the agent's pushes (``agents.streams``) and hands the client's
messages to ``agents.services``; a turn never runs here.

Protocol:

- server, first: ``{"type": "snapshot", "agent", "messages", "since", "more", "state",
  "state_version", "turn", "queued", "stopped"}`` (``agents.selectors.agent_snapshot``). ``turn.seq`` is the
  active turn's highest stored seq, read after joining the agent's group: every chunk above it is
  sent live. With ``since``, the messages are only those after that message id: a page that
  reconnects names the newest message it has and gets what it missed, not the conversation again
  (a ``since`` that is not a whole number gets an ``error`` frame, then the whole snapshot).
- a client need not wait for the snapshot: frames it sends at once (a reconnecting page's
  ``resume``) are handled after it, in order.
- client: ``{"type": "message", "text"}`` -> a turn, answered with a ``turn`` frame (and the
  pushes every tab of the agent gets: ``message``, ``turn``).
- client: ``{"type": "resume", "turn": "<uuid>", "after": N}`` -> the turn's stored chunks with
  ``seq > N`` not yet sent on this connection, each with ``"replay": true``, then
  ``{"type": "replay_complete", "turn", "seq"}`` (the highest seq sent of that turn); live chunks
  follow. Works for a turn that has no chunk yet, and for an ended one.
- client: ``{"type": "stop", "turn"?}`` -> the turn (default: the running one) is cancelled.
- server, live: ``{"type": "chunk", "turn", "seq", "chunk_type", "data"}``, ``{"type": "turn",
  "id", "number", "status", "end_reason"}``, ``{"type": "message", "id", "turn", "role", "text",
  "parts", "created_at"}``, ``{"type": "state", "version", "state"}``, ``{"type": "fiber", "id",
  "name", "status", "stash_version", "attempts", "end_reason"}`` (a fiber of the agent changed status).
  A turn's status is never sent going back (``turn_stage``): a stop's answer leaves at once, and the
  worker's ``running`` pushed just before it may arrive after; nor the same frame twice (a tab's
  answer, then the push of it every tab gets).
- bad client messages get ``{"type": "error", "message", "about"?}`` (``about``: ``message``,
  ``resume`` or ``stop``, the type of the message refused, when it was one of these, so that the
  page gives back the text of a refused message only), the socket stays open and nothing is
  stored: a binary frame, text that is not JSON or over MAX_MESSAGE_CHARS, a value that is not an
  object, an unknown type, a field the type does not have (``FIELDS``), a bad ``after``, a turn
  that is not this agent's, an empty or too long text, a message past AGENTS_MAX_QUEUED_TURNS
  queued turns, a stop of an ended turn, a message past WEBSOCKET_MAX_FRAMES_PER_SECOND
  (``workflows.consumers.StreamConsumer``: not acted on, and answered with ``retry_after`` too, in
  seconds).
- close codes: 4401 not signed in; 4404 not a member of the account, an unknown account or kind
  (indistinguishable).
- a client that goes away (closes the tab, loses its network) stops nothing: its turns run on and a
  reconnect resumes them. Unless the agent's class says ``cancel_on_client_abort = True``: then the
  turns this connection's ``message`` frames started and that have not ended are stopped
  (``services.turn_stop``) when it disconnects, whoever else is watching them.

Per turn, a ``Cursor`` (the runs socket's) records what this connection sent: a chunk is never sent
twice, and a jump in ``seq`` (a push the channel layer lost) is filled from the database first.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from channels.db import database_sync_to_async
from django.conf import settings
from django.http import QueryDict
from django.urls.converters import UUIDConverter

from agents import selectors, services, streams
from agents.models import FIBER_ENDED, TURN_ACTIVE, TURN_OPEN, Agent, FiberStatus, Turn, TurnStatus
from agents.registry import get_agent_class
from agents.selectors import AgentSnapshot, ChunkData
from workflows.consumers import (
    CLOSE_NOT_FOUND,
    CLOSE_UNAUTHENTICATED,
    QUOTE,
    ClientError,
    Cursor,
    StreamConsumer,
    check_after,
    session_user,
)
from workflows.storable import text_problem

logger = logging.getLogger(__name__)

DEFAULT_MAX_TEXT_CHARS = 4000
# Chunks a replay reads at a time: a resume of a long turn sends its first chunks after one short
# read (REPLAY_FIRST_PAGE), then the rest in pages, each sent on its way before the next is read.
REPLAY_FIRST_PAGE = 20
REPLAY_PAGE = 200
# The fields of each message a client sends; any other is refused.
FIELDS = {
    "message": frozenset({"type", "text"}),
    "resume": frozenset({"type", "turn", "after"}),
    "stop": frozenset({"type", "turn"}),
}


def max_text_chars() -> int:
    """The longest message a customer may send (``AGENTS_MAX_MESSAGE_CHARS``)."""
    return int(getattr(settings, "AGENTS_MAX_MESSAGE_CHARS", DEFAULT_MAX_TEXT_CHARS))


def max_frame_chars() -> int:
    """A frame is refused unparsed above this: room for the longest text even if every character
    of it is sent as a 12-character JSON escape (a surrogate pair), plus the envelope. Daphne's own
    limit (1 MiB) is the one that closes the connection."""
    return 12 * max_text_chars() + 1024


class AgentConsumer(StreamConsumer):
    """Snapshot, then the agent's pushes; ``resume`` replays a turn's chunks a client missed."""

    agent: Agent
    group: str | None = None
    ready = False  # set with the snapshot; nothing is forwarded before it
    started: tuple[UUID, ...] = ()  # the turns this connection's messages started, oldest first
    client_types = ("message", "resume", "stop")

    async def connect(self) -> None:
        # Accept first: a close code can only be sent on an accepted socket (see RunConsumer).
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED, reason="authentication required")
            return
        await self.follow_access()
        query = QueryDict(self.scope.get("query_string", b"").decode("latin-1"))
        agent = await database_sync_to_async(self._agent_now)()
        if not isinstance(agent, Agent):
            await self.close(code=agent[0], reason=agent[1])
            return
        self.agent = agent
        self.cursors: dict[str, Cursor] = {}
        self.fibers: dict[str, tuple[bool, int, bool]] = {}  # fiber id -> the order of its last change sent
        self.turns_sent: dict[str, dict[str, Any]] = {}  # turn id -> the last frame of its status sent
        # Turns that had ended at the snapshot: their answers are in its messages, so their late
        # pushes are dropped (a resume still replays them on request).
        self.ended: set[str] = set()
        # Join before the snapshot's reads: every change after them is then pushed here.
        self.group = streams.group_name(agent.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        try:
            since = _check_since(query.getlist("since"))
        except ClientError as exc:
            await self.send_json({"type": "error", "message": str(exc)})
            since = None
        snapshot, newest = await self._snapshot(since)
        self.newest_number = newest
        self.open_at_snapshot = {turn["id"] for turn in snapshot["queued"]}
        if snapshot["turn"] is not None:
            seq = snapshot["turn"]["seq"]
            self.cursors[snapshot["turn"]["id"]] = Cursor(low=seq, high=seq)
        self.state_version = snapshot["state_version"]
        self.ready = True
        await self.send_json({"type": "snapshot", **snapshot})
        self.authorized()

    def may_still_see(self, user: Any) -> bool:
        """Still a member of the agent's account (its agent the one this socket shows)."""
        agent = self._agent_for(user)
        return agent is not None and agent.pk == self.agent.pk

    def _agent_now(self) -> Agent | tuple[int, str]:
        """The agent for the user as their session has them now (read again: a sign-out since the
        handshake was pushed to no one), else why not (the close code and reason)."""
        user = session_user(self.scope)
        if user is None:
            return CLOSE_UNAUTHENTICATED, "signed out"
        self.scope["user"] = user
        agent = self._agent_for(user)
        return (CLOSE_NOT_FOUND, "agent not found") if agent is None else agent

    def _agent_for(self, user: Any) -> Agent | None:
        """The agent the socket's path (and ``?account=``) names, as ``user`` reaches it. A socket
        never creates one: the chat page opens its socket for an agent that exists (its "Start it"
        button, a POST, creates a new one)."""
        kwargs = self.scope["url_route"]["kwargs"]
        accounts = QueryDict(self.scope.get("query_string", b"").decode("latin-1")).getlist("account")
        if len(accounts) > 1:
            return None  # which one was meant? Not found, as for an account the user is not in
        account = accounts[0] if accounts else None
        return selectors.agent_get(user=user, kind=kwargs["kind"], name=kwargs["name"], account=account, create=False)

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self.started:
            await database_sync_to_async(self._abort_started)()

    def _abort_started(self) -> None:
        """The client went away: stop the turns it started if the agent's class asks for it."""
        cls = get_agent_class(self.agent.kind)
        if cls is None or not cls.cancel_on_client_abort:
            return
        for turn in Turn.objects.filter(pk__in=self.started, status__in=TURN_OPEN).select_related("agent"):
            try:
                services.turn_stop(turn=turn, user=self.scope["user"])
            except services.TurnNotStoppable:  # it ended meanwhile
                pass

    # --- from the client ---------------------------------------------------------------------------
    def max_frame_chars(self) -> int:
        return max_frame_chars()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            raise ClientError("a message is a JSON object with a 'type'")
        kind = content.get("type")
        if kind in FIELDS and (unknown := sorted(set(content) - FIELDS[kind])):
            # Refused, as the API refuses them: a misspelt field is a mistake, not a default (a stop
            # with "turn_id" would otherwise stop whichever turn runs).
            named = ", ".join(QUOTE.repr(str(name)) for name in unknown[:5])
            expected = ", ".join(sorted(FIELDS[kind]))
            raise ClientError(f"unknown field(s) {named} in a {kind!r}; its fields are {expected}")
        if kind == "message":
            await self._message(_check_text(content.get("text")))
        elif kind == "resume":
            await self._resume(_check_turn_id(content.get("turn")), check_after(content.get("after")))
        elif kind == "stop":
            await self._stop(content.get("turn"))
        else:
            raise ClientError(f"unknown message type {QUOTE.repr(kind)}; expected 'message', 'resume' or 'stop'")

    async def _message(self, text: str) -> None:
        turn = await database_sync_to_async(self._send_message)(text)
        self.started = (*self.started, turn.pk)
        await self._send_turn(selectors.turn_data(turn))

    def _send_message(self, text: str) -> Turn:
        try:
            return services.message_send(agent=self.agent, user=self.scope["user"], text=text)
        except (services.InvalidMessage, services.TooManyQueuedTurns) as exc:
            raise ClientError(str(exc)) from None

    async def _stop(self, value: Any) -> None:
        turn = await (self._turn(value) if value is not None else self._running_turn())
        if turn.is_ended:
            raise ClientError(f"turn {turn.number} has already ended ({turn.status})")
        stopped = await database_sync_to_async(self._stop_turn)(turn)
        await self._send_turn(selectors.turn_data(stopped))

    def _stop_turn(self, turn: Turn) -> Turn:
        try:
            return services.turn_stop(turn=turn, user=self.scope["user"])
        except services.TurnNotStoppable as exc:  # it ended between the check and the lock
            raise ClientError(str(exc)) from None

    async def _running_turn(self) -> Turn:
        turn: Turn | None = await database_sync_to_async(selectors.turn_active)(agent=self.agent)
        if turn is None:
            raise ClientError("no turn is running")
        return turn

    async def _turn(self, value: Any) -> Turn:
        """The agent's turn named by a client's ``turn``; another agent's and a missing one alike
        are an error."""
        turn_id = _check_turn_id(value)
        turn: Turn | None = await database_sync_to_async(selectors.turn_get)(agent=self.agent, turn_id=turn_id)
        if turn is None:
            raise ClientError(f"no such turn {QUOTE.repr(str(turn_id))}")
        return turn

    async def _resume(self, turn_id: UUID, after: int) -> None:
        key = str(turn_id)
        cursor = self.cursors.get(key)
        # What this socket sent already is not read again: a resume asked over and over costs one
        # short read, not the whole turn's (``after``'s own chunks, at or below it, are never read).
        sent_to = None
        if cursor is not None and cursor.low <= after and not any(seq > after for seq in cursor.missing):
            sent_to = cursor.high
        after, page = await self._replay_start(turn_id, after, sent_to=sent_to)
        if cursor is None:
            cursor = self.cursors[key] = Cursor(low=after, high=after)
            self.ended.discard(key)
        # In pages: the first replayed chunks leave after one short read, not after the whole turn's,
        # and each page is on its way (the server writes frames when this coroutine yields) before
        # the next is read.
        size = REPLAY_FIRST_PAGE
        while True:
            for chunk in page:
                if not cursor.was_sent(chunk["seq"]):
                    await self._send_chunk(key, cursor, chunk, replay=True)
            if len(page) < size:
                break
            await asyncio.sleep(0)
            size = REPLAY_PAGE
            page = await self._stored(key, page[-1]["seq"], limit=size)
        # Everything after ``after`` now counts as sent or missing: the same resume twice sends nothing twice.
        cursor.low = min(cursor.low, after)
        await self.send_json({"type": "replay_complete", "turn": key, "seq": cursor.high})

    # --- from the channel layer --------------------------------------------------------------------
    async def agent_chunks(self, message: dict[str, Any]) -> None:
        """A batch of one turn's chunks. Channels handles one message at a time, so a batch that
        arrives during a replay waits and is handled after it, never lost."""
        if not self.ready:
            return
        key = str(message["turn"])
        cursor = self._cursor(key, message["number"])
        if cursor is None:
            return
        for chunk in message["chunks"]:
            seq = chunk["seq"]
            if not cursor.wants_live(seq):
                continue
            if seq > cursor.high + 1:
                # A push the channel layer lost (it is best effort): the store has what came before.
                for missed in await self._stored(key, cursor.high, until=seq - 1):
                    if cursor.wants_live(missed["seq"]):
                        await self._send_chunk(key, cursor, missed)
            await self._send_chunk(key, cursor, chunk)

    async def agent_turn(self, message: dict[str, Any]) -> None:
        if self.ready:
            await self._send_turn(message["turn"])

    async def _send_turn(self, turn: Mapping[str, Any]) -> None:
        """A turn's status, unless one of a later stage of its life was sent already (this socket's
        answer to a ``stop`` leaves at once, while the worker's ``running``, pushed just before it,
        may still be on its way through the channel layer; a turn never starts again once ended),
        or the same frame was (the push every tab gets of this socket's own answer)."""
        frame = {"type": "turn", **turn}
        sent = self.turns_sent.get(turn["id"])
        if sent is not None and (frame == sent or turn_stage(turn["status"]) < turn_stage(sent["status"])):
            return
        self.turns_sent[turn["id"]] = frame
        await self.send_json(frame)

    async def agent_message(self, message: dict[str, Any]) -> None:
        if self.ready:
            await self.send_json({"type": "message", **message["message"]})

    async def agent_state(self, message: dict[str, Any]) -> None:
        """The agent's state; an older version than one already sent (pushes from two writers can
        cross) is dropped."""
        if self.ready and message["version"] > self.state_version:
            self.state_version = message["version"]
            await self.send_json({"type": "state", "version": message["version"], "state": message["state"]})

    async def agent_fiber(self, message: dict[str, Any]) -> None:
        """A fiber of the agent changed status (``agents.fibers``). A change of an earlier stage of
        its life than one already sent is dropped: the process that started the fiber pushes
        ``pending`` and the worker that runs it ``running``, and pushes from two processes can cross."""
        if not self.ready:
            return
        fiber = message["fiber"]
        order = fiber_order(fiber)
        if order < self.fibers.get(fiber["id"], (False, -1, False)):
            return  # (one of the same order goes on: a cancel's reason after its run's terminate)
        self.fibers[fiber["id"]] = order
        await self.send_json({"type": "fiber", **fiber})

    def _cursor(self, key: str, number: int) -> Cursor | None:
        """The turn's cursor; a turn met for the first time starts one from seq 0 if it started after
        the snapshot (or was queued then), and none if it had ended by then. The push names the
        turn's number, so this reads nothing: a turn's first chunk reaches every socket at once."""
        cursor = self.cursors.get(key)
        if cursor is not None or key in self.ended:
            return cursor
        if number <= self.newest_number and key not in self.open_at_snapshot:
            self.ended.add(key)
            return None
        cursor = self.cursors[key] = Cursor(low=0, high=0)
        return cursor

    async def _send_chunk(self, turn: str, cursor: Cursor, chunk: ChunkData, *, replay: bool = False) -> None:
        frame: dict[str, Any] = {
            "type": "chunk",
            "turn": turn,
            "seq": chunk["seq"],
            "chunk_type": chunk["type"],
            "data": chunk["data"],
        }
        if replay:
            frame["replay"] = True
        cursor.mark_sent(chunk["seq"])
        await self.send_json(frame)

    # --- reads ---------------------------------------------------------------------------------------
    @database_sync_to_async  # type: ignore[untyped-decorator]  # channels has no types
    def _replay_start(self, turn_id: UUID, after: int, *, sent_to: int | None = None) -> tuple[int, list[ChunkData]]:
        """The check that the turn is the agent's, ``after`` as the replay takes it, and the first
        page after it (after ``sent_to`` if this socket sent everything up to there), in one
        database visit (each is a hop to the ORM's thread and a connection borrowed from the pool).
        An ``after`` beyond what is stored (a stale number of the client's own) counts as the stored
        top: taken as given, every live chunk up to it would count as already sent."""
        found = selectors.turn_with_seq(agent=self.agent, turn_id=turn_id)
        if found is None:
            raise ClientError(f"no such turn {QUOTE.repr(str(turn_id))}")
        after = min(after, found[1])
        read_from = after if sent_to is None else min(max(after, sent_to), found[1])
        return after, selectors.chunks_after(turn_id=turn_id, after=read_from, limit=REPLAY_FIRST_PAGE)

    async def _stored(
        self, turn: str, after: int, *, until: int | None = None, limit: int | None = None
    ) -> list[ChunkData]:
        return await database_sync_to_async(selectors.chunks_after)(  # type: ignore[no-any-return]
            turn_id=turn, after=after, until=until, limit=limit
        )

    @database_sync_to_async  # type: ignore[untyped-decorator]  # channels has no types
    def _snapshot(self, since: int | None) -> tuple[AgentSnapshot, int]:
        return selectors.agent_snapshot_numbered(agent=self.agent, since=since)


def _check_turn_id(value: Any) -> UUID:
    """A turn's id as the API's paths write it (lower-case, hyphenated): UUID() alone would also take
    braces, "urn:uuid:" or no hyphens, which no URL of the API accepts."""
    if not isinstance(value, str) or re.fullmatch(UUIDConverter.regex, value) is None:
        raise ClientError("'turn' must be a turn's id")
    return UUID(value)


def turn_stage(status: str) -> int:
    """Where a turn's status comes in its life: queued, then running or waiting (back and forth, as
    it waits for approvals), then ended."""
    return 0 if status == TurnStatus.QUEUED else 1 if status in TURN_ACTIVE else 2


def fiber_order(fiber: dict[str, Any]) -> tuple[bool, int, bool]:
    """Where a change of a fiber's status comes in its life: pending, then running once per
    attempt, then ended."""
    return (fiber["status"] in FIBER_ENDED, int(fiber["attempts"]), fiber["status"] != FiberStatus.PENDING)


def _check_since(values: list[str]) -> int | None:
    """The ``since`` of the socket's query string: a message id (digits) once, or absent."""
    if not values:
        return None
    if len(values) > 1:
        raise ClientError("'since' is given more than once; give it once")
    if (since := selectors.message_id(values[0])) is None:
        raise ClientError("'since' must be a message id")
    return since


def _check_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ClientError("'text' must be a non-empty string")
    if len(value) > max_text_chars():
        raise ClientError(f"'text' is at most {max_text_chars()} characters")
    problem = text_problem(value)
    if problem is not None:
        raise ClientError(f"'text' contains {problem}")
    return value
