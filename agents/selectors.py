"""Reads of agents, turns, messages and chunks, with tenancy: a user reaches an agent only through
an account they are a member of; anyone else gets None (the callers' 404 and close 4404).

The shapes returned here are the ones the socket, the HTTP API and the pushes of ``agents.streams``
send, so a client renders a snapshot, a replay and a live push with the same code.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from typing import Any, TypedDict
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.db.models import Max, OuterRef, QuerySet, Subquery

from accounts.models import Account
from accounts.selectors import User, account_for, accounts_of
from agents import statements
from agents.models import TURN_ACTIVE, TURN_OPEN, Agent, Chunk, Message, MessageRole, Submission, Turn, TurnStatus
from agents.registry import get_agent_class
from workflows.apis.converters import NameConverter
from workflows.storable import text_problem

# The columns' lengths (models.Agent): a longer kind or name names no agent, and is not sent to
# PostgreSQL (a DataError there would be a 500 for a path anyone may type).
KIND_MAX = Agent._meta.get_field("kind").max_length or 64
NAME_MAX = Agent._meta.get_field("name").max_length or 128
# Messages a snapshot carries: the newest ones (the page shows a conversation, not an archive).
SNAPSHOT_MESSAGES = 200
# ... and at most this many bytes of them as JSON (non-ASCII text escaped, as it travels), so a
# snapshot always fits the channel layer's and daphne's 1 MiB message limits.
SNAPSHOT_BYTES = 512 * 1024


class ChunkData(TypedDict):
    seq: int
    type: str
    data: Any


class TurnData(TypedDict):
    id: str
    number: int
    status: str
    end_reason: str


class MessageData(TypedDict):
    id: int
    turn: str | None
    role: str
    text: str
    parts: Any
    created_at: str  # ISO 8601: the same text in a snapshot, a push and the API


class ActiveTurn(TypedDict):
    id: str
    number: int
    status: str
    seq: int


class AgentSnapshot(TypedDict):
    agent: dict[str, str]
    messages: list[MessageData]
    since: int | None
    more: bool
    state: Any
    state_version: int
    turn: ActiveTurn | None
    queued: list[TurnData]
    stopped: list[TurnData]


def message_id(value: str) -> int | None:
    """A message id written in a query string (``since``): 1 to 18 ASCII digits, else None. The socket
    and the API read it alike (int() would also take "١", " 1" or "1_0", and DRF "1.0")."""
    if 0 < len(value) <= 18 and value.isascii() and value.isdigit():
        return int(value)
    return None


def kind_registered(kind: str) -> bool:
    """Whether ``kind`` names a registered ChatAgent class."""
    return get_agent_class(kind) is not None


class TooManyAgents(Exception):
    """A member opened a new agent in an account that has AGENTS_MAX_AGENTS_PER_ACCOUNT already: a
    409 ``too_many_agents`` (the chat page says so too). Only a member is told: anyone else is
    answered as for an agent that does not exist."""

    code = "too_many_agents"


def agent_get(*, user: User, kind: str, name: str, account: str | None = None, create: bool = True) -> Agent | None:
    """The agent ``(account, kind, name)`` for a member of the account, created on first use for a
    registered kind (unless ``create`` is false: then None, as if it could not be). None for a
    non-member, an unknown account or kind, or a name no agent can have: the same answer for each,
    so it confirms nothing. TooManyAgents for a new name in an account at its limit."""
    if not user.is_authenticated or not addressable(kind, name, account):
        return None
    # The agent and its account in one query (every socket's connect asks); creating one takes more.
    agent = statements.member_agent(user=user, kind=kind, name=name, account=account)
    if agent is not None or not create:
        return agent
    found = account_for(user, account)
    return None if found is None else _agent_create(found, kind, name)


def agent_openable(*, user: User, kind: str, name: str, account: str | None = None) -> Account | None:
    """The account in which ``user`` may open the agent ``kind``/``name`` that ``agent_get(...,
    create=False)`` did not find: theirs, for a registered kind and a name an agent can have. None
    where ``agent_get`` would answer None, so the two together confirm nothing to a non-member."""
    return account_for(user, account) if user.is_authenticated and addressable(kind, name, account) else None


def addressable(kind: str, name: str, account: str | None = None) -> bool:
    """Whether ``(account, kind, name)`` can name an agent at all."""
    if not _storable_name(kind, KIND_MAX) or not _storable_name(name, NAME_MAX):
        return False
    if account is not None and text_problem(account) is not None:
        return False
    return kind_registered(kind)


def _agent_create(found: Account, kind: str, name: str) -> Agent:
    # Opening an agent creates it, so the count per account is bounded: past the limit a new name
    # is refused, saying why (the account's existing agents stay reachable). The account's row is
    # locked while it counts and creates: members opening new names at once cannot pass it together.
    limit = int(settings.AGENTS_MAX_AGENTS_PER_ACCOUNT)
    with transaction.atomic():
        Account.objects.select_for_update().filter(pk=found.pk).first()
        agent = Agent.objects.filter(account=found, kind=kind, name=name).first()
        if agent is None:
            if Agent.objects.filter(account=found).count() >= limit:
                raise TooManyAgents(
                    f"The account {found.slug!r} has {limit} agents, its limit: open one of them, or ask staff "
                    "to remove some (AGENTS_MAX_AGENTS_PER_ACCOUNT)."
                )
            agent = Agent.objects.create(account=found, kind=kind, name=name)
    agent.account = found  # read already: the snapshot's agent.account.slug costs no query
    return agent


# Unicode categories of characters a name must not have: controls, format characters (bidirectional
# overrides, zero-width ones, the byte-order mark), line and paragraph separators.
UNSEEN = frozenset({"Cc", "Cf", "Zl", "Zp"})
# Characters of other categories that are drawn as nothing: Hangul fillers, the blank Braille
# pattern, the combining grapheme joiner, Khmer's inherent vowels.
BLANK = frozenset("\u115f\u1160\u3164\uffa0\u2800\u034f\u17b4\u17b5")
# The joiners that writing needs between two characters (emoji sequences, Persian and Indic text):
# allowed there, never beside a space, an ASCII character or another unseen one.
JOINERS = frozenset("\u200c\u200d")
# What a name is, in words, for every refusal that says so.
NAME_RULE = (
    f"1 to {NAME_MAX} characters, without '/', not '.' or '..', no space at either end and nothing "
    "that is not written (controls, zero-width or right-to-left marks)"
)


def _unseen(value: str) -> bool:
    """Whether ``value`` has a character that is not written: in UNSEEN or BLANK, or a joiner that
    does not join two written non-ASCII characters."""
    for i, character in enumerate(value):
        if character in BLANK:
            return True
        if unicodedata.category(character) not in UNSEEN:
            continue
        if character not in JOINERS or i == 0 or i == len(value) - 1:
            return True
        for neighbour in (value[i - 1], value[i + 1]):
            if neighbour.isascii() or neighbour.isspace() or unicodedata.category(neighbour) in UNSEEN:
                return True
    return False


def _storable_name(value: str, limit: int) -> bool:
    """1 to ``limit`` characters PostgreSQL can store, none of them U+FFFD: a path's bytes that
    are not UTF-8 decode to it, and different such paths must not all name one agent. Not ``.``
    or ``..`` either: a browser, and most HTTP clients, resolve them out of a path, so an agent so
    named could be created (by a client that sends the path as it is) and never opened again.
    Nothing that is not written either (a right-to-left override, a zero-width space, a control),
    nor space at either end: a name the account's other members read must be what it says (a
    name shown as "exe.jpg" that is "gpj.exe", two names that look the same)."""
    return (
        0 < len(value) <= limit
        and value not in (".", "..")
        and value == value.strip()
        and text_problem(value) is None
        and "\ufffd" not in value
        and not _unseen(value)
    )


def reachable_name(value: str) -> bool:
    """A name an agent can have and a path can name (``manage.py agents submit`` checks its --name)."""
    return re.fullmatch(NameConverter.regex, value) is not None and _storable_name(value, NAME_MAX)


def turn_get(*, agent: Agent, turn_id: UUID | str) -> Turn | None:
    """The turn if it is ``agent``'s (another agent's turn, or no id at all, is None like a missing one)."""
    try:
        return Turn.objects.filter(agent=agent, pk=UUID(str(turn_id))).first()
    except ValueError:
        return None


def turn_active(*, agent: Agent) -> Turn | None:
    """The agent's running (or waiting) turn: at most one is open at a time past the queue."""
    return Turn.objects.filter(agent=agent, status__in=TURN_ACTIVE).order_by("number").first()


def chunks_after(
    *, turn_id: UUID | str, after: int, until: int | None = None, limit: int | None = None
) -> list[ChunkData]:
    """The turn's stored chunks with ``after < seq <= until``, in order; the first ``limit`` of them."""
    chunks = Chunk.objects.filter(turn_id=turn_id, seq__gt=after)
    if until is not None:
        chunks = chunks.filter(seq__lte=until)
    rows = chunks.order_by("seq").values_list("seq", "type", "data")
    if limit is not None:
        rows = rows[:limit]
    return [{"seq": seq, "type": type_, "data": data} for seq, type_, data in rows]


# The highest stored seq of the turn of each row (the (turn, seq) index's last entry).
_TOP_SEQ = Subquery(Chunk.objects.filter(turn_id=OuterRef("pk")).order_by("-seq").values("seq")[:1])


def turn_with_seq(*, agent: Agent, turn_id: UUID) -> tuple[Turn, int] | None:
    """``turn_get`` and ``turn_seq`` in one query: the agent's turn and its highest stored seq."""
    turn = Turn.objects.filter(agent=agent, pk=turn_id).annotate(top=_TOP_SEQ).first()
    return (turn, int(turn.top or 0)) if turn is not None else None


def turn_seq(*, turn_id: UUID | str) -> int:
    """The highest stored seq of the turn (0 before its first chunk)."""
    return int(Chunk.objects.filter(turn_id=turn_id).aggregate(top=Max("seq"))["top"] or 0)


def turn_partial_text(*, turn_id: UUID | str) -> str:
    """The answer a turn's stream has shown so far: its text deltas, a round's text after the tool
    calls before it set apart as a paragraph, and none of what a ``data-reset`` (a recovered round
    starting again) took back: the round's text before its tool calls too, which it writes again
    (its tool calls are not sent twice). A round ends with its tools' results."""
    rounds: list[str] = []  # the text of rounds that ended
    this_round: list[str] = []  # the text of the round in progress, before its tool calls
    current = ""
    for type_, data in Chunk.objects.filter(turn_id=turn_id).order_by("seq").values_list("type", "data"):
        if type_ == "text-delta":
            current += str((data or {}).get("delta", ""))
        elif type_ == "data-reset":
            this_round, current = [], ""
        elif type_ == "tool-input-available" and current:
            this_round.append(current)
            current = ""
        elif type_ == "tool-output-available":  # the round ended (text it wrote again is its own)
            rounds += [*this_round, current]
            this_round, current = [], ""
    return "\n\n".join(r.strip() for r in [*rounds, *this_round, current] if r.strip())


def turn_stopped_messages(*, turn_id: UUID | str) -> list[dict[str, Any]]:
    """What a stopped turn's stream added to the conversation, in the shape the turn's ``finish``
    writes (``{"role": "assistant", "content", "tool_calls"}``, ``{"role": "tool", "tool_call_id",
    "name", "content"}``): each round's text with the tool calls whose results were stored, those
    results, then the text streamed after the last of them. A call with no stored result is left out
    (a model is never shown a call without its answer)."""
    added: list[dict[str, Any]] = []
    text = ""
    calls: dict[str, dict[str, Any]] = {}  # the round's calls, by id
    assistant: dict[str, Any] | None = None  # the round's message, once a result of its calls is stored
    for type_, data in Chunk.objects.filter(turn_id=turn_id).order_by("seq").values_list("type", "data"):
        fields = data if isinstance(data, dict) else {}
        if type_ in ("text-delta", "tool-input-available") and assistant is not None:
            text, calls, assistant = "", {}, None  # the next round, after the tool results
        if type_ == "text-delta":
            text += str(fields.get("delta", ""))
        elif type_ == "data-reset":
            text = ""
        elif type_ == "tool-input-available":
            call_id = str(fields.get("toolCallId", ""))
            calls[call_id] = {"id": call_id, "name": fields.get("toolName", ""), "arguments": fields.get("input")}
        elif type_ == "tool-output-available" and str(fields.get("toolCallId", "")) in calls:
            call = calls[str(fields.get("toolCallId"))]
            if assistant is None:
                assistant = {"role": "assistant", "content": text, "tool_calls": []}
                added.append(assistant)
            assistant["tool_calls"].append(call)
            added.append(
                {"role": "tool", "tool_call_id": call["id"], "name": call["name"], "content": fields.get("output")}
            )
    if assistant is None and text.strip():
        added.append({"role": "assistant", "content": text.strip(), "tool_calls": []})
    return added


# What members read of a failed turn's reason: the reason itself (an exception's text, a setting's
# name) is for staff, who read it in the admin with the run that failed.
FAILED_REASON = "something went wrong and this answer could not be finished"


def turn_data(turn: Turn) -> TurnData:
    """A turn as every member of the account sees it (the socket, the API, the pushes)."""
    reason = FAILED_REASON if turn.status == TurnStatus.FAILED else turn.end_reason
    return {"id": str(turn.pk), "number": turn.number, "status": turn.status, "end_reason": reason}


def message_data(message: Message) -> MessageData:
    return {
        "id": message.pk,
        "turn": str(message.turn_id) if message.turn_id is not None else None,
        "role": message.role,
        "text": message.text,
        "parts": message.parts,
        "created_at": message.created_at.isoformat(),
    }


def agent_snapshot(*, agent: Agent, since: int | None = None) -> AgentSnapshot:
    """``agent_snapshot_numbered`` without the number."""
    return agent_snapshot_numbered(agent=agent, since=since)[0]


def agent_snapshot_numbered(*, agent: Agent, since: int | None = None) -> tuple[AgentSnapshot, int]:
    """Everything a client draws first: the conversation so far, the state, the active turn (with
    the highest seq stored, read now: a caller that joined the agent's group before calling this
    gets every later chunk live) and the turns queued behind it.

    The messages are the newest that fit (SNAPSHOT_MESSAGES, SNAPSHOT_BYTES), oldest first, and
    ``more`` says whether older ones were left out. ``since`` (a message id) keeps only the messages
    after it: a client that reconnects names the newest message it has, and gets what it missed
    instead of the whole conversation again.

    Also the number of the agent's newest turn, read first: a turn above it started after the
    snapshot was read (the socket streams such a turn from its first chunk). Four queries."""
    # The state and the newest turn's number first, then turns before messages: a turn that ends in
    # between is then both the active turn and answered in the messages (the client sees its final
    # message), never neither.
    state, state_version, newest_number = (
        Agent.objects.filter(pk=agent.pk)
        .annotate(newest=Max("turns__number"))
        .values_list("state", "state_version", "newest")
        .get()
    )
    open_turns = list(Turn.objects.filter(agent=agent, status__in=TURN_OPEN).annotate(top=_TOP_SEQ).order_by("number"))
    active = next((t for t in open_turns if t.status in TURN_ACTIVE), None)
    active_seq = int(active.top or 0) if active is not None else 0
    messages = Message.objects.filter(agent=agent)
    if since is not None:
        messages = messages.filter(id__gt=since)
    newest = list(messages.order_by("-id")[: SNAPSHOT_MESSAGES + 1])
    kept = newest_that_fit([message_data(m) for m in newest[:SNAPSHOT_MESSAGES]])
    snapshot: AgentSnapshot = {
        "agent": {"kind": agent.kind, "name": agent.name, "account": agent.account.slug},
        "messages": kept,
        "since": since,
        "more": len(kept) < len(newest),
        "state": state,
        "state_version": state_version,
        "turn": (
            {"id": str(active.pk), "number": active.number, "status": active.status, "seq": active_seq}
            if active is not None
            else None
        ),
        "queued": [turn_data(t) for t in open_turns if t.status == TurnStatus.QUEUED],
        "stopped": _stopped_unanswered(agent, kept, open_turns),
    }
    return snapshot, int(newest_number or 0)


def _stopped_unanswered(agent: Agent, kept: list[MessageData], open_turns: Sequence[Turn]) -> list[TurnData]:
    """The turns of the snapshot's messages that were stopped before they answered (cancelled while
    queued, or running before any word): a message sent and never answered says so, and why. A
    query only when some message of the snapshot has no answer in it and no open turn."""
    asked = {m["turn"] for m in kept if m["role"] == MessageRole.USER and m["turn"]}
    answered = {m["turn"] for m in kept if m["role"] == MessageRole.ASSISTANT and m["turn"]}
    unanswered = asked - answered - {str(t.pk) for t in open_turns}
    if not unanswered:
        return []
    stopped = Turn.objects.filter(agent=agent, pk__in=unanswered, status=TurnStatus.CANCELLED).order_by("number")
    return [turn_data(t) for t in stopped]


def newest_that_fit(newest_first: list[MessageData]) -> list[MessageData]:
    """The newest messages whose JSON fits in SNAPSHOT_BYTES, oldest first (the page shows the
    conversation's end; a long one in a script JSON escapes to six bytes a character must not make
    the snapshot too large to send)."""
    kept: list[MessageData] = []
    size = 0
    for message in newest_first:
        size += len(json.dumps(message)) + 1
        if size > SNAPSHOT_BYTES:
            break
        kept.append(message)
    return kept[::-1]


def turns_open(*, agent: Agent) -> list[Turn]:
    """The agent's turns not yet ended, in queue order."""
    return list(Turn.objects.filter(agent=agent, status__in=TURN_OPEN).order_by("number"))


def agents_of(*, user: User) -> list[Agent]:
    """The agents of every account ``user`` belongs to (the home page links each chat)."""
    return list(
        Agent.objects.filter(account__in=accounts_of(user))
        .select_related("account")
        .order_by("account__slug", "kind", "name")
    )


# --- submissions ------------------------------------------------------------------------------------
class SubmissionData(TypedDict):
    id: str
    agent: dict[str, str]
    status: str
    messages: list[dict[str, str]]
    metadata: dict[str, Any]
    turn: TurnData | None  # None while it waits in the inbox
    created_at: str
    delivered_at: str | None
    finished_at: str | None


def submission_data(submission: Submission) -> SubmissionData:
    """A submission as members of its agent's account (and the system that submitted it) see it."""
    agent = submission.agent
    return {
        "id": str(submission.pk),
        "agent": {"kind": agent.kind, "name": agent.name, "account": agent.account.slug},
        "status": submission.status,
        "messages": submission.messages,
        "metadata": submission.metadata,
        "turn": turn_data(submission.turn) if submission.turn is not None else None,
        "created_at": submission.created_at.isoformat(),
        "delivered_at": submission.delivered_at.isoformat() if submission.delivered_at else None,
        "finished_at": submission.finished_at.isoformat() if submission.finished_at else None,
    }


def submission_get(*, user: User, submission_id: UUID | str) -> Submission | None:
    """The submission if ``user`` is a member of its agent's account; None otherwise, or if there is
    no such submission (the same answer)."""
    try:
        parsed = UUID(str(submission_id))
    except ValueError:
        return None
    return (
        Submission.objects.select_related("agent__account", "turn")
        .filter(pk=parsed, agent__account__in=accounts_of(user))
        .first()
    )


def submissions_of(*, agent: Agent, status: str | None = None) -> QuerySet[Submission]:
    """The agent's submissions, newest first; only those in ``status`` if given."""
    rows = Submission.objects.select_related("agent__account", "turn").filter(agent=agent)
    return rows.filter(status=status) if status else rows
