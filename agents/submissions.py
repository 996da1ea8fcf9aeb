"""Submissions: messages another system hands to an agent, durably and exactly once.

``submission_create`` stores the submission and its turn in one transaction (committed before
anything runs) and queues the turn behind the agent's others, chat messages included: the queue is
one, FIFO. An ``idempotency_key`` makes a retry safe: the same key and the same messages and
metadata return the first submission (``accepted`` False); the same key with anything else is an
IdempotencyConflict. The turn's start writes the messages into the conversation and the turn's end
ends the submission (``agents.services.submission_started_locked`` / ``submission_ended_locked``):
completed, cancelled, skipped (the turn was sealed: it waited too long) or error (it failed).
``submission_cancel`` stops a pending or running one through the turn's own stop.

The HTTP API accepts differently (``submission_accept``): the submission alone is stored, in one
statement, into the agent's inbox (pending, no turn yet), and a worker's task
(``submissions_queue``) gives it its turn. Anything that queues a turn of the agent queues the inbox
first (``agents.services.queue_locked``), so the order stays the order of acceptance; the sweep
(``submissions_sweep``) queues an inbox whose task was lost.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents import statements
from agents.models import INBOX, Agent, Submission, SubmissionStatus, Turn, TurnStatus
from agents.services import (
    SUBMISSION_SOURCE,
    Queue,
    TooManyQueuedTurns,
    check_message,
    check_open_turns,
    lock_queue,
    push_turn,
    queue_locked,
    start_new_locked,
    start_oldest_locked,
    turn_stop,
)
from workflows import outbox
from workflows.conf import conf as workflows_conf
from workflows.exceptions import IdempotencyConflict, InvalidPayload, TransitionNotAllowed
from workflows.services import check_json_size
from workflows.statements import insert_instance
from workflows.storable import text_problem

if TYPE_CHECKING:
    from django.contrib.auth.models import User

QUEUE_TASK = "agents.queue_submissions"  # agents/tasks.py
SWEEP_TASK = "agents.sweep_submissions"


class SubmissionNotCancellable(TransitionNotAllowed):
    """The submission has ended already: a 409 that says how (``status``)."""


@dataclass(frozen=True)
class SubmissionResult:
    submission: Submission
    accepted: bool  # False: the same key and payload were submitted before; this is that submission


def check_submission(messages: Any, metadata: Any) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """The messages as stored (``[{"role": "user", "content": text}, ...]``) and the metadata, or
    InvalidPayload saying what is wrong.

    Every message of a submission reaches the model in its turn, or the submission is refused: no
    more of them than the model's history holds (AGENTS_HISTORY_MESSAGES), and no more characters
    of them, as JSON, than it takes (AGENTS_HISTORY_CHARS). The JSON escapes each character past
    ASCII, so 4,000 characters of Chinese are about 24,000 there."""
    limit = min(int(settings.AGENTS_MAX_SUBMISSION_MESSAGES), int(settings.AGENTS_HISTORY_MESSAGES))
    if not isinstance(messages, list) or not 1 <= len(messages) <= limit:
        raise InvalidPayload(f"'messages' must be a list of 1 to {limit} messages")
    checked = []
    for i, item in enumerate(messages):
        if not isinstance(item, dict) or set(item) - {"role", "content"}:
            raise InvalidPayload(f"messages[{i}] must be an object with 'content' (and 'role': 'user')")
        if item.get("role", "user") != "user":
            raise InvalidPayload(f"messages[{i}]: only 'user' messages may be submitted")
        try:
            checked.append({"role": "user", "content": check_message(item.get("content"))})
        except InvalidPayload as exc:
            raise InvalidPayload(f"messages[{i}]: {exc}") from None
    budget = int(settings.AGENTS_HISTORY_CHARS)
    if (size := sum(len(json.dumps(message)) for message in checked)) > budget:
        raise InvalidPayload(
            f"the messages are {size:,} characters as the model reads them (JSON, each character past ASCII "
            f"written as six); the limit is {budget:,}: send fewer or shorter messages"
        )
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise InvalidPayload("'metadata' must be a JSON object")
    check_json_size(metadata, what="metadata")
    try:
        json.dumps(metadata, sort_keys=True)
    except TypeError:  # keys that are not all text (JSON would make them text, and mix them)
        raise InvalidPayload("'metadata' must be a JSON object: its keys text, at every level") from None
    return checked, metadata


def check_key(value: Any, *, what: str, max_length: int) -> str:
    """An idempotency key or a caller's name as given to ``submission_create``: text of at most
    ``max_length`` characters that PostgreSQL can store (no NUL, no lone surrogate); "" for None."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidPayload(f"the {what} must be text")
    if len(value) > max_length:
        raise InvalidPayload(f"the {what} is {len(value):,} characters; the limit is {max_length}")
    if (problem := text_problem(value)) is not None:
        raise InvalidPayload(f"the {what} contains {problem}")
    return value


def fingerprint(messages: list[dict[str, str]], metadata: dict[str, Any]) -> str:
    text = json.dumps({"messages": messages, "metadata": metadata}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _checked(
    user: User | None, messages: Any, metadata: Any, idempotency_key: str | None, caller: str | None
) -> tuple[list[dict[str, str]], dict[str, Any], str, str]:
    """The messages, metadata, key and caller as stored (the caller by default ``user:<id>`` of
    ``user``, else ``system``), or InvalidPayload."""
    checked, metadata = check_submission(messages, metadata)
    key = check_key(idempotency_key, what="idempotency key", max_length=255)
    caller = check_key(caller, what="caller", max_length=300) or (f"user:{user.pk}" if user is not None else "system")
    return checked, metadata, key, caller


def _retried(earlier: Submission, print_: str, key: str) -> SubmissionResult:
    """A retry is answered as the first was, whatever the caps say now; the key with another
    payload is an IdempotencyConflict."""
    if earlier.fingerprint != print_:
        raise IdempotencyConflict(f"the idempotency key {key!r} was used for another submission to this agent")
    return SubmissionResult(earlier, accepted=False)


def submission_create(
    *,
    agent: Agent,
    user: User | None,
    messages: Any,
    metadata: Any = None,
    idempotency_key: str | None = None,
    caller: str | None = None,
) -> SubmissionResult:
    """Store a submission and queue its turn (start it now if the agent is idle). InvalidPayload
    for bad messages or metadata; IdempotencyConflict for a key used with another payload;
    TooManyQueuedTurns past AGENTS_MAX_PENDING_SUBMISSIONS pending ones. Nothing is stored then.

    ``caller`` names whose ``idempotency_key`` it is (default: ``user:<id>`` of ``user``, else
    ``system``): a key is looked up among that caller's submissions only, so nobody can take
    another caller's key first (a member a webhook's ``<source>:<event id>``)."""
    checked, metadata, key, caller = _checked(user, messages, metadata, idempotency_key, caller)
    print_ = fingerprint(checked, metadata)
    try:
        return _create(agent, user, checked, metadata, key, caller, print_)
    except _KeyTaken:
        # The same caller's key accepted into the inbox at the same moment (submission_accept
        # takes no lock): that one is the first.
        earlier = statements.submission_by_key(agent=agent, caller=caller, key=key)
        assert earlier is not None
        return _retried(earlier, print_, key)


class _KeyTaken(Exception):
    """The submission's key was stored by another transaction after it was looked up."""


def _create(
    agent: Agent,
    user: User | None,
    checked: list[dict[str, str]],
    metadata: dict[str, Any],
    key: str,
    caller: str,
    print_: str,
) -> SubmissionResult:
    with transaction.atomic():
        # The user's row (the lock order), then the agent's: submissions with one key, and the
        # queue's numbers, one at a time.
        lock_queue(agent, user)
        earlier = statements.submission_by_key(agent=agent, caller=caller, key=key)
        if earlier is not None:
            return _retried(earlier, print_, key)
        queue = queue_locked(agent, user=user)
        check_open_turns(queue)  # a member's submissions count as their messages do
        check_pending(queue)
        turn = Turn(agent=agent, number=queue.last_number + 1, requested_by=user, source=SUBMISSION_SOURCE)
        insert_instance(turn)
        submission = Submission(
            agent=agent,
            turn=turn,
            idempotency_key=key,
            caller=caller,
            fingerprint=print_,
            messages=checked,
            metadata=metadata,
            submitted_by=user,
        )
        if not insert_instance(submission, on_conflict="DO NOTHING"):
            raise _KeyTaken()  # rolls the turn back
        push_turn(turn)
        start_new_locked(turn, queue)
    if turn.status != TurnStatus.QUEUED:
        submission.refresh_from_db()  # its turn started: it is running, and delivered
    return SubmissionResult(submission, accepted=True)


def submission_accept(
    *,
    agent: Agent,
    user: User | None,
    messages: Any,
    metadata: Any = None,
    idempotency_key: str | None = None,
    caller: str | None = None,
) -> SubmissionResult:
    """Store a submission in the agent's inbox, pending, and send the task that queues its turn
    (``submissions_queue``): what the HTTP API does, where another system waits for the answer.
    The checks, the key's rules and the errors are ``submission_create``'s; the answer is always
    ``pending`` for a new one.

    One autocommit statement writes it, the key and the caps checked by the same statement
    (``statements.insert_inbox``: the caps without a lock, so submissions accepted at the same
    moment may pass one by as many). A retry is looked up only when that statement stored nothing.
    If the task cannot be sent, the submission stands: the sweep, or the agent's next turn, queues
    it."""
    checked, metadata, key, caller = _checked(user, messages, metadata, idempotency_key, caller)
    submission = Submission(
        agent=agent,
        turn=None,
        idempotency_key=key,
        caller=caller,
        fingerprint=fingerprint(checked, metadata),
        messages=checked,
        metadata=metadata,
        submitted_by=user,
    )
    user_limit = int(settings.AGENTS_MAX_OPEN_TURNS_PER_USER)
    pending_limit = int(settings.AGENTS_MAX_PENDING_SUBMISSIONS)
    for _ in range(2):
        if statements.insert_inbox(submission, user_limit=user_limit, pending_limit=pending_limit):
            outbox.send_on_commit(QUEUE_TASK, (agent.pk,), queue=workflows_conf()["QUEUE"])
            return SubmissionResult(submission, accepted=True)
        earlier = statements.submission_by_key(agent=agent, caller=caller, key=key)
        if earlier is not None:
            return _retried(earlier, submission.fingerprint, key)
        # Refused by a cap: counted again under the agent's lock, which also ends a turn whose run
        # ended without ending it (queue_locked), to say which cap, or to try once more if that
        # made room.
        with transaction.atomic():
            lock_queue(agent, None)
            queue = queue_locked(agent, user=user)
        check_open_turns(queue)
        check_pending(queue)
    raise TooManyQueuedTurns("too much is waiting for this agent already; submit again once some has run")


def submissions_queue(agent_id: int) -> int:
    """Queue the turns of the submissions in the agent's inbox and start the oldest queued turn if
    none is active: the task ``submission_accept`` sends. Returns how many turns are queued after."""
    with transaction.atomic():
        agent = Agent.objects.filter(pk=agent_id).first()
        if agent is None:
            return 0
        lock_queue(agent, None)
        queue = queue_locked(agent)  # queues the inbox first
        if queue.queued and not queue.active:
            start_oldest_locked(agent)
            return queue.queued - 1
        return queue.queued


def submissions_sweep(*, now: Any = None, grace_seconds: float | None = None) -> int:
    """Queue every inbox holding a submission accepted more than ``grace_seconds``
    (AGENTS_SUBMISSION_QUEUE_GRACE_SECONDS) ago: its task was lost (a broker away, a worker killed
    before its first statement). Returns how many agents it queued for."""
    grace = float(settings.AGENTS_SUBMISSION_QUEUE_GRACE_SECONDS if grace_seconds is None else grace_seconds)
    before = (now or timezone.now()) - timedelta(seconds=grace)
    agents = Submission.objects.filter(INBOX, created_at__lt=before).values_list("agent_id", flat=True).distinct()
    swept = sorted(set(agents))
    for agent_id in swept:
        submissions_queue(agent_id)
    return len(swept)


def check_pending(queue: Queue) -> None:
    """TooManyQueuedTurns if the agent has AGENTS_MAX_PENDING_SUBMISSIONS submissions pending (their
    turns queued: ``queue`` counted with the agent's row locked, after any repair moved it on)."""
    limit = int(settings.AGENTS_MAX_PENDING_SUBMISSIONS)
    pending = queue.queued_submissions
    if limit and pending >= limit:
        raise TooManyQueuedTurns(
            f"{pending} submissions are waiting already (the limit is {limit}); submit more once some have run"
        )


def submission_cancel(*, submission: Submission, user: User | None) -> Submission:
    """Cancel a pending submission (its messages are never added to the conversation) or stop a
    running one (its turn is stopped: what it streamed stays). An ended one: SubmissionNotCancellable."""
    submission.refresh_from_db(fields=["status", "turn"])
    if submission.is_ended:
        raise SubmissionNotCancellable(f"the submission has ended ({submission.status})", status=submission.status)
    if submission.turn_id is None and _cancel_in_inbox(submission):
        return submission
    assert submission.turn_id is not None  # queued by a worker meanwhile: _cancel_in_inbox read it
    turn = Turn.objects.select_related("agent").get(pk=submission.turn_id)
    try:
        turn_stop(turn=turn, user=user)
        refused = None
    except TransitionNotAllowed as exc:
        refused = exc  # its turn ended between the two reads (the submission says how), or kept changing
    submission.refresh_from_db()
    if submission.status != SubmissionStatus.CANCELLED and submission.is_ended:
        raise SubmissionNotCancellable(f"the submission has ended ({submission.status})", status=submission.status)
    if refused is not None and submission.status != SubmissionStatus.CANCELLED:
        raise refused  # not stopped, and not ended: the caller is told to try again, never a 200
    return submission


def _cancel_in_inbox(submission: Submission) -> bool:
    """Cancel the submission if it is still in its agent's inbox (no turn yet): True, and it is
    cancelled; False if a worker queued its turn first (then the turn's own stop cancels it)."""
    with transaction.atomic():
        lock_queue(submission.agent, None)  # the queue's lock: nothing numbers the inbox meanwhile
        submission.refresh_from_db(fields=["status", "turn"])
        if submission.is_ended:
            raise SubmissionNotCancellable(f"the submission has ended ({submission.status})", status=submission.status)
        if submission.turn_id is not None:
            return False
        submission.end(SubmissionStatus.CANCELLED)
        submission.finished_at = timezone.now()
        submission.save(update_fields=["status", "finished_at"])
    return True


# The public name: ``agents.submit(agent=..., user=..., messages=[...], idempotency_key=...)``.
submit = submission_create
