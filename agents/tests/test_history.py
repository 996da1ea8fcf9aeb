"""What a turn gives the model of a long conversation: the newest part, bounded, starting at a
user message. Without the bound a conversation of a few hundred long messages made every later
turn fail (its ``load`` step's result grew past WORKFLOWS_MAX_RESULT_BYTES)."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Message, MessageRole, Turn, TurnStatus
from agents.services import message_send
from agents.tests.support import chat_agent
from agents.workflows import load_turn, recent_history
from tests.factories import Users
from tests.fixtures import NoEnqueue


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": text, "tool_calls": calls or []}


def tool(result: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "c1", "name": "find_order", "content": result}


def test_a_short_conversation_is_given_whole(settings: Any) -> None:
    settings.AGENTS_HISTORY_CHARS = 10_000
    conversation = [user("hi"), assistant("hello"), user("refund 1042")]

    assert recent_history(conversation) == conversation


def test_the_oldest_messages_go_first_and_the_rest_starts_at_a_user_message(settings: Any) -> None:
    # given a conversation whose oldest part does not fit, cut inside a tool call's exchange
    settings.AGENTS_HISTORY_CHARS = 300
    old = [user("a" * 200), assistant("", [{"id": "c1", "name": "find_order", "arguments": {}}]), tool("b" * 60)]
    recent = [assistant("ok"), user("and now?"), assistant("done"), user("thanks")]

    # then what is given starts at the first user message that fits, never at a tool result
    assert recent_history(old + recent) == [user("and now?"), assistant("done"), user("thanks")]


def test_the_turns_own_message_always_stays(settings: Any) -> None:
    settings.AGENTS_HISTORY_CHARS = 10
    conversation = [user("earlier"), assistant("answer"), user("x" * 4000)]

    assert recent_history(conversation) == [user("x" * 4000)]


@pytest.mark.django_db
def test_a_long_conversation_loads_the_newest_messages_only(settings: Any, users: Users, no_enqueue: NoEnqueue) -> None:
    # given three hundred long messages before a new one
    settings.AGENTS_HISTORY_MESSAGES = 40
    agent = chat_agent(users.alice)
    turns = Turn.objects.bulk_create(Turn(agent=agent, number=i + 1, status=TurnStatus.COMPLETED) for i in range(300))
    Message.objects.bulk_create(
        Message(agent=agent, turn=t, role=MessageRole.USER, text=f"{i} " + "x" * 3900) for i, t in enumerate(turns)
    )
    turn = message_send(agent=agent, user=users.alice, text="the newest")

    # when its turn loads the conversation
    loaded = load_turn(str(turn.pk))

    # then it holds the newest forty, the turn's own message last
    assert len(loaded["messages"]) == 40
    assert loaded["messages"][-1] == user("the newest")
    assert loaded["messages"][0]["content"].startswith("261 ")
