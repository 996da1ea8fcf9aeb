"""What an agent's clients receive live: the channel-layer group of an agent and its messages.

The database is the authority (chunks, turns, messages, state); these pushes only save clients a
poll. Each is sent after the commit that wrote what it announces (``workflows.outbox.on_commit``),
from the process's one publisher thread, so one writer's pushes arrive in the order it wrote.
A consumer that sees a gap in a turn's ``seq`` fills it from the database.

Channel-layer messages sent to ``group_name(agent_id)`` (the consumer has one method per type):

- ``{"type": "agent.chunks", "turn": "<uuid>", "number": N, "chunks": [{"seq", "type", "data"},
  …]}``: a batch of one turn's stream, in ``seq`` order, as stored. The turn's number lets a
  socket tell a turn newer than its snapshot from an old one without reading the database (a
  hundred sockets reading it at a turn's first chunk held every one of them up).
- ``{"type": "agent.turn", "turn": {"id", "number", "status", "end_reason"}}``: a turn was
  queued, started, waits for an approval, or ended.
- ``{"type": "agent.message", "message": {"id", "turn", "role", "text", "parts", "created_at"}}``:
  a message joined the conversation.
- ``{"type": "agent.state", "version": N, "state": {…}}``: the agent's state changed.
- ``{"type": "agent.fiber", "fiber": {"id", "name", "status", "stash_version", "attempts",
  "end_reason"}}``: a fiber of the agent (``agents.fibers``) was started, began, or ended
  (completed, failed, cancelled). Its stash and result stay in the database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workflows.outbox import on_commit
from workflows.streams import group_send_later

if TYPE_CHECKING:
    from agents.models import Turn


def group_name(agent_id: int) -> str:
    return f"agent.{agent_id}"


def push_later(agent_id: int, message: dict[str, Any]) -> None:
    """Push ``message`` to the agent's clients once the current transaction commits."""
    group = group_name(agent_id)
    on_commit(lambda: group_send_later(group, message))


def chunk_data(seq: int, type_: str, data: Any) -> dict[str, Any]:
    return {"seq": seq, "type": type_, "data": data}


def chunks_message(turn: Turn, chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``agent.chunks`` push of a batch of ``turn``'s stream (``chunk_data`` items)."""
    return {"type": "agent.chunks", "turn": str(turn.pk), "number": turn.number, "chunks": chunks}
