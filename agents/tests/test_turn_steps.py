"""The steps a turn's run takes (``agents.turn``), advanced in this process: an answer is one step,
a tool call adds its own and a round, and a run started at version 1 keeps the steps it had."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents.models import Message, Turn, TurnStatus
from agents.services import message_send
from agents.tests.support import assert_seq_complete, chat_agent, chunks, streamed_text
from agents.workflows import TurnWorkflow, answer_text
from tests.agents_fixtures import count
from tests.factories import Users
from tests.fixtures import NoEnqueue
from workflows import engine
from workflows.models import RunStatus, StepResult
from workflows.services import run_restart

pytestmark = pytest.mark.django_db(transaction=True)


def steps(turn: Turn) -> list[str]:
    return list(StepResult.objects.filter(run_id=turn.run_id).order_by("position").values_list("name", flat=True))


def advanced(turn: Turn) -> Turn:
    assert turn.run_id is not None
    assert engine.advance(turn.run_id) == RunStatus.COMPLETED
    return Turn.objects.get(pk=turn.pk)


def test_an_answer_without_a_tool_is_one_step_that_ends_the_turn(users: Users, no_enqueue: NoEnqueue) -> None:
    # given alice's earlier turn, so that this one reads a conversation
    agent = chat_agent(users.alice)
    advanced(message_send(agent=agent, user=users.alice, text="first"))
    turn = message_send(agent=agent, user=users.alice, text="hello there")

    # when its run is advanced
    with CaptureQueriesContext(connection) as queries:
        turn = advanced(turn)

    # then the first round read the conversation, streamed, and ended the turn itself
    assert steps(turn) == ["model 1"]
    assert turn.status == TurnStatus.COMPLETED and turn.end_reason == "answered"
    assert streamed_text(turn) == turn.text == "You said: hello there"
    assert [c.type for c in chunks(turn)][:1] + [c.type for c in chunks(turn)][-1:] == ["start", "finish"]
    assert_seq_complete(turn)
    assert list(Message.objects.filter(turn=turn).order_by("id").values_list("role", "text")) == [
        ("user", "hello there"),
        ("assistant", "You said: hello there"),
    ]
    # in few statements besides the engine's own: the turn with its last seq and the conversation;
    # the first delta's batch (start with it); then the end, in one transaction: the lease and the
    # agent's lock in one statement, the message, the last chunks, the turn, the next queued turn
    # (BEGIN and COMMIT counted)
    assert len(queries.captured_queries) <= 13, "\n".join(q["sql"][:120] for q in queries.captured_queries)


def test_a_tool_call_takes_a_step_of_its_own_and_a_round_after_it(
    users: Users, no_enqueue: NoEnqueue, tmp_path: Path
) -> None:
    path = str(tmp_path / "record")
    turn = advanced(message_send(agent=chat_agent(users.alice), user=users.alice, text=f"record {path}"))

    assert steps(turn) == ["model 1", "tool t1", "model 2"]
    assert turn.status == TurnStatus.COMPLETED
    assert count(path) == 1
    roles = list(Message.objects.filter(turn=turn).order_by("id").values_list("role", flat=True))
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert turn.text.startswith("Let me do that.\n\nDone: ")
    assert_seq_complete(turn)


def test_a_run_started_at_version_1_keeps_its_load_and_finish_steps(
    users: Users, no_enqueue: NoEnqueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a turn whose run was started by the code before version 2 (in flight at a deploy)
    with monkeypatch.context() as patched:
        patched.setattr(TurnWorkflow, "version", "1")
        turn = message_send(agent=chat_agent(users.alice), user=users.alice, text="hello there")
    assert turn.run is not None and turn.run.workflow_version == "1"

    # when today's code advances it
    turn = advanced(turn)

    # then it replays the steps it was started with, to the same end
    assert steps(turn) == ["load", "model 1", "finish"]
    assert turn.status == TurnStatus.COMPLETED
    assert streamed_text(turn) == turn.text == "You said: hello there"
    assert_seq_complete(turn)
    assert Message.objects.filter(turn=turn).count() == 2


def test_a_restarted_turn_starts_its_first_round_after_the_stream_it_had(
    users: Users, no_enqueue: NoEnqueue, tmp_path: Path, settings: Any
) -> None:
    # given a turn waiting for an approval, whose stream has been silent longer than the budget
    # allows an interrupted round
    settings.AGENTS_MAX_SILENCE_SECONDS = 0.2
    turn = message_send(agent=chat_agent(users.alice), user=users.alice, text=f"refund 20.00 {tmp_path / 'r'}")
    assert turn.run_id is not None
    engine.advance(turn.run_id)
    assert Turn.objects.get(pk=turn.pk).status == TurnStatus.WAITING
    streamed = len(chunks(turn))
    time.sleep(0.3)

    # when staff restart its run
    run_restart(run_id=turn.run_id)
    engine.advance(turn.run_id)

    # then the new attempt read the stream's last seq first and answered anew after it: no recovery
    # of the attempt before it, no seal for its silence
    turn = Turn.objects.get(pk=turn.pk)
    assert (turn.status, turn.recoveries) == (TurnStatus.WAITING, 0), turn.end_reason
    assert steps_of(turn, attempt=2)[:2] == ["load", "model 1"]
    assert [c.type for c in chunks(turn)[streamed:]][:1] == ["text-delta"]  # no reset, no notice first
    assert_seq_complete(turn)


def steps_of(turn: Turn, *, attempt: int) -> list[str]:
    named = StepResult.objects.filter(run_id=turn.run_id, attempt=attempt).order_by("position")
    return list(named.values_list("name", flat=True))


def test_the_answer_is_the_text_of_each_round_that_said_something() -> None:
    added: list[dict[str, Any]] = [
        {"role": "assistant", "content": "Let me look.", "tool_calls": [{"id": "1"}]},
        {"role": "tool", "tool_call_id": "1", "name": "x", "content": {}},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "2"}]},
        {"role": "tool", "tool_call_id": "2", "name": "y", "content": {}},
    ]
    assert answer_text([*added, {"role": "assistant", "content": "Done."}]) == "Let me look.\n\nDone."
    assert answer_text([*added, {"role": "assistant", "content": ""}]) == "Let me look."
