"""A turn whose run the engine fails where the workflow cannot end the turn itself (too many lost
workers, a workflow that is gone at claim time): the turn fails at once, with a notice the customer
reads and a ``finish`` chunk, and the next queued turn starts, without waiting for another message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agents.models import Turn, TurnStatus
from agents.services import RUN_FAILED_MESSAGE, message_send
from agents.tests.support import assert_seq_complete, chat_agent, chunks, wait_ended
from tests.agents_fixtures import count
from tests.factories import Users
from tests.support import Worker, wait_for_terminal
from workflows import engine, hooks
from workflows.models import RunStatus, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)


def stream_end(turn: Turn) -> list[tuple[str, Any]]:
    return [(c.type, c.data) for c in chunks(turn)][-2:]


@pytest.mark.slow
def test_a_tool_that_kills_its_worker_every_time_fails_the_turn_and_the_next_one_runs(
    queue: str, workers: list[Worker], users: Users, tmp_path: Path
) -> None:
    # given workers that allow two recoveries, a turn whose tool kills its worker on every try, and a
    # second message queued behind it
    agent = chat_agent(users.alice, kind="test.killing")
    path = str(tmp_path / "kills")
    first = message_send(agent=agent, user=users.alice, text=f"die {path}")
    second = message_send(agent=agent, user=users.alice, text="after")
    assert second.status == TurnStatus.QUEUED
    workers.append(Worker(queue=queue, beat=True, WORKFLOWS_MAX_RECOVERY_ATTEMPTS="2"))

    # when the engine gives up on the first turn's run
    assert first.run_id is not None
    run = wait_for_terminal(first.run_id, timeout=90)

    # then the run failed for lost workers, and its turn failed with it, without another message:
    # the customer reads why, the stream is finished and whole, and the tool was tried three times
    assert (run.status, run.failure_reason) == (RunStatus.FAILED, "max_recovery_attempts")
    first = wait_ended(first, timeout=15)
    assert first.status == TurnStatus.FAILED
    assert first.end_reason.startswith("its run ended: the run's worker was lost 3 times")
    assert stream_end(first) == [("data-notice", {"text": RUN_FAILED_MESSAGE}), ("finish", {"reason": "error"})]
    assert_seq_complete(first)
    assert count(path) == 3  # the first try and two recoveries

    # and the queued turn started and was answered
    second = wait_ended(second, timeout=30)
    assert second.status == TurnStatus.COMPLETED, second.end_reason
    assert second.text == "You said: after"


@pytest.mark.parametrize("fault", ["max_recovery_attempts", "unknown_workflow"])
def test_a_run_failed_at_claim_fails_its_turn_in_the_same_worker_and_starts_the_next(
    queue: str, users: Users, fault: str, settings: Any
) -> None:
    # given a running turn, another queued behind it, and the first one's run in a state the engine
    # fails at claim time, before any of the workflow's code runs
    agent = chat_agent(users.alice)
    first = message_send(agent=agent, user=users.alice, text="one")
    second = message_send(agent=agent, user=users.alice, text="two")
    assert (first.status, second.status) == (TurnStatus.RUNNING, TurnStatus.QUEUED)
    assert first.run_id is not None
    limit = int(settings.WORKFLOWS["MAX_RECOVERY_ATTEMPTS"])
    change = {"recovery_count": limit + 1} if fault == "max_recovery_attempts" else {"workflow": "gone.away"}
    WorkflowRun.objects.filter(pk=first.run_id).update(**change)

    # when a worker claims it (here, on a queue no worker listens on)
    assert engine.advance(first.run_id) == RunStatus.FAILED

    # then, by the time advance returns, the turn failed with the notice and the next one runs
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == TurnStatus.FAILED
    assert first.end_reason.startswith("its run ended: ")
    assert stream_end(first) == [("data-notice", {"text": RUN_FAILED_MESSAGE}), ("finish", {"reason": "error"})]
    assert_seq_complete(first)
    assert second.status == TurnStatus.RUNNING
    assert second.run_id is not None and second.run_id != first.run_id
    assert WorkflowRun.objects.get(pk=first.run_id).failure_reason == fault


def test_a_hook_that_raises_leaves_the_run_failed_and_the_next_message_repairs_the_turn(
    queue: str, users: Users, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a failed-run hook that raises, and a turn whose run the engine fails at claim
    def broken(run: WorkflowRun) -> None:
        raise RuntimeError("the hook broke")

    monkeypatch.setattr(hooks, "_on_failed", [broken])
    agent = chat_agent(users.alice)
    first = message_send(agent=agent, user=users.alice, text="one")
    assert first.run_id is not None
    WorkflowRun.objects.filter(pk=first.run_id).update(workflow="gone.away")

    # when it is claimed, the run still ends failed (the hook's error is logged, not raised)
    assert engine.advance(first.run_id) == RunStatus.FAILED
    first.refresh_from_db()
    assert first.status == TurnStatus.RUNNING

    # then the agent's next message ends the turn as failed, as before the hook existed
    second = message_send(agent=agent, user=users.alice, text="two")
    first.refresh_from_db()
    assert first.status == TurnStatus.FAILED
    assert second.status == TurnStatus.RUNNING


def test_a_run_restarted_before_the_hook_runs_leaves_its_turn_alone(queue: str, users: Users) -> None:
    # given a turn's run that is failed, then restarted by staff before the hook could lock it
    agent = chat_agent(users.alice)
    turn = message_send(agent=agent, user=users.alice, text="one")
    assert turn.run_id is not None
    WorkflowRun.objects.filter(pk=turn.run_id).update(status=RunStatus.QUEUED)

    # when the engine fires its hooks for that run
    engine._fire_failed(turn.run_id)

    # then nothing is done to the turn: the run is not failed any more
    turn.refresh_from_db()
    assert turn.status == TurnStatus.RUNNING
    assert chunks(turn) == []
