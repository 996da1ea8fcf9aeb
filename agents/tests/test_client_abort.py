"""A client that goes away mid-turn, against a real daphne and real workers: by default the turn runs
to its end; an agent whose class says ``cancel_on_client_abort = True`` has the turns that socket's
messages started stopped, durably, and another socket going away stops nothing of them."""

from __future__ import annotations

import json
import time

import pytest
from websockets.sync.client import ClientConnection

from accounts.services import account_ensure
from agents.models import Agent, Turn, TurnStatus
from agents.selectors import agent_get
from agents.tests.support import assert_seq_complete, chunks, streamed_text, wait_chunks, wait_ended
from agents.tests.test_consumers import open_chat
from tests.factories import Users
from tests.support import AsgiServer, Worker
from workflows.tests.test_consumers import receive, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STORY = "story 30 0.1"  # thirty words, a tenth of a second each
WORDS = " ".join(f"w{i}" for i in range(1, 31))


def the_agent(users: Users, kind: str) -> Agent:
    account_ensure(slug="acme", members=[users.alice, users.bob])
    agent = agent_get(user=users.alice, kind=kind, name="t")
    assert agent is not None
    return agent


def send_story(ws: ClientConnection) -> Turn:
    """Send the slow story on ``ws``; its turn, once it has streamed its first words."""
    assert receive(ws)["type"] == "snapshot"
    ws.send(json.dumps({"type": "message", "text": STORY}))
    answer = receive_until(ws, lambda f: f["type"] == "turn")[-1]
    turn = Turn.objects.get(pk=answer["id"])
    wait_chunks(turn, "text-delta", 2)
    return turn


def test_by_default_a_client_that_goes_away_leaves_its_turn_running_to_the_end(
    asgi_server: AsgiServer, worker: Worker, users: Users
) -> None:
    agent = the_agent(users, "test.chat")

    # when alice starts a slow answer and closes her tab mid-stream
    with open_chat(asgi_server, users.alice, kind=agent.kind, name=agent.name) as ws:
        turn = send_story(ws)

    # then the turn completes with the whole answer
    turn = wait_ended(turn)
    assert turn.status == TurnStatus.COMPLETED
    assert turn.text == streamed_text(turn) == WORDS
    assert_seq_complete(turn)


def test_cancel_on_client_abort_stops_the_turns_that_sockets_messages_started(
    asgi_server: AsgiServer, worker: Worker, users: Users
) -> None:
    agent = the_agent(users, "test.abortable")

    with open_chat(asgi_server, users.alice, kind=agent.kind, name=agent.name) as alice:
        # given bob watching the agent in his own tab while alice's answer streams
        with open_chat(asgi_server, users.bob, kind=agent.kind, name=agent.name) as bob:
            assert receive(bob)["type"] == "snapshot"
            turn = send_story(alice)
        # when bob goes away, the turn he only watched runs on
        count = len(chunks(turn))
        wait_chunks(turn, "text-delta", count + 2)
        assert Turn.objects.get(pk=turn.pk).status == TurnStatus.RUNNING
        # when alice, whose message started it, goes away

    # then it is stopped, its stream finished as stopped, and it stays so
    turn = wait_ended(turn)
    assert turn.status == TurnStatus.CANCELLED
    assert turn.end_reason == "stopped by alice"
    stored = chunks(turn)
    assert (stored[-1].type, stored[-1].data) == ("finish", {"reason": "stopped"})
    assert turn.run is not None
    time.sleep(1.5)  # a lease's worth: a worker that still ran the step writes nothing more
    assert [c.seq for c in chunks(turn)] == [c.seq for c in stored]
    assert_seq_complete(turn)
    assert 2 <= len([c for c in stored if c.type == "text-delta"]) < 30
    assert Turn.objects.get(pk=turn.pk).status == TurnStatus.CANCELLED
