"""A turn is answered only by its own run: a run of ``agents.turn`` started for someone else's turn
(a schedule or a webhook source may name any workflow) fails and leaves the turn as it was."""

from __future__ import annotations

import pytest

from agents.models import Chunk, Message, Turn
from agents.services import message_send
from agents.tests.support import chat_agent
from tests.factories import Users
from tests.fixtures import NoEnqueue
from workflows import engine
from workflows.models import RunStatus, WorkflowRun
from workflows.services import run_start

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_started_for_another_runs_turn_fails_and_touches_nothing(users: Users, no_enqueue: NoEnqueue) -> None:
    # given alice's turn, whose own run has not been advanced yet
    turn = message_send(agent=chat_agent(users.alice), user=users.alice, text="hello")
    before = (Turn.objects.get(pk=turn.pk).status, Message.objects.count(), Chunk.objects.count())

    # when another run of agents.turn names it (as a schedule's payload could) and is advanced
    foreign, _ = run_start(workflow="agents.turn", payload={"turn": str(turn.pk)})
    engine.advance(foreign.id)

    # then that run failed saying why, and the turn, its messages and its stream are as they were
    foreign = WorkflowRun.objects.get(pk=foreign.id)
    assert foreign.status == RunStatus.FAILED
    assert foreign.error is not None and foreign.error["type"] == "ForeignTurn"
    assert (Turn.objects.get(pk=turn.pk).status, Message.objects.count(), Chunk.objects.count()) == before
    assert Turn.objects.get(pk=turn.pk).run_id != foreign.id
