"""The services and selectors in-process: who gets which agent, what a message may be, the
queue's bookkeeping, stops from anywhere, the agent's state and what a client sees first."""

from __future__ import annotations

from typing import Any

import pytest
from pytest_django import DjangoAssertNumQueries

from agents import selectors
from agents.models import Agent, Chunk, Message, Turn, TurnStatus
from agents.selectors import agent_get, agent_snapshot, chunks_after, turn_active, turn_get
from agents.services import InvalidMessage, agent_state_merge, agent_state_update, message_send, turn_stop
from agents.tests.support import chat_agent, wait_ended
from tests.factories import Users
from tests.fixtures import NoEnqueue
from tests.support import Worker, wait_for_terminal
from workflows import public as wf
from workflows.models import RunStatus, WorkflowRun
from workflows.services import run_terminate


@pytest.mark.django_db
def test_an_agent_is_the_accounts_and_created_on_first_use_by_a_member(users: Users) -> None:
    from accounts.services import account_ensure

    acme = account_ensure(slug="acme", members=[users.alice, users.bob])
    account_ensure(slug="evil", members=[users.mallory])

    mine = agent_get(user=users.alice, kind="test.chat", name="help")
    assert mine is not None and mine.account == acme
    assert agent_get(user=users.bob, kind="test.chat", name="help") == mine  # same account, same agent
    assert agent_get(user=users.mallory, kind="test.chat", name="help", account="acme") is None
    assert agent_get(user=users.alice, kind="no.such.kind", name="help") is None
    assert agent_get(user=users.carol, kind="test.chat", name="help") is None  # a member of no account
    assert Agent.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("text", ["", "   ", "x" * 4001, "nul \x00 here", 7])
def test_a_message_that_cannot_be_sent_is_refused_and_nothing_is_stored(
    users: Users, no_enqueue: NoEnqueue, text: object
) -> None:
    agent = chat_agent(users.alice)
    with pytest.raises(InvalidMessage):
        message_send(agent=agent, user=users.alice, text=text)  # type: ignore[arg-type]
    assert not Turn.objects.exists() and not Message.objects.exists()


@pytest.mark.django_db
def test_messages_queue_behind_the_open_turn_and_the_snapshot_says_so(users: Users, no_enqueue: NoEnqueue) -> None:
    agent = chat_agent(users.alice)
    first = message_send(agent=agent, user=users.alice, text="one")
    second = message_send(agent=agent, user=users.alice, text="two")

    assert (first.status, second.status) == (TurnStatus.RUNNING, TurnStatus.QUEUED)
    assert first.run is not None and second.run is None
    assert turn_active(agent=agent) == first
    assert turn_get(agent=agent, turn_id=str(second.pk)) == second
    assert turn_get(agent=agent, turn_id="not-a-uuid") is None
    snapshot = agent_snapshot(agent=agent)
    assert snapshot["turn"] == {"id": str(first.pk), "number": 1, "status": "running", "seq": 0}
    assert [t["id"] for t in snapshot["queued"]] == [str(second.pk)]
    assert [m["text"] for m in snapshot["messages"]] == ["one", "two"]
    assert snapshot["agent"] == {"kind": "test.chat", "name": "t", "account": "acme"}


@pytest.mark.django_db
def test_a_message_stopped_while_queued_is_in_the_snapshot_as_never_answered(
    users: Users, no_enqueue: NoEnqueue, django_assert_num_queries: DjangoAssertNumQueries
) -> None:
    # given a running turn and one queued behind it
    agent = chat_agent(users.alice)
    first = message_send(agent=agent, user=users.alice, text="one")
    second = message_send(agent=agent, user=users.alice, text="two")
    with django_assert_num_queries(3):  # the state, the open turns, the messages: none for what is answered
        assert agent_snapshot(agent=agent)["stopped"] == []

    # when the queued one is stopped
    turn_stop(turn=second, user=users.alice)

    # then the snapshot says that its message was never answered, and who stopped it; not the
    # running turn's, nor the stopped one's once something answered it
    snapshot = agent_snapshot(agent=agent)
    assert snapshot["stopped"] == [
        {"id": str(second.pk), "number": 2, "status": "cancelled", "end_reason": "stopped by alice"}
    ]
    assert [t["id"] for t in snapshot["queued"]] == [] and snapshot["turn"]["id"] == str(first.pk)  # type: ignore[index]
    Message.objects.create(agent=agent, turn=second, role="assistant", text="late words")
    assert agent_snapshot(agent=agent)["stopped"] == []


@pytest.mark.django_db
def test_a_message_costs_few_statements(
    users: Users, no_enqueue: NoEnqueue, django_assert_max_num_queries: DjangoAssertNumQueries
) -> None:
    # The customer waits for message_send (a socket's ack, the API's 202): each statement is a round
    # trip. The locks are one statement, what is open is counted in one, and the new turn is inserted
    # as it is, running. (Inside the test's transaction, message_send's own is a savepoint and its
    # release; the run's insert goes through the engine's prepared cursor, which is not counted here.)
    agent = chat_agent(users.alice)
    with django_assert_max_num_queries(6):  # the locks, the queue, the turn, the message
        first = message_send(agent=agent, user=users.alice, text="one")
    with django_assert_max_num_queries(6):  # queued behind it: the same, and no run
        second = message_send(agent=agent, user=users.alice, text="two")
    assert (first.status, second.status) == (TurnStatus.RUNNING, TurnStatus.QUEUED)
    assert Turn.objects.get(pk=first.pk).run_id == first.run_id is not None


@pytest.mark.django_db
def test_turns_queued_with_none_active_start_oldest_first(users: Users, no_enqueue: NoEnqueue) -> None:
    # given a turn left queued with none active (its start never happened)
    agent = chat_agent(users.alice)
    first = message_send(agent=agent, user=users.alice, text="one")
    waiting = message_send(agent=agent, user=users.alice, text="two")
    Turn.objects.filter(pk=first.pk).update(status=TurnStatus.COMPLETED)

    # when a message comes
    third = message_send(agent=agent, user=users.alice, text="three")

    # then the oldest queued turn starts, and the new one waits behind it
    assert Turn.objects.get(pk=waiting.pk).status == TurnStatus.RUNNING
    assert third.status == TurnStatus.QUEUED and third.run is None


@pytest.mark.django_db
def test_turns_run_on_the_turn_queue_when_there_is_one(users: Users, no_enqueue: NoEnqueue, settings: Any) -> None:
    # given the workflows' own queue at first, then a queue for turns
    agent = chat_agent(users.alice)
    on_default = message_send(agent=agent, user=users.alice, text="one")
    settings.AGENTS_TURN_QUEUE = "agent-turns"

    # when a turn starts at once, and another starts once the one before it ends
    assert on_default.run_id is not None
    run_terminate(run_id=on_default.run_id)
    started = message_send(agent=agent, user=users.alice, text="two")
    queued = message_send(agent=agent, user=users.alice, text="three")
    assert started.run_id is not None
    run_terminate(run_id=started.run_id)

    # then each run is on the queue that was configured when it started
    queued.refresh_from_db()
    assert [t.run.queue for t in (on_default, started, queued) if t.run is not None] == [
        settings.WORKFLOWS_QUEUE,
        "agent-turns",
        "agent-turns",
    ]
    assert queued.status == TurnStatus.RUNNING


@pytest.mark.django_db
def test_a_run_terminated_by_anyone_cancels_its_turn_and_starts_the_next(users: Users, no_enqueue: NoEnqueue) -> None:
    agent = chat_agent(users.alice)
    first = message_send(agent=agent, user=users.alice, text="one")
    second = message_send(agent=agent, user=users.alice, text="two")
    assert first.run_id is not None

    run_terminate(run_id=first.run_id)  # staff in the admin, say

    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == TurnStatus.CANCELLED
    assert [(c["type"], c["data"]) for c in chunks_after(turn_id=first.pk, after=0)] == [
        ("finish", {"reason": "stopped"})
    ]
    assert second.status == TurnStatus.RUNNING and second.run is not None
    assert second.run.status == RunStatus.QUEUED


@pytest.mark.django_db
def test_stopping_a_queued_turn_leaves_the_running_one_alone(users: Users, no_enqueue: NoEnqueue) -> None:
    agent = chat_agent(users.alice)
    first = message_send(agent=agent, user=users.alice, text="one")
    second = message_send(agent=agent, user=users.alice, text="two")

    second = turn_stop(turn=second, user=users.alice)

    assert second.status == TurnStatus.CANCELLED and second.end_reason == "stopped by alice"
    first.refresh_from_db()
    assert first.status == TurnStatus.RUNNING
    assert Chunk.objects.filter(turn=second, type="finish").count() == 1


@pytest.mark.django_db
def test_the_agents_state_is_replaced_and_merged_with_a_new_version_each_time(users: Users) -> None:
    agent = chat_agent(users.alice)
    assert agent_state_update(agent_id=agent.pk, state={"a": 1, "b": 2}) == 1
    assert agent_state_merge(agent_id=agent.pk, patch={"b": None, "c": 3}) == 2
    agent.refresh_from_db()
    assert agent.state == {"a": 1, "c": 3} and agent.state_version == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_an_agent_workflow_reports_to_the_agents_state_exactly_once_per_step(worker: Worker, users: Users) -> None:
    agent = chat_agent(users.alice)

    run = wait_for_terminal(wf.start("test.agent-state", {"agent": agent.pk}).id)

    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result == 3
    agent.refresh_from_db()
    assert agent.state == {"refund": "confirmed"} and agent.state_version == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_turn_reads_the_conversation_before_it(worker: Worker, users: Users) -> None:
    agent = chat_agent(users.alice)
    wait_ended(message_send(agent=agent, user=users.alice, text="first"))
    turn = wait_ended(message_send(agent=agent, user=users.alice, text="second"))
    assert turn.text == "You said: second"
    texts = list(Message.objects.filter(agent=agent).order_by("id").values_list("text", flat=True))
    assert texts == ["first", "You said: first", "second", "You said: second"]


@pytest.mark.django_db
def test_a_turn_whose_run_failed_outside_its_steps_fails_and_the_queue_moves_on(
    users: Users, no_enqueue: NoEnqueue
) -> None:
    # given a turn whose run the engine failed before the workflow could end it (too many lost workers)
    agent = chat_agent(users.alice)
    first = message_send(agent=agent, user=users.alice, text="one")
    assert first.run_id is not None
    WorkflowRun.objects.filter(pk=first.run_id).update(
        status=RunStatus.FAILED, error={"message": "the run's worker was lost 6 times"}
    )

    # when alice sends another message
    second = message_send(agent=agent, user=users.alice, text="two")

    # then the first turn failed with a message she sees, and the second runs
    first.refresh_from_db()
    assert first.status == TurnStatus.FAILED
    assert first.end_reason == "its run ended: the run's worker was lost 6 times"
    assert [c["type"] for c in chunks_after(turn_id=first.pk, after=0)] == ["data-notice", "finish"]
    assert second.status == TurnStatus.RUNNING


@pytest.mark.django_db
def test_a_stop_that_races_the_turns_start_terminates_the_run_it_started(
    users: Users, no_enqueue: NoEnqueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a turn queued behind a running one
    from agents import services

    agent = chat_agent(users.alice)
    running = message_send(agent=agent, user=users.alice, text="hello")
    queued = message_send(agent=agent, user=users.alice, text="next")
    assert queued.status == TurnStatus.QUEUED

    # when the running turn ends (and the queued one starts) between the stop's first read and its locks
    lock = services.lock_agent
    raced: list[bool] = []

    def lock_after_the_race(agent: Agent) -> Agent:
        if not raced:
            raced.append(True)
            services.end_locked(Turn.objects.get(pk=running.pk), status=TurnStatus.COMPLETED, reason="answered")
        return lock(agent)

    monkeypatch.setattr(services, "lock_agent", lock_after_the_race)
    stopped = turn_stop(turn=queued, user=users.alice)

    # then the run the queued turn got in between is terminated, not left to run its tools
    assert stopped.status == TurnStatus.CANCELLED
    assert stopped.run_id is not None
    assert WorkflowRun.objects.get(pk=stopped.run_id).status == RunStatus.TERMINATED


@pytest.mark.django_db
def test_stopping_a_running_turn_pushes_its_end_once_saying_who_stopped_it(
    users: Users, no_enqueue: NoEnqueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given alice's running turn, and the pushes its agent's sockets get
    from agents import streams

    turn = message_send(agent=chat_agent(users.alice), user=users.alice, text="hello")
    assert turn.status == TurnStatus.RUNNING
    pushed: list[dict[str, Any]] = []
    monkeypatch.setattr(streams, "push_later", lambda agent_id, message: pushed.append(message))

    # when she stops it
    stopped = turn_stop(turn=turn, user=users.alice)

    # then its run is terminated, and its end is pushed once, with the reason the API gives
    assert turn.run_id is not None
    assert WorkflowRun.objects.get(pk=turn.run_id).status == RunStatus.TERMINATED
    assert stopped.status == TurnStatus.CANCELLED and stopped.end_reason == "stopped by alice"
    ends = [m["turn"] for m in pushed if m["type"] == "agent.turn" and m["turn"]["id"] == str(turn.pk)]
    assert ends == [selectors.turn_data(Turn.objects.get(pk=turn.pk))]
    assert ends[0]["end_reason"] == "stopped by alice"
