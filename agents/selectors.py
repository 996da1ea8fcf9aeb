"""Reads: which agent a person may talk to, a turn's stream, and what a client sees first.

The WebSocket consumer and the HTTP views call these; they decide nothing themselves.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db.models import Max

from accounts.models import Account
from accounts.selectors import User, account_for, is_member
from agents.models import TURN_ACTIVE, TURN_OPEN, Agent, Chunk, Message, Turn, TurnStatus
from agents.registry import get_agent_class


def agent_get(*, user: User, kind: str, name: str, account: str | Account | None = None) -> Agent | None:
    """The agent ``(account, kind, name)`` for ``user``, created on first use; None (a 404) if the
    kind is not registered, the name is not a valid one, or ``user`` is not a member of the account
    (``account``: a slug, an Account, or None for the user's default account)."""
    if get_agent_class(kind) is None or not isinstance(name, str) or not 0 < len(name) <= 128 or "\x00" in name:
        return None
    if isinstance(account, Account):
        found = account if is_member(user, account) else None
    else:
        found = account_for(user, account)
    if found is None:
        return None
    agent, _ = Agent.objects.get_or_create(account=found, kind=kind, name=name)
    return agent


def turn_get(*, agent: Agent, turn_id: UUID | str) -> Turn | None:
    """The turn of this agent with that id, or None (a turn of another agent is not found either)."""
    try:
        return Turn.objects.filter(agent=agent, pk=UUID(str(turn_id))).first()
    except ValueError:
        return None


def open_turn(agent: Agent) -> Turn | None:
    """The turn running or waiting now, if any (at most one per agent)."""
    return Turn.objects.filter(agent=agent, status__in=TURN_ACTIVE).order_by("number").first()


def chunks_after(turn: Turn, after: int = 0, *, limit: int | None = None) -> list[dict[str, Any]]:
    """The turn's stored chunks with ``seq > after``, in order: ``{"seq", "type", "data"}``."""
    rows = Chunk.objects.filter(turn=turn, seq__gt=after).order_by("seq").values_list("seq", "type", "data")
    if limit is not None:
        rows = rows[:limit]
    return [{"seq": seq, "type": type_, "data": data} for seq, type_, data in rows]


def highest_seq(turn: Turn) -> int:
    return int(Chunk.objects.filter(turn=turn).aggregate(m=Max("seq"))["m"] or 0)


def turn_summary(turn: Turn) -> dict[str, Any]:
    return {
        "id": str(turn.pk),
        "number": turn.number,
        "status": turn.status,
        "end_reason": turn.end_reason,
        "created_at": turn.created_at.isoformat(),
    }


def message_summary(message: Message) -> dict[str, Any]:
    return {
        "id": message.pk,
        "turn": str(message.turn_id) if message.turn_id else None,
        "role": message.role,
        "text": message.text,
        "parts": message.parts,
        "created_at": message.created_at.isoformat(),
    }


def agent_messages(agent: Agent, *, limit: int = 200) -> list[dict[str, Any]]:
    """The conversation's last ``limit`` messages, in conversation order (by turn, then as written)."""
    rows = Message.objects.filter(agent=agent).order_by("-turn__number", "-id")[:limit]
    return [message_summary(m) for m in reversed(list(rows))]


def agent_snapshot(agent: Agent) -> dict[str, Any]:
    """What a client sees first: the agent, its messages and state, the active turn with the highest
    stored seq of its stream (read now: call after joining the agent's group, so nothing pushed in
    between is missed) and the queued turns."""
    active = open_turn(agent)
    turn = None
    if active is not None:
        turn = {"id": str(active.pk), "number": active.number, "status": active.status, "seq": highest_seq(active)}
    queued = Turn.objects.filter(agent=agent, status=TurnStatus.QUEUED).order_by("number")
    return {
        "agent": {"kind": agent.kind, "name": agent.name, "account": agent.account.slug},
        "messages": agent_messages(agent),
        "state": agent.state,
        "state_version": agent.state_version,
        "turn": turn,
        "queued": [turn_summary(t) for t in queued],
    }


def turns_open(agent: Agent) -> list[Turn]:
    return list(Turn.objects.filter(agent=agent, status__in=TURN_OPEN).order_by("number"))
