"""The hot statements of a turn on PostgreSQL, one prepared round trip each (through
``workflows.statements``); the SQLite demo takes the ORM's queries for the reads.

A turn's end runs the same few queries every time, and the ORM compiled each anew: about a third
of the worker's time between a message and its answer went into building SQL whose text never
changes.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import OuterRef, Subquery
from django.db.models.functions import Coalesce

from accounts.models import Account, Membership
from accounts.selectors import accounts_of
from agents.chunks import fenced, fenced_sql
from agents.models import Agent, Chunk, Message, Submission, Turn, TurnStatus
from workflows.statements import instance_from_row, prepared_cursor, update_instance, value_from_db

if TYPE_CHECKING:
    from django.contrib.auth.models import User

TURNS, AGENTS, CHUNKS, MESSAGES, SUBMISSIONS = (m._meta.db_table for m in (Turn, Agent, Chunk, Message, Submission))
ACCOUNTS, MEMBERSHIPS = Account._meta.db_table, Membership._meta.db_table
TURN_FIELDS = Turn._meta.concrete_fields
AGENT_FIELDS = Agent._meta.concrete_fields
ACCOUNT_FIELDS = Account._meta.concrete_fields
END_FIELDS = ("status", "end_reason", "text", "finished_at")


def _postgresql() -> bool:
    return connections[DEFAULT_DB_ALIAS].vendor == "postgresql"


def _turn_and_agent_columns() -> str:
    """The columns ``_turn_and_agent`` reads, of ``t`` (the turn) and ``a`` (its agent)."""
    return ", ".join([*(f"t.{f.column}" for f in TURN_FIELDS), *(f"a.{f.column}" for f in AGENT_FIELDS)])


@functools.cache
def _lock_sql() -> str:
    # As the ORM's select_related("agent").select_for_update(of=("agent",)) writes it: the fence
    # (which share-locks the run's row) is evaluated before the agent's row is locked.
    return (
        f"SELECT {_turn_and_agent_columns()} FROM {TURNS} t INNER JOIN {AGENTS} a ON t.agent_id = a.id "
        f"WHERE {fenced_sql()} AND t.id = %s FOR UPDATE OF a"
    )


def turn_locked_for_end(turn_id: UUID | str, *, run_id: UUID, owner: str) -> Turn | None:
    """Inside atomic(): the turn with its agent, the agent's row locked, if the run's lease is
    ``owner``'s (its row share-locked first); None, locking nothing, if it is not."""
    if not _postgresql():
        return (
            Turn.objects.select_related("agent")
            .select_for_update(of=("agent",))
            .filter(fenced(run_id, owner), pk=turn_id)
            .first()
        )
    with prepared_cursor() as cursor:
        cursor.execute(_lock_sql(), [run_id, owner, turn_id if isinstance(turn_id, UUID) else UUID(turn_id)])
        row = cursor.fetchone()
    if row is None:
        return None
    return _turn_and_agent(row)


def oldest_queued(agent: Agent) -> Turn | None:
    """The agent's oldest queued turn (inside atomic(), the agent row locked), or None."""
    if not _postgresql():
        return Turn.objects.filter(agent=agent, status=TurnStatus.QUEUED).order_by("number").first()
    with prepared_cursor() as cursor:
        columns = ", ".join(str(f.column) for f in TURN_FIELDS)
        cursor.execute(
            f"SELECT {columns} FROM {TURNS} WHERE agent_id = %s AND status = '{TurnStatus.QUEUED}' "
            "ORDER BY number LIMIT 1",
            [agent.pk],
        )
        row = cursor.fetchone()
    return None if row is None else instance_from_row(connections[DEFAULT_DB_ALIAS], Turn, row)


def save_end(turn: Turn) -> None:
    """Write the turn's status, end_reason, text and finished_at as they are in memory, as
    ``turn.save(update_fields=[...])`` would."""
    update_instance(turn, END_FIELDS)


def _turn_and_agent(row: Any) -> Turn:
    db = connections[DEFAULT_DB_ALIAS]
    turn = instance_from_row(db, Turn, row[: len(TURN_FIELDS)])
    turn.agent = instance_from_row(db, Agent, row[len(TURN_FIELDS) : len(TURN_FIELDS) + len(AGENT_FIELDS)])
    return turn


@functools.cache
def _turn_with_seq_sql() -> str:
    last = f"(SELECT c.seq FROM {CHUNKS} c WHERE c.turn_id = t.id ORDER BY c.seq DESC LIMIT 1)"
    return (
        f"SELECT {_turn_and_agent_columns()}, COALESCE({last}, 0) FROM {TURNS} t "
        f"INNER JOIN {AGENTS} a ON t.agent_id = a.id WHERE t.id = %s"
    )


def turn_with_seq(turn_id: UUID | str) -> tuple[Turn, int]:
    """The turn, its agent, and the last ``seq`` of its stream (0: none yet), in one query;
    Turn.DoesNotExist if there is no such turn."""
    if not _postgresql():
        last = Chunk.objects.filter(turn=OuterRef("pk")).order_by("-seq").values("seq")[:1]
        found = Turn.objects.select_related("agent").annotate(last_seq=Coalesce(Subquery(last), 0)).get(pk=turn_id)
        return found, int(getattr(found, "last_seq"))  # noqa: B009  # an annotation: no attribute to mypy
    with prepared_cursor() as cursor:
        cursor.execute(_turn_with_seq_sql(), [turn_id if isinstance(turn_id, UUID) else UUID(turn_id)])
        row = cursor.fetchone()
    if row is None:
        raise Turn.DoesNotExist(f"no turn {turn_id}")
    return _turn_and_agent(row), int(row[-1])


PARTS = Message._meta.get_field("parts")


def newest_messages(turn: Turn, limit: int) -> list[tuple[str, str, Any]]:
    """The ``limit`` newest messages (role, text, parts) of the agent's turns up to ``turn``'s
    number, newest first (a message without a turn is in none of them)."""
    if not _postgresql():
        return list(
            Message.objects.filter(agent_id=turn.agent_id, turn__number__lte=turn.number)
            .order_by("-turn__number", "-id")
            .values_list("role", "text", "parts")[:limit]
        )
    with prepared_cursor() as cursor:
        cursor.execute(
            f"SELECT m.role, m.text, m.parts FROM {MESSAGES} m INNER JOIN {TURNS} t ON m.turn_id = t.id "
            "WHERE m.agent_id = %s AND t.number <= %s ORDER BY t.number DESC, m.id DESC LIMIT %s",
            [turn.agent_id, turn.number, limit],
        )
        rows = cursor.fetchall()
    db = connections[DEFAULT_DB_ALIAS]
    return [(role, text, value_from_db(db, PARTS, parts)) for role, text, parts in rows]


@functools.cache
def _member_agent_sql(by_slug: bool) -> str:
    # The member's account: the one named, else their earliest membership (accounts.selectors.accounts_of).
    named = f" INNER JOIN {ACCOUNTS} n ON n.id = m.account_id AND n.slug = %s" if by_slug else ""
    account = (
        f"SELECT m.account_id FROM {MEMBERSHIPS} m{named} WHERE m.user_id = %s ORDER BY m.created_at, m.id LIMIT 1"
    )
    columns = ", ".join([*(f"a.{f.column}" for f in AGENT_FIELDS), *(f"c.{f.column}" for f in ACCOUNT_FIELDS)])
    return (
        f"SELECT {columns} FROM {AGENTS} a INNER JOIN {ACCOUNTS} c ON c.id = a.account_id "
        f"WHERE a.account_id = ({account}) AND a.kind = %s AND a.name = %s"
    )


def member_agent(*, user: User, kind: str, name: str, account: str | None) -> Agent | None:
    """The agent ``(kind, name)`` of the user's account (the one whose slug is ``account``, else
    their default), with its account read, if it exists; one prepared statement (every socket's
    connect and every API call of an agent asks)."""
    if not _postgresql():
        accounts = accounts_of(user) if account is None else accounts_of(user).filter(slug=account)
        return (
            Agent.objects.select_related("account")
            .filter(account=Subquery(accounts.values("pk")[:1]), kind=kind, name=name)
            .first()
        )
    params = [user.pk, kind, name] if account is None else [account, user.pk, kind, name]
    with prepared_cursor() as cursor:
        cursor.execute(_member_agent_sql(account is not None), params)
        row = cursor.fetchone()
    if row is None:
        return None
    db = connections[DEFAULT_DB_ALIAS]
    agent = instance_from_row(db, Agent, row[: len(AGENT_FIELDS)])
    agent.account = instance_from_row(db, Account, row[len(AGENT_FIELDS) :])
    return agent


@functools.cache
def _submission_by_key_sql() -> str:
    columns = ", ".join(str(f.column) for f in Submission._meta.concrete_fields)
    return f"SELECT {columns} FROM {SUBMISSIONS} WHERE agent_id = %s AND caller = %s AND idempotency_key = %s"


def submission_by_key(*, agent: Agent, caller: str, key: str) -> Submission | None:
    """The agent's submission with ``caller``'s idempotency ``key``, or None (always None for no
    key); one prepared statement (a retry is looked up before the queue is counted)."""
    if not key:
        return None
    if not _postgresql():
        return Submission.objects.filter(agent=agent, caller=caller, idempotency_key=key).first()
    with prepared_cursor() as cursor:
        cursor.execute(_submission_by_key_sql(), [agent.pk, caller, key])
        row = cursor.fetchone()
    return None if row is None else instance_from_row(connections[DEFAULT_DB_ALIAS], Submission, row)
