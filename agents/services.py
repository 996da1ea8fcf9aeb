"""Writes: messages, turns and their queue, the agent's state. Each runs in one transaction.

The agent's row is the queue's lock: every service that queues, starts or ends a turn locks it
first (``select_for_update``), so two messages sent at once get consecutive numbers in the order
they locked, and the check "no turn of this agent is open" and the start of the next turn cannot
interleave: one agent never runs two turns at once.

Lock order, everywhere: the turn's run row, then the agent row (``workflows.run_terminate`` locks
the run before its hooks run, and the turn's last step share-locks the run before the agent).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from accounts.models import Account
from agents import fibers, streams
from agents.chunks import append_unfenced
from agents.models import (
    SUBMISSION_OF_TURN,
    TURN_ACTIVE,
    TURN_ENDED,
    TURN_FINISH_REASONS,
    TURN_OPEN,
    Agent,
    Chunk,
    Fiber,
    FiberStatus,
    Message,
    MessageRole,
    Submission,
    Turn,
    TurnStatus,
)
from agents.registry import get_agent_class
from agents.selectors import (
    NAME_RULE,
    message_data,
    reachable_name,
    turn_data,
    turn_partial_text,
    turn_stopped_messages,
)
from agents.statements import INBOX_SQL, inbox_locked, oldest_queued, save_end, user_open_sql
from workflows.exceptions import InvalidPayload, TransitionNotAllowed
from workflows.models import RunStatus, WorkflowRun
from workflows.outbox import on_commit
from workflows.services import check_json_size, check_text, run_start, run_terminate
from workflows.statements import insert_instance, prepared_cursor, update_instance
from workflows.storable import text_problem

logger = logging.getLogger("agents")

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from agents.fibers import FiberContext

TURN_WORKFLOW = "agents.turn"


class InvalidMessage(InvalidPayload):
    """The message cannot be sent (empty, too long, or text PostgreSQL cannot store): a 400."""


class TurnNotStoppable(TransitionNotAllowed):
    """The turn has ended already: a 409."""


class TooManyQueuedTurns(Exception):
    """The agent has AGENTS_MAX_QUEUED_TURNS turns queued already: a 429 (an error frame on the socket)."""


class AgentUnavailable(Exception):
    """``agent_open`` cannot name an agent: no such account, an unregistered kind, a bad name."""


def agent_open(*, account: str, kind: str, name: str) -> Agent:
    """The agent ``(account, kind, name)`` for a caller that acts for the account rather than as a
    member of it (``manage.py agents submit``, a webhook source's submission action, a schedule),
    created on first use. AgentUnavailable, with nothing created, if the account does not exist,
    the kind is not registered or no path could name the agent."""
    if get_agent_class(kind) is None:
        raise AgentUnavailable(f"no agent kind {kind!r} is registered (see `manage.py agents list`)")
    if not reachable_name(name):
        raise AgentUnavailable(f"an agent's name is {NAME_RULE}")
    found = Account.objects.filter(slug=account).first()
    if found is None:
        raise AgentUnavailable(f"no account {account!r}")
    agent, _ = Agent.objects.get_or_create(account=found, kind=kind, name=name)
    agent.account = found
    return agent


# --- pushes -------------------------------------------------------------------------------------------
def push_turn(turn: Turn) -> None:
    """Push the turn to its agent's sockets once the transaction commits, and log its new state
    (every change of a turn's status is pushed through here); never its text."""
    streams.push_later(turn.agent_id, {"type": "agent.turn", "turn": turn_data(turn)})
    extra = {
        "event": f"turn.{turn.status}",
        "turn_id": str(turn.pk),
        "agent_id": turn.agent_id,
        "run_id": str(turn.run_id) if turn.run_id else None,
        "status": turn.status,
    }
    on_commit(lambda: logger.info("turn %s of agent %s: %s", extra["turn_id"], turn.agent_id, turn.status, extra=extra))


def push_message(message: Message) -> None:
    streams.push_later(message.agent_id, {"type": "agent.message", "message": message_data(message)})


# --- messages and the queue ---------------------------------------------------------------------------
def check_message(text: Any) -> str:
    """The text to send, or InvalidMessage."""
    if not isinstance(text, str):
        raise InvalidMessage("the message must be text")
    if not text.strip():
        raise InvalidMessage("the message is empty")
    limit = int(settings.AGENTS_MAX_MESSAGE_CHARS)
    if len(text) > limit:
        raise InvalidMessage(f"the message is {len(text):,} characters; the limit is {limit:,}")
    if (problem := text_problem(text)) is not None:
        raise InvalidMessage(f"the message contains {problem}")
    return text


def lock_agent(agent: Agent) -> Agent:
    return Agent.objects.select_for_update().get(pk=agent.pk)


def message_send(*, agent: Agent, user: User | None, text: str, source: str = "chat") -> Turn:
    """Write the user's message and its turn; start the turn now if no turn of the agent is open,
    else leave it queued behind them (FIFO). Pushes ``agent.message`` and ``agent.turn``.
    TooManyQueuedTurns, with nothing stored, past AGENTS_MAX_OPEN_TURNS_PER_USER open turns of the
    user or AGENTS_MAX_QUEUED_TURNS queued turns of the agent.

    The customer waits for this (a socket's ack, the API's 202), and every statement is a round
    trip: the user's and the agent's locks, one query for what is open, the run, the turn, the
    message (``agents/tests/test_services.py`` counts them)."""
    text = check_message(text)
    with transaction.atomic():
        lock_queue(agent, user)
        queue = queue_locked(agent, user=user)
        check_open_turns(queue)
        check_queued_turns(queue)
        turn = turn_add_locked(agent=agent, queue=queue, user=user, source=source)
        message = Message(agent=agent, turn=turn, role=MessageRole.USER, text=text, author=user)
        insert_instance(message)
        push_message(message)
        push_turn(turn)
        if turn.status == TurnStatus.QUEUED and not queue.active:
            start_oldest_locked(agent)  # turns were queued with none active: a start that never happened
    return turn


@dataclass(frozen=True)
class Queue:
    """What is open when a new turn joins an agent's queue, counted in one query after the locks."""

    active: int  # the agent's running or waiting turns: at most one
    queued: int
    queued_chat: int  # the chat's own queued turns (submissions have their own cap)
    queued_submissions: int  # submissions' queued turns: the agent's pending submissions
    last_number: int  # the agent's highest turn number (0: none yet)
    user_open: int  # the user's open turns over every agent, and submissions in inboxes (0 unless capped)


def queue_locked(agent: Agent, *, user: User | None = None) -> Queue:
    """The agent's queue before a new turn joins it (inside atomic(), the agent row locked, and the
    user's if ``user`` is given: ``lock_queue``), once any active turn whose run ended without ending
    it is repaired (``repair_locked``): a turn it ends lets the queue move before it is counted.

    Submissions waiting in the agent's inbox (accepted over HTTP, not numbered yet) are queued
    first (``queue_inbox_locked``), so a turn counted after them never passes them: the queue stays
    in the order things were accepted.

    One statement, after the locks (so it sees what the transactions it waited for committed): the
    agent's open turns only (the index of the agent's turns by status, however many ended; a
    numbered submission is pending exactly while its turn is queued), its last number, its inbox,
    and the user's open work (turns, and submissions in an inbox) when their cap is on."""
    capped = user is not None and int(settings.AGENTS_MAX_OPEN_TURNS_PER_USER) > 0
    user_id = user.pk if capped and user is not None else None
    with prepared_cursor() as cursor:  # planned once per connection: every message comes here
        cursor.execute(QUEUE_SQL, [agent.pk, user_id, user_id, agent.pk, agent.pk])
        active, queued, queued_chat, queued_submissions, stuck, last_number, user_open, inbox = cursor.fetchone()
    if stuck:
        repair_locked(agent)
        return queue_locked(agent, user=user)
    if inbox:
        queue_inbox_locked(agent, last_number=last_number or 0)
        return queue_locked(agent, user=user)
    return Queue(active, queued, queued_chat, queued_submissions, last_number or 0, user_open or 0)


def queue_inbox_locked(agent: Agent, *, last_number: int) -> int:
    """Give each submission in the agent's inbox its turn, queued after turn ``last_number`` in the
    order they were accepted (inside atomic(), the agent's row locked). Returns how many."""
    inbox = inbox_locked(agent)
    for number, submission in enumerate(inbox, start=last_number + 1):
        requested_by = submission.submitted_by_id
        turn = Turn(id=uuid.uuid4(), agent=agent, number=number, requested_by_id=requested_by, source=SUBMISSION_SOURCE)
        insert_instance(turn)
        submission.turn = turn
        update_instance(submission, ("turn",))
        push_turn(turn)
    return len(inbox)


def _in(values: list[TurnStatus] | list[RunStatus]) -> str:
    return ", ".join(f"'{value}'" for value in values)  # the enums' own values: no input reaches SQL


SUBMISSION_SOURCE = "submission"  # a turn that answers a submission (its source)

# A turn's run in one of these and the turn still active: the run ended without ending it.
RUN_ENDED = [RunStatus.FAILED, RunStatus.COMPLETED]
TURNS, RUNS, SUBMISSIONS = Turn._meta.db_table, WorkflowRun._meta.db_table, Submission._meta.db_table
# Aggregates without GROUP BY give one row even for no open turn; the scalar subqueries run once.
QUEUE_SQL = f"""
SELECT count(*) FILTER (WHERE t.status IN ({_in(TURN_ACTIVE)})),
       count(*) FILTER (WHERE t.status = '{TurnStatus.QUEUED}'),
       count(*) FILTER (WHERE t.status = '{TurnStatus.QUEUED}' AND t.source = 'chat'),
       count(*) FILTER (WHERE t.status = '{TurnStatus.QUEUED}' AND t.source = '{SUBMISSION_SOURCE}'),
       count(*) FILTER (WHERE t.status IN ({_in(TURN_ACTIVE)}) AND r.status IN ({_in(RUN_ENDED)})),
       (SELECT max(number) FROM {TURNS} WHERE agent_id = %s),
       {user_open_sql("%s")},
       (SELECT count(*) FROM {SUBMISSIONS} WHERE agent_id = %s AND {INBOX_SQL})
FROM {TURNS} t LEFT JOIN {RUNS} r ON r.id = t.run_id
WHERE t.agent_id = %s AND t.status IN ({_in(TURN_OPEN)})
"""


def turn_add_locked(*, agent: Agent, queue: Queue, user: User | None, source: str) -> Turn:
    """The agent's next turn (inside atomic(), the agent row locked, ``queue`` as it was before it):
    inserted as it is, running with its run, if no turn is open; else queued behind them (FIFO).
    Not pushed: the caller pushes it after the rows that come with it."""
    fields: dict[str, Any] = {
        "id": uuid.uuid4(),
        "agent": agent,
        "number": queue.last_number + 1,
        "requested_by": user,
        "source": source,
    }
    if not (queue.active or queue.queued):
        # Its run first (the payload names the turn), so the turn's row is written once.
        run, _ = run_start(workflow=TURN_WORKFLOW, payload={"turn": str(fields["id"])}, owner=user, queue=turn_queue())
        fields.update(status=TurnStatus.RUNNING, run=run, started_at=timezone.now())
    turn = Turn(**fields)
    insert_instance(turn)
    return turn


def start_new_locked(turn: Turn, queue: Queue) -> None:
    """After ``turn`` joined the agent's queue (``queue``: as it was before): start it now if no
    turn was open, as the oldest queued turn it is. Else it waits (FIFO), or, should turns be queued
    with none active (a start that failed to happen), the oldest starts and ``turn`` is read again."""
    if queue.active:
        return
    if not queue.queued:
        start_locked(turn)
        return
    start_next_locked(turn.agent)
    turn.refresh_from_db()


def lock_queue(agent: Agent, user: User | None) -> None:
    """Lock what a new turn of ``agent`` sent by ``user`` is counted under (inside atomic()): the
    user's row when their open turns are capped, then the agent's row, the queue's lock (the lock
    order), in one statement: a statement locks the rows of its FROM list in order.

    Both rows FOR NO KEY UPDATE: the inserts that reference them take KEY SHARE on them, which a
    plain FOR UPDATE would block. A message holding the agent's lock would deadlock with an insert
    referencing the user; and a submission accepted into the inbox, which takes no lock but its
    key's index entry and then KEY SHARE on the agent at commit, would deadlock with
    ``agents.submit`` inserting the same key under the agent's lock. (SQLite, the demo, has no row
    locks: its transactions take the database's write lock when they begin.)"""
    if connection.vendor != "postgresql":
        return
    capped = user is not None and int(settings.AGENTS_MAX_OPEN_TURNS_PER_USER) > 0
    with prepared_cursor() as cursor:  # planned once per connection: every message comes here
        if capped and user is not None:
            cursor.execute(LOCK_USER_AND_AGENT_SQL, [user.pk, agent.pk])
        else:
            cursor.execute(LOCK_AGENT_SQL, [agent.pk])
        if cursor.fetchone() is None:
            raise Agent.DoesNotExist(f"agent {agent.pk} is gone")


USERS, AGENTS = get_user_model()._meta.db_table, Agent._meta.db_table
LOCK_USER_AND_AGENT_SQL = f"SELECT 1 FROM {USERS} u, {AGENTS} a WHERE u.id = %s AND a.id = %s FOR NO KEY UPDATE OF u, a"
LOCK_AGENT_SQL = f"SELECT 1 FROM {AGENTS} a WHERE a.id = %s FOR NO KEY UPDATE"


def check_open_turns(queue: Queue) -> None:
    """TooManyQueuedTurns if the user has AGENTS_MAX_OPEN_TURNS_PER_USER turns not ended, over all
    the agents they reach: one member opening agent after agent must not take every worker from
    every other tenant. ``queue`` counted with the user's row locked (``lock_queue``), so messages
    sent together are counted one after the other."""
    limit = int(settings.AGENTS_MAX_OPEN_TURNS_PER_USER)
    if limit and queue.user_open >= limit:
        raise TooManyQueuedTurns(
            f"you have {queue.user_open} messages waiting for an answer already (the limit is {limit}); "
            "send more once some have been answered"
        )


def check_queued_turns(queue: Queue) -> None:
    """TooManyQueuedTurns if the agent has AGENTS_MAX_QUEUED_TURNS turns queued: a member sending
    messages in a loop must not pile up answers nobody waits for. ``queue`` counted with the agent
    row locked, so messages sent together are counted one after the other."""
    limit = int(settings.AGENTS_MAX_QUEUED_TURNS)
    # The chat's own: submissions from other systems have their cap (AGENTS_MAX_PENDING_SUBMISSIONS).
    queued = queue.queued_chat
    if limit and queued >= limit:
        raise TooManyQueuedTurns(
            f"{queued} messages are waiting for an answer already (the limit is {limit}); "
            "send more once some have been answered"
        )


RUN_FAILED_MESSAGE = "Sorry: something went wrong and this answer could not be finished. Please try again."


def repair_locked(agent: Agent) -> None:
    """End as failed the active turns whose run ended without ending them (the engine failed it
    before its workflow ran: too many lost workers, say), so the queue moves on: from the hook on
    ``on_run_failed``, and at each message for a turn whose hook never ran (its worker died between
    the failure and the hook). Call inside atomic() with the agent row locked."""
    stuck = Turn.objects.select_related("agent", "run").filter(
        agent=agent, status__in=TURN_ACTIVE, run__status__in=RUN_ENDED
    )
    for turn in stuck:
        assert turn.run is not None
        append_unfenced(turn=turn, type_="data-notice", data={"text": RUN_FAILED_MESSAGE})
        why = str((turn.run.error or {}).get("message") or turn.run.failure_reason or turn.run.status)
        end_locked(turn, status=TurnStatus.FAILED, reason=f"its run ended: {why}", finish=True)


def on_run_failed(run: WorkflowRun) -> None:
    """The hook (``workflows.hooks.on_run_failed``): the engine failed a turn's run where the
    workflow could not end the turn itself (too many lost workers, say); the turn fails with a
    notice the customer reads, its stream is finished and the next queued turn starts, now rather
    than at the agent's next message. Inside the hook's transaction: the run's row, then the agent's."""
    agent_id = Turn.objects.filter(run=run, status__in=TURN_ACTIVE).values_list("agent_id", flat=True).first()
    if agent_id is not None:
        repair_locked(Agent.objects.select_for_update().get(pk=agent_id))


def start_next_locked(agent: Agent) -> Turn | None:
    """Start the agent's oldest queued turn if none is running or waiting. Call inside atomic() with
    the agent row locked. Returns the turn started, or None."""
    if Turn.objects.filter(agent=agent, status__in=TURN_ACTIVE).exists():
        return None
    return start_oldest_locked(agent)


def start_oldest_locked(agent: Agent) -> Turn | None:
    """Start the agent's oldest queued turn, knowing none is active (inside atomic(), the agent row
    locked). Returns the turn started, or None."""
    turn = oldest_queued(agent)
    return start_locked(turn) if turn is not None else None


def turn_queue() -> str | None:
    """The queue a turn's run advances on: AGENTS_TURN_QUEUE, or (None) the workflows' own."""
    return settings.AGENTS_TURN_QUEUE or None


def start_locked(turn: Turn) -> Turn:
    """Start ``turn``, its agent's oldest queued turn, with no turn of the agent active (inside
    atomic(), the agent row locked): its run is created and enqueued on commit."""
    run, _ = run_start(workflow=TURN_WORKFLOW, payload={"turn": str(turn.pk)}, owner=_user(turn), queue=turn_queue())
    turn.begin()
    turn.run = run
    turn.started_at = timezone.now()
    turn.save(update_fields=["status", "run", "started_at"])
    if turn.source == SUBMISSION_SOURCE:
        submission_started_locked(turn)
    push_turn(turn)
    return turn


def submission_started_locked(turn: Turn) -> None:
    """The submission's turn starts: its messages join the conversation now (never while it waits,
    so a submission cancelled before its turn leaves no trace there), and it is running."""
    submission = Submission.objects.select_for_update().get(turn=turn)
    submission.begin()
    submission.delivered_at = turn.started_at
    submission.save(update_fields=["status", "delivered_at"])
    for item in submission.messages:
        message = Message.objects.create(
            agent_id=turn.agent_id,
            turn=turn,
            role=MessageRole.USER,
            text=item["content"],
            author_id=submission.submitted_by_id,
        )
        push_message(message)


def submission_ended_locked(turn: Turn) -> None:
    """The submission's turn ended: so does the submission (SUBMISSION_OF_TURN)."""
    submission = Submission.objects.select_for_update().filter(turn=turn).first()
    if submission is None or submission.is_ended:
        return
    submission.end(SUBMISSION_OF_TURN[TurnStatus(turn.status)])
    submission.finished_at = timezone.now()
    submission.save(update_fields=["status", "finished_at"])


def _user(turn: Turn) -> Any:
    return turn.requested_by


def end_locked(turn: Turn, *, status: str, reason: str, text: str | None = None, finish: bool = False) -> None:
    """End an open turn (inside atomic(), its agent row locked): take the transition, write why, write
    the ``finish`` chunk (``TURN_FINISH_REASONS``) if ``finish``, push, and start the next queued turn."""
    transition = {
        TurnStatus.COMPLETED: turn.complete,
        TurnStatus.CANCELLED: turn.cancel,
        TurnStatus.SEALED: turn.seal,
        TurnStatus.FAILED: turn.fail,
    }[TurnStatus(status)]
    was_active = turn.status in TURN_ACTIVE
    transition()
    turn.end_reason = reason[:500]
    if text is not None:
        turn.text = text
    turn.finished_at = timezone.now()
    save_end(turn)
    if turn.source == SUBMISSION_SOURCE:
        submission_ended_locked(turn)
    if finish:
        append_unfenced(turn=turn, type_="finish", data={"reason": TURN_FINISH_REASONS[status]})
    push_turn(turn)
    if was_active:  # the agent's one running or waiting turn (start_next_locked starts no second): none is now
        start_oldest_locked(turn.agent)
    else:
        start_next_locked(turn.agent)


def turn_stop(*, turn: Turn, user: User | None) -> Turn:
    """Stop a turn for good: a queued one is cancelled; a running or waiting one has its run
    terminated (its worker writes nothing more; a restart does not revive it) and is cancelled.
    Either way a ``finish`` chunk ``{"reason": "stopped"}`` ends its stream and the next queued turn
    starts. An ended turn is refused (TurnNotStoppable)."""
    for _ in range(5):
        stopped = _turn_stop_once(turn=turn, user=user)
        if stopped is not None:
            return stopped
    raise TurnNotStoppable("the turn kept changing while it was being stopped; try again", status=turn.status)


def _turn_stop_once(*, turn: Turn, user: User | None) -> Turn | None:
    """One try of turn_stop; None if the turn's run changed between its first read and the locks
    (a queued turn started meanwhile: its new run must be locked and terminated too, so try again)."""
    with transaction.atomic():
        run_id = Turn.objects.filter(pk=turn.pk).values_list("run_id", flat=True).first()
        run = WorkflowRun.objects.select_for_update().filter(pk=run_id).first() if run_id else None  # before the agent
        lock_agent(turn.agent)
        turn = Turn.objects.select_related("agent").get(pk=turn.pk)
        if turn.run_id != run_id:
            return None
        if turn.status not in TURN_OPEN:
            raise TurnNotStoppable(f"the turn has ended ({turn.status})", status=turn.status)
        who = getattr(user, "username", "") or "someone"
        active = turn.status in TURN_ACTIVE
        # The turn first, then its run (both locked, so its worker writes nothing between them): the
        # terminate hook below then finds the turn ended, and the one push of its end says who.
        end_stopped_locked(turn, reason=f"stopped by {who}")
        if active and run is not None and not run.is_terminal:
            run_terminate(run_id=run.pk)
    return turn


def on_run_terminated(run: WorkflowRun) -> None:
    """The hook (``workflows.hooks.on_run_terminated``): whoever terminated a turn's run (a stop, staff
    in the admin), the turn is cancelled, its stream finished, and the next queued turn starts."""
    turn = Turn.objects.filter(run=run).first()
    if turn is None or turn.status not in TURN_OPEN:
        return
    Agent.objects.select_for_update().get(pk=turn.agent_id)
    turn = Turn.objects.select_related("agent").get(pk=turn.pk)
    if turn.status in TURN_OPEN:
        end_stopped_locked(turn, reason="its run was terminated")


def end_stopped_locked(turn: Turn, *, reason: str) -> None:
    """Cancel an open turn that was stopped (inside atomic(), its agent row locked). What its
    stream showed so far stays in the conversation: its text, the tool calls whose results were
    stored and those results (a later turn's model knows a refund was asked for), the last
    message marked ``{"stopped": true}``; and the text as the turn's."""
    added = turn_stopped_messages(turn_id=turn.pk)
    for i, m in enumerate(added):
        stopped = {"stopped": True} if i == len(added) - 1 else {}
        if m["role"] == "assistant":
            parts = {**({"tool_calls": m["tool_calls"]} if m["tool_calls"] else {}), **stopped}
            row = Message.objects.create(
                agent_id=turn.agent_id, turn=turn, role=MessageRole.ASSISTANT, text=m["content"], parts=parts
            )
        else:
            parts = {"tool_call_id": m["tool_call_id"], "name": m["name"], "result": m["content"], **stopped}
            row = Message.objects.create(agent_id=turn.agent_id, turn=turn, role=MessageRole.TOOL, parts=parts)
        push_message(row)
    end_locked(turn, status=TurnStatus.CANCELLED, reason=reason, text=turn_partial_text(turn_id=turn.pk), finish=True)


# --- state ------------------------------------------------------------------------------------------
def _save_state(agent: Agent, state: dict[str, Any]) -> Agent:
    check_json_size(state, what="agent state")
    agent.state = state
    agent.state_version += 1
    agent.save(update_fields=["state", "state_version", "updated_at"])
    streams.push_later(agent.pk, {"type": "agent.state", "version": agent.state_version, "state": state})
    return agent


def agent_state_update(*, agent_id: int, state: dict[str, Any]) -> int:
    """Replace the agent's state; returns its new version. Pushes ``agent.state``."""
    if not isinstance(state, dict):
        raise InvalidPayload("an agent's state is a JSON object")
    with transaction.atomic():
        agent = Agent.objects.select_for_update().get(pk=agent_id)
        return int(_save_state(agent, state).state_version)


def agent_state_merge(*, agent_id: int, patch: dict[str, Any]) -> int:
    """Merge ``patch`` into the agent's state (top-level keys; a None value removes its key);
    returns the new version. Pushes ``agent.state``."""
    if not isinstance(patch, dict):
        raise InvalidPayload("an agent's state patch is a JSON object")
    with transaction.atomic():
        agent = Agent.objects.select_for_update().get(pk=agent_id)
        state = {**agent.state, **patch}
        state = {k: v for k, v in state.items() if v is not None}
        return int(_save_state(agent, state).state_version)


# --- fibers -----------------------------------------------------------------------------------------
def fiber_start(
    *,
    agent: Agent,
    name: str,
    fn: Callable[[FiberContext], Any] | str,
    input: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
    user: User | None = None,
) -> Fiber:
    """Write a fiber and start its ``agents.fiber`` run, in one commit (``agents.fibers``). ``fn`` is a
    module-level function or its ``module:name`` (InvalidFiber otherwise: a lambda, a closure).
    The same ``idempotency_key`` on the agent returns the fiber it started, whatever its status;
    with another name, function or input it raises FiberConflict. Pushes ``agent.fiber``."""
    path = fibers.fiber_path(fn)
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        raise fibers.InvalidFiber("a fiber's name is 1 to 100 characters")
    input = {} if input is None else input
    if not isinstance(input, dict):
        raise fibers.InvalidFiber("a fiber's input is a JSON object")
    check_json_size(input, what="a fiber's input")
    check_text(idempotency_key, what="idempotency key", max_length=255)
    key = idempotency_key or ""
    if key and (existing := Fiber.objects.filter(agent=agent, idempotency_key=key).first()) is not None:
        return _same_fiber(existing, name, path, input)
    try:
        with transaction.atomic():
            fibers.repair_locked(agent)
            fiber = Fiber.objects.create(
                agent=agent, name=name, fn=path, input=input, idempotency_key=key, requested_by=user
            )
            fiber.run, _ = run_start(workflow=fibers.FIBER_WORKFLOW, payload={"fiber": str(fiber.pk)}, owner=user)
            fiber.save(update_fields=["run"])
            fibers.push_fiber(fiber)
    except IntegrityError:
        if not key:
            raise
        return _same_fiber(
            Fiber.objects.get(agent=agent, idempotency_key=key), name, path, input
        )  # a concurrent start won
    return fiber


def _same_fiber(existing: Fiber, name: str, path: str, input: dict[str, Any]) -> Fiber:
    if (existing.name, existing.fn, existing.input) != (name, path, input):
        raise fibers.FiberConflict(
            f"idempotency key {existing.idempotency_key!r} was used for fiber {existing.name!r} "
            f"({existing.fn}) {existing.pk} with another name, function or input"
        )
    return existing


def fiber_cancel(*, fiber: Fiber, user: User | None = None) -> Fiber:
    """Cancel a fiber for good: its run is terminated (its function stores no more stashes: the
    next one raises FencedOut in it; a worker restart does not revive it). An ended fiber is refused
    (FiberNotCancellable). Pushes ``agent.fiber``."""
    with transaction.atomic():
        run_id = Fiber.objects.filter(pk=fiber.pk).values_list("run_id", flat=True).first()
        run = WorkflowRun.objects.select_for_update().filter(pk=run_id).first() if run_id else None  # before the fiber
        fiber = Fiber.objects.select_for_update().select_related("agent").get(pk=fiber.pk)
        if fiber.is_ended:
            raise fibers.FiberNotCancellable(f"the fiber has ended ({fiber.status})", status=fiber.status)
        if run is not None and not run.is_terminal:
            run_terminate(run_id=run.pk)  # its hook (fibers.on_run_terminated) cancels the fiber
            fiber.refresh_from_db()
        who = getattr(user, "username", "") or "someone"
        if fiber.status != FiberStatus.CANCELLED:
            fibers.end_locked(fiber, status=FiberStatus.CANCELLED, reason=f"cancelled by {who}")
        else:
            fiber.end_reason = f"cancelled by {who}"
            fiber.save(update_fields=["end_reason", "updated_at"])
            fibers.push_fiber(fiber)
    return fiber


# --- retention ------------------------------------------------------------------------------------------
PURGE_TURNS = 200  # turns whose streams one DELETE takes: each a short transaction, not one that holds the table


@dataclass(frozen=True)
class ChunkPurge:
    cutoff: datetime
    turns: int  # ended turns whose streams were (or would be) deleted
    chunks: int
    dry_run: bool


def chunks_purge(*, older_than: timedelta | None = None, dry_run: bool = False) -> ChunkPurge:
    """Delete the stored streams (chunks) of turns that ended before ``now - older_than`` (default
    AGENTS_CHUNK_RETENTION_DAYS). A turn's answer stays: its text and its messages are the
    conversation; only the replay of an old stream goes (a resume of such a turn replays nothing).
    Streams of open turns are never touched, whatever their age."""
    from ledger.services import retention_cutoff

    # ValueError for a period of zero or less, as every purge here: it would take every ended turn's.
    cutoff = retention_cutoff(older_than, default_days=int(settings.AGENTS_CHUNK_RETENTION_DAYS))
    old = Turn.objects.filter(status__in=TURN_ENDED, finished_at__lt=cutoff)
    chunks = Chunk.objects.filter(turn__in=old.values("pk"))
    if dry_run:
        return ChunkPurge(cutoff, chunks.values("turn_id").distinct().count(), chunks.count(), True)
    # A turn's stream goes whole, in one statement: never a stream left without its start (a purge
    # stopped midway, or read meanwhile), which a reader would take for the whole of it.
    turns = deleted = 0
    while True:
        batch = list(chunks.order_by().values_list("turn_id", flat=True).distinct()[:PURGE_TURNS])
        if not batch:
            break
        deleted += Chunk.objects.filter(turn__in=batch).delete()[0]
        turns += len(batch)
    return ChunkPurge(cutoff, turns, deleted, False)
