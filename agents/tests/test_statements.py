"""The prepared statements of a turn, an agent's lookup and a submission (agents/statements.py) read
what the ORM's queries read: the same rows, decoded the same way (a message's JSON parts as a dict,
the agent's state, datetimes, UUIDs)."""

from __future__ import annotations

import pytest

from agents.models import Agent, Chunk, Message, MessageRole, Submission, SubmissionStatus, Turn, TurnStatus
from agents.services import message_send
from agents.statements import newest_messages, oldest_queued, save_end, turn_with_seq
from agents.tests.support import chat_agent
from tests.factories import Users
from tests.fixtures import NoEnqueue

pytestmark = pytest.mark.django_db


def test_the_turn_with_its_agent_and_last_seq(users: Users, no_enqueue: NoEnqueue) -> None:
    agent = chat_agent(users.alice)
    agent.state = {"orders": [1042]}
    agent.save()
    turn = message_send(agent=agent, user=users.alice, text="hello")
    Chunk.objects.bulk_create(Chunk(turn=turn, seq=seq, type="text-delta", data={"delta": "x"}) for seq in (1, 2, 7))

    found, seq = turn_with_seq(str(turn.pk))

    assert seq == 7
    assert found == turn and found.agent == agent
    assert found.agent.state == {"orders": [1042]}
    assert found.created_at == Turn.objects.get(pk=turn.pk).created_at
    assert found.status == TurnStatus.RUNNING
    with pytest.raises(Turn.DoesNotExist):
        turn_with_seq("00000000-0000-0000-0000-000000000000")


def test_the_newest_messages_as_the_orm_reads_them(users: Users, no_enqueue: NoEnqueue) -> None:
    agent = chat_agent(users.alice)
    first = message_send(agent=agent, user=users.alice, text="refund 1042")
    calls = [{"id": "c1", "name": "find_order", "arguments": {"order": "1042"}}]
    Message.objects.create(agent=agent, turn=first, role=MessageRole.ASSISTANT, parts={"tool_calls": calls})
    Message.objects.create(agent=agent, role=MessageRole.USER, text="no turn: in none of them")
    second = message_send(agent=agent, user=users.alice, text="and now?")

    expected = list(
        Message.objects.filter(agent=agent, turn__number__lte=second.number)
        .order_by("-turn__number", "-id")
        .values_list("role", "text", "parts")[:2]
    )
    assert newest_messages(second, 2) == expected
    assert newest_messages(second, 10)[1] == ("assistant", "", {"tool_calls": calls})
    assert [m[1] for m in newest_messages(first, 10)] == ["", "refund 1042"]


def test_the_oldest_queued_turn_and_the_end_written(users: Users, no_enqueue: NoEnqueue) -> None:
    agent = chat_agent(users.alice)
    running = message_send(agent=agent, user=users.alice, text="one")
    queued = [message_send(agent=agent, user=users.alice, text=t) for t in ("two", "three")]
    assert oldest_queued(agent) == queued[0]

    running.complete()
    running.end_reason, running.text = "answered", "the answer"
    running.finished_at = running.started_at
    save_end(running)

    stored = Turn.objects.get(pk=running.pk)
    assert (stored.status, stored.end_reason, stored.text) == (TurnStatus.COMPLETED, "answered", "the answer")
    assert stored.finished_at == running.started_at


def test_an_insert_reads_back_an_id_the_database_made(users: Users, no_enqueue: NoEnqueue) -> None:
    from workflows.statements import insert_instance

    turn = message_send(agent=chat_agent(users.alice), user=users.alice, text="hello")
    chunk = Chunk(turn=turn, seq=1, type="text-delta", data={"delta": "hi"})  # a declared BigAutoField id
    message = Message(agent=turn.agent, turn=turn, role=MessageRole.ASSISTANT, text="hi")  # an implicit one

    insert_instance(chunk)
    insert_instance(message)

    assert Chunk.objects.get(pk=chunk.pk).data == {"delta": "hi"}
    assert Message.objects.get(pk=message.pk).created_at == message.created_at


def test_ending_a_turn_that_is_gone_is_an_error(users: Users, no_enqueue: NoEnqueue) -> None:
    from django.db import DatabaseError

    turn = message_send(agent=chat_agent(users.alice), user=users.alice, text="hello")
    Turn.objects.filter(pk=turn.pk).delete()

    with pytest.raises(DatabaseError):
        save_end(turn)


def test_a_members_agent_as_the_orm_reads_it(users: Users) -> None:
    from accounts.services import account_ensure
    from agents.statements import member_agent

    # given alice in two accounts (acme first, her default), bob in acme, mallory in neither
    acme = account_ensure(slug="acme", members=[users.alice, users.bob])
    other = account_ensure(slug="other", members=[users.alice])
    mine = Agent.objects.create(account=acme, kind="test.chat", name="help", state={"v": 1})
    theirs = Agent.objects.create(account=other, kind="test.chat", name="help")

    # then each reads the agent of the account it names, or of their default, with the account
    found = member_agent(user=users.alice, kind="test.chat", name="help", account=None)
    assert found == mine and found.state == {"v": 1} and found.account == acme
    assert found.created_at == Agent.objects.get(pk=mine.pk).created_at
    assert member_agent(user=users.alice, kind="test.chat", name="help", account="other") == theirs
    assert member_agent(user=users.bob, kind="test.chat", name="help", account=None) == mine
    assert member_agent(user=users.bob, kind="test.chat", name="help", account="other") is None
    assert member_agent(user=users.mallory, kind="test.chat", name="help", account=None) is None
    assert member_agent(user=users.alice, kind="test.chat", name="nobody", account=None) is None


def test_a_submission_by_its_callers_key(users: Users, no_enqueue: NoEnqueue) -> None:
    from agents.statements import submission_by_key
    from agents.submissions import submission_create

    agent = chat_agent(users.alice)
    said = [{"role": "user", "content": "hi"}]
    first = submission_create(agent=agent, user=users.alice, messages=said, idempotency_key="k1").submission
    submission_create(agent=agent, user=users.alice, messages=said)  # no key: found by none

    found = submission_by_key(agent=agent, caller=f"user:{users.alice.pk}", key="k1")

    assert found == first and found.messages == said and found.metadata == {}
    assert found.status == Submission.objects.get(pk=first.pk).status == SubmissionStatus.RUNNING
    assert found.created_at == Submission.objects.get(pk=first.pk).created_at
    assert submission_by_key(agent=agent, caller="webhook:crm", key="k1") is None  # another caller's key
    assert submission_by_key(agent=agent, caller=f"user:{users.alice.pk}", key="") is None
