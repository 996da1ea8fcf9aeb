"""Crashes for real: a worker's process group SIGKILLed mid-stream and after a tool call; turns
too old to answer; recovery budgets. Each test has its own queue and its own workers."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from agents.models import Chunk, Turn, TurnStatus
from agents.services import message_send
from agents.tests.support import (
    assert_seq_complete,
    chat_agent,
    chunks,
    streamed_text,
    wait_chunks,
    wait_ended,
)
from agents.workflows import BUDGET_MESSAGE, SEALED_MESSAGE, STALE_MESSAGE
from tests.agents_fixtures import count
from tests.factories import Users
from tests.support import Worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STORY = " ".join(f"w{i}" for i in range(1, 31))


def notices(turn: Turn) -> list[str]:
    return [c.data["text"] for c in chunks(turn) if c.type == "data-notice"]


def streaming_story(user: User, kind: str = "test.chat") -> Turn:
    """A turn of the agent ``kind`` streaming a slow story, five words in (a worker must be running)."""
    turn = message_send(agent=chat_agent(user, kind=kind), user=user, text="story 30 0.1")
    wait_chunks(turn, "text-delta", 5)
    return turn


def test_a_worker_killed_mid_stream_is_recovered_and_the_answer_continues_once(
    queue: str, workers: list[Worker], users: Users
) -> None:
    # given a turn streaming slowly
    workers.append(Worker(queue=queue, beat=True))
    turn = streaming_story(users.alice)

    # when the worker's process group is SIGKILLed mid-stream, and a new worker starts
    workers[0].kill()
    workers.append(Worker(queue=queue, beat=True))

    # then the turn completes: no duplicate or missing seq, and the whole answer exactly once
    turn = wait_ended(turn, timeout=60)
    assert turn.status == TurnStatus.COMPLETED, turn.end_reason
    assert_seq_complete(turn)
    assert streamed_text(turn) == turn.text == STORY
    assert not any(c.type == "data-reset" for c in chunks(turn))  # continued, not retried
    assert turn.recoveries == 1
    assert [c.type for c in chunks(turn)].count("start") == 1


def test_an_agent_that_retries_resets_the_round_and_streams_it_anew(
    queue: str, workers: list[Worker], users: Users
) -> None:
    workers.append(Worker(queue=queue, beat=True))
    turn = streaming_story(users.alice, kind="test.retrying")

    workers[0].kill()
    workers.append(Worker(queue=queue, beat=True))

    turn = wait_ended(turn, timeout=60)
    assert turn.status == TurnStatus.COMPLETED, turn.end_reason
    assert_seq_complete(turn)
    assert [c.data for c in chunks(turn) if c.type == "data-reset"] == [{"round": 1}]
    assert streamed_text(turn) == turn.text == STORY


def test_an_agent_that_seals_ends_the_turn_with_what_was_delivered(
    queue: str, workers: list[Worker], users: Users
) -> None:
    workers.append(Worker(queue=queue, beat=True))
    turn = streaming_story(users.alice, kind="test.sealing")

    workers[0].kill()
    partial = streamed_text(turn)
    workers.append(Worker(queue=queue, beat=True))

    turn = wait_ended(turn, timeout=60)
    assert turn.status == TurnStatus.SEALED
    assert turn.text == partial and STORY.startswith(partial)
    assert notices(turn) == [SEALED_MESSAGE]
    assert chunks(turn)[-1].data == {"reason": "sealed"}
    assert_seq_complete(turn)


def test_a_worker_killed_after_a_tool_call_completed_never_runs_the_tool_again(
    queue: str, workers: list[Worker], users: Users, tmp_path: Path
) -> None:
    # given a turn whose tool has run and whose answer after it streams slowly
    agent = chat_agent(users.alice)
    path = str(tmp_path / "record")
    workers.append(Worker(queue=queue, beat=True))
    turn = message_send(agent=agent, user=users.alice, text=f"record {path} 0.1")
    wait_chunks(turn, "tool-output-available")
    output_seq = Chunk.objects.get(turn=turn, type="tool-output-available").seq
    wait_for(lambda: Chunk.objects.filter(turn=turn, type="text-delta", seq__gt=output_seq).count() >= 3)

    # when the worker is killed and another takes over
    workers[0].kill()
    workers.append(Worker(queue=queue, beat=True))

    # then the turn completes, the tool ran once, and the stream has no gap or duplicate
    turn = wait_ended(turn, timeout=60)
    assert turn.status == TurnStatus.COMPLETED, turn.end_reason
    assert count(path) == 1
    assert_seq_complete(turn)
    assert [c.type for c in chunks(turn)].count("tool-output-available") == 1
    assert streamed_text(turn) == turn.text
    assert turn.text.endswith(" ".join(f"d{i}" for i in range(1, 21)))


def test_a_turn_too_old_when_its_round_starts_is_sealed_not_answered_late(
    queue: str, workers: list[Worker], users: Users
) -> None:
    # given a turn whose run has not started, created two hours ago (no worker was up)
    agent = chat_agent(users.alice)
    turn = message_send(agent=agent, user=users.alice, text="hello")
    Turn.objects.filter(pk=turn.pk).update(created_at=timezone.now() - timedelta(hours=2))

    # when a worker finally runs it
    workers.append(Worker(queue=queue))

    # then it is sealed with a message the customer sees, and nothing of an answer
    turn = wait_ended(turn)
    assert turn.status == TurnStatus.SEALED
    assert turn.end_reason == "stale"
    assert notices(turn) == [STALE_MESSAGE]
    assert not any(c.type == "text-delta" for c in chunks(turn))
    assert_seq_complete(turn)


def test_a_turn_out_of_recovery_budget_is_sealed_with_the_terminal_message(
    queue: str, workers: list[Worker], users: Users
) -> None:
    # given workers that allow no recovery of a stream
    workers.append(Worker(queue=queue, beat=True, AGENTS_MAX_RECOVERIES="0"))
    turn = streaming_story(users.alice)

    # when its worker dies mid-stream
    workers[0].kill()
    workers.append(Worker(queue=queue, beat=True, AGENTS_MAX_RECOVERIES="0"))

    # then the turn is sealed, and the customer reads why
    turn = wait_ended(turn, timeout=60)
    assert turn.status == TurnStatus.SEALED
    assert turn.end_reason.startswith("out of recovery budget")
    assert notices(turn) == [BUDGET_MESSAGE]
    assert STORY.startswith(turn.text) and turn.text
    assert_seq_complete(turn)


def test_a_worker_killed_while_a_submission_runs_completes_it_once(
    queue: str, workers: list[Worker], users: Users
) -> None:
    # given a submission whose turn streams slowly, five words in
    from agents.models import Message, Submission, SubmissionStatus
    from agents.submissions import submission_create

    workers.append(Worker(queue=queue, beat=True))
    agent = chat_agent(users.alice)
    submitted = submission_create(agent=agent, user=None, messages=[{"content": "story 30 0.1"}], idempotency_key="s")
    turn = submitted.submission.turn
    assert turn is not None
    wait_chunks(turn, "text-delta", 5)

    # when the worker's process group is SIGKILLed, and a new worker starts
    workers[0].kill()
    workers.append(Worker(queue=queue, beat=True))

    # then the submission completes with the whole answer once, and its message was added once
    turn = wait_ended(turn, timeout=60)
    assert turn.status == TurnStatus.COMPLETED, turn.end_reason
    assert_seq_complete(turn)
    assert streamed_text(turn) == turn.text == STORY
    assert Submission.objects.get(pk=submitted.submission.pk).status == SubmissionStatus.COMPLETED
    assert list(Message.objects.filter(turn=turn, role="user").values_list("text", flat=True)) == ["story 30 0.1"]
