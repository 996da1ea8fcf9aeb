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
from agents.models import INBOX, TURN_OPEN, Agent, Chunk, Message, Submission, Turn, TurnStatus
from workflows.statements import insert_values, instance_from_row, prepared_cursor, update_instance, value_from_db

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


# A submission in its agent's inbox (models.INBOX), as SQL over the submissions' own columns.
INBOX_SQL = "turn_id IS NULL AND status = 'pending'"


def user_open_sql(user: str) -> str:
    """The open work of the user whose id is ``user`` (a placeholder, or a column): their turns not
    ended, over every agent, and their submissions still in an inbox (no turn yet). What
    AGENTS_MAX_OPEN_TURNS_PER_USER counts."""
    open_ = ", ".join(f"'{status}'" for status in TURN_OPEN)  # the enum's own values: no input reaches SQL
    return (
        f"(SELECT count(*) FROM {TURNS} WHERE requested_by_id = {user} AND status IN ({open_}))"
        f" + (SELECT count(*) FROM {SUBMISSIONS} WHERE submitted_by_id = {user} AND {INBOX_SQL})"
    )


def agent_pending_sql(agent: str) -> str:
    """The pending submissions of the agent whose id is ``agent``: AGENTS_MAX_PENDING_SUBMISSIONS."""
    return f"(SELECT count(*) FROM {SUBMISSIONS} WHERE agent_id = {agent} AND status = 'pending')"


def _computed(by_token: bool) -> dict[str, str]:
    """The columns of an inbox row that its INSERT computes rather than takes as values. On
    PostgreSQL the time it is accepted is the database's (the inbox is queued in that order, and
    web servers' clocks differ; the SQLite demo has one web process). ``by_token``: the agent, the
    submitter and the caller come from the API token."""
    accepted_at = {"created_at": "statement_timestamp()"} if _postgresql() else {}
    return {**accepted_at, **(BY_TOKEN if by_token else {})}


@functools.cache
def _inbox_insert_sql(by_token: bool, user_capped: bool, pending_capped: bool) -> str:
    """INSERT … SELECT of an inbox row, under the caps (their limits the last placeholders), ON
    CONFLICT DO NOTHING; RETURNING its agent and acceptance time. ``by_token``: from the API token
    (``_token_agent_sql``: its key, the kind and the name are the placeholders after the values)."""
    db = connections[DEFAULT_DB_ALIAS]
    computed = _computed(by_token)
    # A SELECT's values are typed on PostgreSQL: only an INSERT's VALUES take their columns' types.
    typed = "%s::{}" if _postgresql() else "%s"
    values = ", ".join(computed.get(f.name, typed.format(f.db_type(db))) for f in Submission._meta.concrete_fields)
    user, agent = ("t.user_id", "a.id") if by_token else ("%s", "%s")
    caps = (f" AND {user_open_sql(user)} < %s" if user_capped else "") + (
        f" AND {agent_pending_sql(agent)} < %s" if pending_capped else ""
    )
    columns = ", ".join(str(f.column) for f in Submission._meta.concrete_fields)
    source = f" FROM {_token_agent_sql()}" if by_token else ""
    return (
        f"INSERT INTO {SUBMISSIONS} ({columns}) SELECT {values}{source} "
        f"WHERE TRUE{caps} ON CONFLICT DO NOTHING RETURNING agent_id, created_at"
    )


# What the caller's API token decides in ``accept_by_token``.
BY_TOKEN = {"agent": "a.id", "submitted_by": "t.user_id", "caller": "'user:' || t.user_id"}
CREATED_AT = Submission._meta.get_field("created_at")


def _inbox_insert(
    submission: Submission, *, by_token: bool, user_capped: bool, pending_capped: bool, params: list[Any]
) -> int | None:
    """Run ``_inbox_insert_sql`` with ``submission``'s values and then ``params``; its agent's id,
    or None if it stored nothing."""
    db = connections[DEFAULT_DB_ALIAS]
    computed = _computed(by_token)
    values = insert_values(db, submission, [f for f in Submission._meta.concrete_fields if f.name not in computed])
    with prepared_cursor() as cursor:
        cursor.execute(_inbox_insert_sql(by_token, user_capped, pending_capped), values + params)
        row = cursor.fetchone()
    if row is None:
        return None
    submission.agent_id, submission.created_at = row[0], value_from_db(db, CREATED_AT, row[1])
    submission._state.adding, submission._state.db = False, db.alias
    return int(row[0])


def insert_inbox(submission: Submission, *, user_limit: int, pending_limit: int) -> bool:
    """Store ``submission`` (accepted, no turn yet) in one autocommit statement, unless its caller
    has a submission of the agent under its idempotency key already (ON CONFLICT DO NOTHING: a
    concurrent insert of the key is waited for), or a cap is reached: the agent's pending
    submissions at ``pending_limit``, the submitter's open work (``user_open_sql``) at
    ``user_limit`` (0: no cap). False if it stored nothing; the caller tells which from the key.
    Its ``created_at`` is the database's clock (on PostgreSQL).

    The caps are counted in the statement's snapshot, without a lock: submissions accepted at the
    same moment are not counted against each other, so a cap is passed by at most as many as are
    accepted at once (the servers' request threads bound that)."""
    user_capped = bool(user_limit) and submission.submitted_by_id is not None
    params = [submission.submitted_by_id, submission.submitted_by_id, user_limit] if user_capped else []
    params += [submission.agent_id, pending_limit] if pending_limit else []
    inserted = _inbox_insert(
        submission, by_token=False, user_capped=user_capped, pending_capped=bool(pending_limit), params=params
    )
    return inserted is not None


def _token_agent_sql() -> str:
    """FROM the API token ``t`` (the first placeholder: its key), its active user ``u``, and the
    agent ``a`` (then its kind and name) of that user's default account: their earliest membership,
    as ``member_agent`` reads it without ?account=."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    tokens, users = Token._meta.db_table, get_user_model()._meta.db_table
    account = (
        f"SELECT m.account_id FROM {MEMBERSHIPS} m WHERE m.user_id = t.user_id ORDER BY m.created_at, m.id LIMIT 1"
    )
    return (
        f"{tokens} t INNER JOIN {users} u ON u.id = t.user_id AND u.is_active AND t.key = %s "
        f"INNER JOIN {AGENTS} a ON a.account_id = ({account}) AND a.kind = %s AND a.name = %s"
    )


def accept_by_token(
    submission: Submission, *, token: str, kind: str, name: str, user_limit: int, pending_limit: int
) -> int | None:
    """Store ``submission`` (its agent, submitter and caller left unset) in the inbox of the agent
    ``kind``/``name`` of the default account of the active user whose API token is ``token``, in one
    autocommit statement, as ``insert_inbox`` would for that user and agent: unless the caller's
    key has a submission of the agent already, or a cap is reached. The agent's id, or None if it
    stored nothing (no such token, user, agent; a retry; a cap): the caller then answers the way
    the API always does. PostgreSQL only (None elsewhere)."""
    if not _postgresql():
        return None
    params: list[Any] = [token, kind, name]
    params += [user_limit] if user_limit else []
    params += [pending_limit] if pending_limit else []
    return _inbox_insert(
        submission, by_token=True, user_capped=bool(user_limit), pending_capped=bool(pending_limit), params=params
    )


@functools.cache
def _by_token_and_key_sql() -> str:
    return (
        f"SELECT s.id, s.status, s.fingerprint FROM {_token_agent_sql()} INNER JOIN {SUBMISSIONS} s "
        "ON s.agent_id = a.id AND s.caller = 'user:' || t.user_id AND s.idempotency_key = %s"
    )


def submission_by_token_and_key(*, token: str, kind: str, name: str, key: str) -> tuple[UUID, str, str] | None:
    """The id, status and fingerprint of the submission under idempotency ``key`` of the caller
    whose token is ``token`` (as ``accept_by_token`` reads token, user and agent), to the agent
    ``kind``/``name``; None if there is none. One prepared statement; PostgreSQL only."""
    if not _postgresql() or not key:
        return None
    with prepared_cursor() as cursor:
        cursor.execute(_by_token_and_key_sql(), [token, kind, name, key])
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1], row[2])


def inbox_locked(agent: Agent) -> list[Submission]:
    """The agent's submissions still in its inbox (accepted, no turn yet), oldest first, their rows
    locked (inside atomic(), the agent's row locked first: the queue's lock order)."""
    return list(Submission.objects.select_for_update().filter(INBOX, agent=agent).order_by("created_at", "id"))
