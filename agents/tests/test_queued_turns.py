"""AGENTS_MAX_QUEUED_TURNS: the turns one agent may have queued behind its running one. A message
beyond it is refused, over HTTP with a 429 in the API's error shape and on the socket with an
``error`` frame, and stores nothing; messages sent at once are counted one after the other."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import transaction

from agents.models import Turn, TurnStatus
from agents.services import TooManyQueuedTurns, message_send, turn_stop
from agents.tests.support import chat_agent
from agents.tests.test_consumers import KIND, World, make_turn, open_chat, stored_counts
from agents.tests.test_consumers import world as world  # noqa: F401  the fixture
from tests.factories import Users, api_login
from tests.fixtures import NoEnqueue
from tests.support import AsgiServer, race
from workflows.tests.test_consumers import receive, receive_until

DEFAULT_LIMIT = 5  # the setting's default, which the test server runs with


def fill_queue(world: World, queued: int) -> None:
    """A running turn of the agent and ``queued`` turns behind it."""
    make_turn(world.agent, number=1)
    for number in range(2, queued + 2):
        make_turn(world.agent, number=number, status=TurnStatus.QUEUED)


@pytest.mark.django_db
def test_a_message_past_the_queued_turns_limit_is_refused_and_stores_nothing(
    users: Users, no_enqueue: NoEnqueue, settings: Any
) -> None:
    # given an agent answering one message with two more queued behind it, at a limit of two
    settings.AGENTS_MAX_QUEUED_TURNS = 2
    agent = chat_agent(users.alice)
    running = message_send(agent=agent, user=users.alice, text="one")
    queued = [message_send(agent=agent, user=users.bob, text=text) for text in ("two", "three")]
    assert [t.status for t in (running, *queued)] == [TurnStatus.RUNNING, TurnStatus.QUEUED, TurnStatus.QUEUED]
    before = stored_counts()

    # when another message comes, from anyone in the account
    with pytest.raises(TooManyQueuedTurns, match="the limit is 2"):
        message_send(agent=agent, user=users.alice, text="four")

    # then nothing was stored
    assert stored_counts() == before

    # and once the running turn ends and the next one starts, there is room for one more
    turn_stop(turn=running, user=users.alice)
    assert message_send(agent=agent, user=users.alice, text="four").status == TurnStatus.QUEUED


@pytest.mark.django_db
def test_zero_means_no_limit(users: Users, no_enqueue: NoEnqueue, settings: Any) -> None:
    settings.AGENTS_MAX_QUEUED_TURNS = 0
    agent = chat_agent(users.alice)
    turns = [message_send(agent=agent, user=users.alice, text=f"m{i}") for i in range(DEFAULT_LIMIT + 3)]
    assert sum(t.status == TurnStatus.QUEUED for t in turns) == DEFAULT_LIMIT + 2


@pytest.mark.django_db(transaction=True)
def test_messages_sent_at_once_are_counted_one_after_the_other(
    users: Users, no_enqueue: NoEnqueue, settings: Any
) -> None:
    # given an agent answering one message, at a limit of two queued
    settings.AGENTS_MAX_QUEUED_TURNS = 2
    agent = chat_agent(users.alice)
    message_send(agent=agent, user=users.alice, text="one")

    # when five messages are sent at the same instant
    results = race(lambda: message_send(agent=agent, user=users.alice, text="again"), n=5)

    # then exactly two were queued, and the others refused
    assert sum(isinstance(r, Turn) for r in results) == 2, results
    assert sum(isinstance(r, TooManyQueuedTurns) for r in results) == 3, results
    assert Turn.objects.filter(agent=agent, status=TurnStatus.QUEUED).count() == 2
    assert list(Turn.objects.filter(agent=agent).order_by("number").values_list("number", flat=True)) == [1, 2, 3]


@pytest.mark.django_db
def test_the_api_answers_429_in_the_error_shape(world: World) -> None:
    # given the agent's queue full
    fill_queue(world, DEFAULT_LIMIT)
    before = stored_counts()

    # when alice sends a message over HTTP
    answer = api_login(world.users.alice).post(f"/api/agents/{KIND}/help/messages", {"text": "hello"}, format="json")

    # then it is a 429 too_many_requests, and nothing was stored
    assert answer.status_code == 429
    error = answer.json()["error"]
    assert (error["code"], error["detail"]) == ("too_many_requests", None)
    assert f"the limit is {DEFAULT_LIMIT}" in error["message"]
    assert stored_counts() == before


@pytest.mark.django_db(transaction=True)
def test_the_socket_answers_an_error_frame_and_stays_open(asgi_server: AsgiServer, world: World) -> None:
    # given the agent's queue full
    with transaction.atomic():
        fill_queue(world, DEFAULT_LIMIT)
    before = stored_counts()

    with open_chat(asgi_server, world.users.alice) as ws:
        assert receive(ws)["type"] == "snapshot"

        # when alice sends a message
        ws.send(json.dumps({"type": "message", "text": "hello"}))

        # then she gets an error frame saying why, and the socket still answers
        answer = receive(ws)
        assert answer["type"] == "error" and f"the limit is {DEFAULT_LIMIT}" in answer["message"], answer
        queued = Turn.objects.get(agent=world.agent, number=2)
        ws.send(json.dumps({"type": "resume", "turn": str(queued.pk), "after": 0}))
        assert receive_until(ws, lambda f: f["type"] == "replay_complete")[-1]["seq"] == 0

    assert stored_counts() == before


@pytest.mark.django_db
def test_one_user_may_have_so_many_turns_open_over_all_their_agents(
    users: Users, no_enqueue: NoEnqueue, settings: Any
) -> None:
    # given alice with three turns open on three agents, at a limit of three per user
    settings.AGENTS_MAX_OPEN_TURNS_PER_USER = 3
    agents = [chat_agent(users.alice, name=f"a{i}") for i in range(4)]
    for agent in agents[:3]:
        message_send(agent=agent, user=users.alice, text="hello")
    before = stored_counts()

    # when she opens a fourth agent and writes, she is refused and nothing is stored
    with pytest.raises(TooManyQueuedTurns, match="the limit is 3"):
        message_send(agent=agents[3], user=users.alice, text="hello")
    assert stored_counts() == before

    # and bob, in the same account, may still write there
    assert message_send(agent=agents[3], user=users.bob, text="hello").status == TurnStatus.RUNNING
