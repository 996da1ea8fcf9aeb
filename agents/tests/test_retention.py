"""``manage.py agents purge-chunks``: the streams of turns ended long ago go, their answers stay."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from accounts.services import account_ensure
from agents.models import Agent, Chunk, Message, MessageRole, Turn, TurnStatus
from agents.selectors import agent_get
from tests.factories import Users

pytestmark = pytest.mark.django_db


def turn_with_stream(
    agent: Agent | None, number: int, status: str, *, ended_days_ago: float | None, chunks: int
) -> Turn:
    finished = timezone.now() - timedelta(days=ended_days_ago) if ended_days_ago is not None else None
    assert agent is not None
    turn = Turn.objects.create(agent=agent, number=number, status=status, finished_at=finished, text=f"answer {number}")
    Chunk.objects.bulk_create(
        Chunk(turn=turn, seq=i + 1, type="text-delta", data={"delta": f"w{i} "}) for i in range(chunks)
    )
    Message.objects.create(agent=turn.agent, turn=turn, role=MessageRole.ASSISTANT, text=f"answer {number}")
    return turn


def purge(*args: str) -> str:
    out = StringIO()
    call_command("agents", "purge-chunks", *args, stdout=out)
    return out.getvalue()


def test_purge_deletes_only_the_streams_of_turns_ended_before_the_cutoff(users: Users) -> None:
    # given turns ended 40 and 10 days ago, and a turn still running that began long ago
    account_ensure(slug="acme", members=[users.alice])
    agent = agent_get(user=users.alice, kind="test.chat", name="help")
    old = turn_with_stream(agent, 1, TurnStatus.COMPLETED, ended_days_ago=40, chunks=3)
    recent = turn_with_stream(agent, 2, TurnStatus.CANCELLED, ended_days_ago=10, chunks=2)
    running = turn_with_stream(agent, 3, TurnStatus.RUNNING, ended_days_ago=None, chunks=4)
    Turn.objects.filter(pk=running.pk).update(created_at=timezone.now() - timedelta(days=90))

    # when an operator counts first, then purges with the default (30 days)
    counted = purge("--dry-run")
    assert Chunk.objects.count() == 9
    done = purge()

    # then only the old ended turn's stream is gone; every answer and every turn stays
    assert "Would delete 3 chunk(s) of 1 turn(s)" in counted and "Dry run: nothing was deleted." in counted
    assert "Deleted 3 chunk(s) of 1 turn(s)" in done and "older than 30d" in done
    assert not Chunk.objects.filter(turn=old).exists()
    assert Chunk.objects.filter(turn=recent).count() == 2 and Chunk.objects.filter(turn=running).count() == 4
    assert Turn.objects.get(pk=old.pk).text == "answer 1"
    assert Message.objects.filter(turn=old).exists()

    # and a shorter age reaches the recent one too, never the running one
    assert "Deleted 2 chunk(s) of 1 turn(s)" in purge("--older-than", "7d")
    assert Chunk.objects.filter(turn=running).count() == 4


def test_each_turns_stream_goes_whole_in_one_statement(users: Users, monkeypatch: pytest.MonkeyPatch) -> None:
    from agents import services
    from tests.support import statements_sent

    # given three old turns with streams of 5, 1 and 4 chunks, purged a turn at a time
    account_ensure(slug="acme", members=[users.alice])
    agent = agent_get(user=users.alice, kind="test.chat", name="help")
    for number, chunks in ((1, 5), (2, 1), (3, 4)):
        turn_with_stream(agent, number, TurnStatus.COMPLETED, ended_days_ago=40, chunks=chunks)
    monkeypatch.setattr(services, "PURGE_TURNS", 1)

    with statements_sent() as sent:
        done = purge()

    # then every chunk is gone, and each DELETE of chunks took one turn's whole stream
    assert "Deleted 10 chunk(s) of 3 turn(s)" in done and not Chunk.objects.exists()
    deletes = [sql for sql in sent if sql.startswith("DELETE") and "agents_chunk" in sql]
    assert len(deletes) == 3 and all("turn_id" in sql for sql in deletes), deletes


def test_a_bad_age_is_a_usage_error() -> None:
    with pytest.raises(CommandError, match="not a duration"):
        purge("--older-than", "soon")


def test_an_age_of_dashes_is_a_usage_error() -> None:
    """Python 3.11's argparse reads --older-than=-- as an empty list, which a comparison with a date
    then broke on: every project command's parser refuses it (workflows.management.base)."""
    with pytest.raises(CommandError, match="--older-than cannot take '--' as its value"):
        purge("--older-than=--")


def test_a_negative_age_is_refused_with_the_reason() -> None:
    # "-5d" after its option: argparse alone took it for an option and said "expected one argument"
    for args in (("--older-than", "-5d"), ("--older-than=-5d",)):
        with pytest.raises(CommandError, match="--older-than: '-5d' is not a duration"):
            purge(*args)


def test_an_age_of_zero_is_refused() -> None:
    """It would take the stream of every turn that has ended: the other purges refuse it too."""
    with pytest.raises(CommandError, match="more than zero"):
        purge("--older-than", "0d")
