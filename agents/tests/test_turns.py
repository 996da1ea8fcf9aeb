"""Turns end to end in real worker processes: the stream, the messages, tools, the FIFO queue, stop."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from agents.models import Chunk, Message, MessageRole, Turn, TurnStatus
from agents.services import message_send, turn_stop
from agents.tests.support import (
    assert_seq_complete,
    chat_agent,
    chunks,
    streamed_text,
    wait_chunks,
    wait_ended,
    wait_status,
)
from tests.agents_fixtures import count
from tests.factories import Users
from tests.support import Worker, thread_of
from workflows.models import RunStatus, WorkflowRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_message_becomes_a_completed_turn_with_its_stream_and_messages(worker: Worker, users: Users) -> None:
    # given alice's agent
    agent = chat_agent(users.alice)

    # when she sends a message
    turn = message_send(agent=agent, user=users.alice, text="hello there")

    # then its turn runs and completes, streaming start, the deltas and finish, in seq order
    turn = wait_ended(turn)
    assert turn.status == TurnStatus.COMPLETED, turn.end_reason
    assert_seq_complete(turn)
    types = [c.type for c in chunks(turn)]
    assert types[0] == "start" and types[-1] == "finish" and set(types[1:-1]) == {"text-delta"}
    assert streamed_text(turn) == turn.text == "You said: hello there"
    assert chunks(turn)[-1].data == {"reason": "stop"}
    # and the conversation holds her message and the answer
    messages = list(Message.objects.filter(agent=agent).order_by("id").values_list("role", "text"))
    assert messages == [("user", "hello there"), ("assistant", "You said: hello there")]
    assert turn.run is not None and turn.run.status == RunStatus.COMPLETED


def test_a_tool_call_runs_once_and_its_output_is_streamed_and_kept(
    worker: Worker, users: Users, tmp_path: Path
) -> None:
    agent = chat_agent(users.alice)
    path = str(tmp_path / "record")

    turn = wait_ended(message_send(agent=agent, user=users.alice, text=f"record {path}"))

    assert turn.status == TurnStatus.COMPLETED, turn.end_reason
    assert count(path) == 1
    assert_seq_complete(turn)
    by_type = {c.type: c.data for c in chunks(turn)}
    assert by_type["tool-input-available"] == {"toolCallId": "t1", "toolName": "record", "input": {"path": path}}
    assert by_type["tool-output-available"] == {"toolCallId": "t1", "output": {"recorded": 1}}
    roles = list(Message.objects.filter(turn=turn).order_by("id").values_list("role", flat=True))
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert turn.text == 'Let me do that.\n\nDone: {"recorded": 1}'


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("bad", "the arguments were not JSON"),
        ("unknown", "there is no tool called 'nope'"),
        ("boom", "RuntimeError: the tool broke"),
    ],
)
def test_a_tool_that_cannot_run_answers_with_an_error_the_model_reads(
    worker: Worker, users: Users, text: str, error: str
) -> None:
    agent = chat_agent(users.alice)

    turn = wait_ended(message_send(agent=agent, user=users.alice, text=text))

    assert turn.status == TurnStatus.COMPLETED, turn.end_reason
    tool = Message.objects.get(turn=turn, role="tool")
    assert tool.parts["result"] == {"error": error}
    assert "Done:" in turn.text


def test_three_messages_at_once_run_one_after_another_in_order(worker: Worker, users: Users) -> None:
    agent = chat_agent(users.alice)
    barrier = threading.Barrier(3)
    sent: list[Turn] = []

    def send(i: int) -> None:
        barrier.wait()
        sent.append(message_send(agent=agent, user=users.alice, text=f"story 5 0.05 #{i}"))

    threads = [thread_of(send, i) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    turns = [wait_ended(t) for t in sorted(sent, key=lambda t: t.number)]
    assert [t.number for t in turns] == [1, 2, 3]
    assert all(t.status == TurnStatus.COMPLETED for t in turns)
    # one after another: each started after the one before it finished
    for before, after in zip(turns, turns[1:], strict=False):
        assert before.finished_at is not None and after.started_at is not None
        assert after.started_at >= before.finished_at
    # and each turn's run saw its own message as the last one
    assert [streamed_text(t) for t in turns] == ["w1 w2 w3 w4 w5"] * 3


def test_stop_cancels_a_queued_and_a_running_turn_for_good(worker: Worker, users: Users) -> None:
    # given a slow turn streaming and a turn queued behind it
    agent = chat_agent(users.alice)
    running = message_send(agent=agent, user=users.alice, text="story 60 0.1")
    queued = message_send(agent=agent, user=users.alice, text="hello")
    assert queued.status == TurnStatus.QUEUED
    wait_chunks(running, "text-delta", 3)

    # when alice stops the queued one, then the running one
    queued = turn_stop(turn=queued, user=users.alice)
    running = turn_stop(turn=running, user=users.alice)

    # then both are cancelled, each stream ends with finish "stopped", the run is terminated
    assert queued.status == running.status == TurnStatus.CANCELLED
    for turn in (queued, running):
        assert_seq_complete(turn)
        assert chunks(turn)[-1].type == "finish" and chunks(turn)[-1].data == {"reason": "stopped"}
    assert running.run_id is not None
    run = WorkflowRun.objects.get(pk=running.run_id)
    assert run.status == RunStatus.TERMINATED
    # and what the running one had streamed stays as its answer, marked stopped (nothing for the queued)
    partial = streamed_text(running)
    assert partial.startswith("w1 w2 w3") and running.text == partial.strip()
    kept = Message.objects.get(turn=running, role=MessageRole.ASSISTANT)
    assert (kept.text, kept.parts) == (partial.strip(), {"stopped": True})
    assert not Message.objects.filter(turn=queued, role=MessageRole.ASSISTANT).exists()
    # and nothing is added to the stream afterwards, not even by a worker started later
    stored = Chunk.objects.filter(turn=running).count()
    restarted = Worker(concurrency=1)
    try:
        time.sleep(3)
    finally:
        restarted.stop()
    assert Chunk.objects.filter(turn=running).count() == stored
    assert Turn.objects.get(pk=running.pk).status == TurnStatus.CANCELLED
    # and stopping it again is refused
    from agents.services import TurnNotStoppable

    with pytest.raises(TurnNotStoppable):
        turn_stop(turn=running, user=users.alice)


def test_a_stop_lets_the_next_queued_turn_run(worker: Worker, users: Users) -> None:
    agent = chat_agent(users.alice)
    first = message_send(agent=agent, user=users.alice, text="story 60 0.1")
    second = message_send(agent=agent, user=users.alice, text="hello")
    wait_status(first, TurnStatus.RUNNING)

    turn_stop(turn=first, user=users.alice)

    second = wait_ended(second)
    assert second.status == TurnStatus.COMPLETED
    assert second.text == "You said: hello"


def test_a_turn_with_the_rules_model_streams_its_answer(worker: Worker, users: Users) -> None:
    agent = chat_agent(users.alice, kind="test.rules")

    turn = wait_ended(message_send(agent=agent, user=users.alice, text="hello"))

    assert turn.status == TurnStatus.COMPLETED, turn.end_reason
    assert turn.text and streamed_text(turn) == turn.text
    assert_seq_complete(turn)
