"""Writes: starting runs and controlling them. Each runs in one transaction and emits on commit."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone
from django_fsm import TransitionNotAllowed as FSMTransitionNotAllowed

from workflows import hooks, statements
from workflows.conf import conf
from workflows.exceptions import (
    IdempotencyConflict,
    InvalidPayload,
    NotStartable,
    PayloadTooLarge,
    TooManyEvents,
    TooManyRuns,
    TransitionNotAllowed,
)
from workflows.logs import log_run
from workflows.metrics import RUNS_FINISHED
from workflows.models import PAUSABLE, TERMINAL, RunAttempt, RunEvent, RunStatus, WorkflowRun
from workflows.outbox import emit_status, enqueue_run
from workflows.registry import Workflow, get_workflow, workflow_names
from workflows.storable import MAX_JSON_DEPTH, json_problem

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def check_payload(payload: Any, *, what: str = "payload") -> dict[str, Any]:
    """A JSON object within the size limit, or InvalidPayload."""
    if not isinstance(payload, dict):
        raise InvalidPayload(f"{what} must be a JSON object, not {type(payload).__name__}")
    check_json_size(payload, what=what)
    return payload


def check_json_size(payload: Any, *, what: str) -> None:
    """Any JSON value PostgreSQL can store (no NUL, no unpaired surrogate, at most MAX_JSON_DEPTH
    levels deep), within WORKFLOWS_MAX_PAYLOAD_BYTES, or InvalidPayload."""
    try:
        text = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{what} is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidPayload(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep") from None
    limit = conf()["MAX_PAYLOAD_BYTES"]
    if len(text) > limit:
        raise PayloadTooLarge(f"The {what} is {len(text):,} bytes of JSON; the limit is {limit:,}.")
    # Walk the value only when its JSON text says it may be needed (json.dumps escapes NUL as
    # \u0000 and every surrogate as \udXXX; every level of nesting costs a bracket). Each test may
    # also match an escaped backslash or a bracket inside a string: the walk decides.
    if ("\\u0000" in text or "\\ud" in text or text.count("[") + text.count("{") > MAX_JSON_DEPTH) and (
        problem := json_problem(payload)
    ):
        raise InvalidPayload(f"{what} {problem}")


def check_text(value: str | None, *, what: str, max_length: int) -> None:
    if value is not None and len(value) > max_length:
        raise InvalidPayload(f"{what} is {len(value)} characters; the limit is {max_length}")


def check_startable(*, workflow: str) -> None:
    """Whether anyone signed in may start ``workflow`` directly (the API, ``manage.py workflows
    start``): UnknownWorkflow, or NotStartable for a workflow that is not public (it starts only
    through its own service, which decides who may start it and with what payload)."""
    cls = get_workflow(workflow)
    if cls.internal:
        raise NotStartable(f"workflow {workflow!r} cannot be started directly: its own app starts it, for what it made")
    if not cls.public:
        raise NotStartable(
            f"workflow {workflow!r} cannot be started directly: it is not public; its own service "
            "starts it, or a schedule or a webhook source that names it"
        )


def count_with_user_locked(user: User, rows: QuerySet[Any]) -> int:
    """How many ``rows`` there are, counted with ``user``'s row locked until the transaction ends:
    two requests of one user at the same instant count one after the other, so a limit on what a
    user has open holds for requests sent together. Call inside the transaction that adds the row."""
    get_user_model().objects.select_for_update().filter(pk=user.pk).first()
    return int(rows.count())


def check_run_quota(*, owner: User) -> None:
    """TooManyRuns if ``owner`` has WORKFLOWS_MAX_ACTIVE_RUNS_PER_OWNER runs of public workflows not
    finished yet: one customer starting them in a loop must not take every worker from everyone
    else. Their refunds and assessments (private workflows, started by their own services) do not
    count. Call inside the transaction that creates the run: the owner's row is locked, so starts
    at the same instant are counted one after the other."""
    limit = conf()["MAX_ACTIVE_RUNS_PER_OWNER"]
    if not limit:
        return
    public = [name for name in workflow_names() if get_workflow(name).public]
    runs = WorkflowRun.objects.filter(owner=owner, workflow__in=public).exclude(status__in=TERMINAL)
    active = count_with_user_locked(owner, runs)
    if active >= limit:
        raise TooManyRuns(
            f"you have {active} runs that have not finished yet (the limit is {limit}); start more once some have"
        )


def validated_payload(cls: type[Workflow], payload: Any) -> dict[str, Any]:
    """The payload a run of ``cls`` starts with: a JSON object within the size limit, as the
    workflow's ``validate_payload`` returns it (InvalidPayload otherwise)."""
    check_payload(payload)
    validated = cls.validate_payload(payload)
    check_payload(validated, what="validated payload")
    return validated


def run_start(
    *,
    workflow: str,
    payload: dict[str, Any],
    idempotency_key: str | None = None,
    owner: User | None = None,
    queue: str | None = None,
    quota: bool = False,
) -> tuple[WorkflowRun, bool]:
    """Create a run and schedule it in one commit. Returns (run, created).

    The same key with the same payload returns the existing run; with another payload it raises
    IdempotencyConflict. Keys are scoped to the owner and the workflow. ``queue`` is the Celery
    queue the run advances on (default WORKFLOWS_QUEUE). The workflow's ``validate_payload``
    checks the payload first (InvalidPayload). Who may start it is the caller's to check
    (``check_startable`` for the API and the command line; a process's own service otherwise).
    ``quota``: a new run counts against the owner's limit (``check_run_quota``); a replay of the same
    key never does.
    """
    cls = get_workflow(workflow)
    payload = validated_payload(cls, payload)
    check_text(idempotency_key, what="idempotency key", max_length=255)
    dedupe_key = None
    if idempotency_key:
        dedupe_key = f"{owner.pk if owner is not None else '-'}:{workflow}:{idempotency_key}"
        if quota:
            # A replay answers even past the owner's quota, which is counted before the insert.
            existing = WorkflowRun.objects.filter(dedupe_key=dedupe_key).first()
            if existing is not None:
                return _same_start(existing, payload), False
    run = WorkflowRun(
        workflow=workflow,
        workflow_version=str(cls.version),
        payload=payload,
        owner=owner,
        idempotency_key=idempotency_key or "",
        dedupe_key=dedupe_key,
        queue=queue or conf()["QUEUE"],
        enqueued_at=timezone.now(),
    )
    try:
        created = _insert_started(run, quota=quota, owner=owner)
    except TooManyRuns:
        # Starts with one key sent together all missed the lookup above, then waited for the
        # owner's row: the first one's run exists now, and a replay is answered with it.
        existing = WorkflowRun.objects.filter(dedupe_key=dedupe_key).first() if dedupe_key else None
        if existing is None:
            raise
        return _same_start(existing, payload), False
    if not created:  # (a conflict raised here leaves a caller's transaction usable)
        return _same_start(WorkflowRun.objects.get(dedupe_key=dedupe_key), payload), False
    return run, True


def _insert_started(run: WorkflowRun, *, quota: bool, owner: User | None) -> bool:
    """Insert a new run (``run_start``'s write); False if its key's run exists already.

    A savepoint only where the quota may refuse the start, so that a caller inside a transaction
    can go on after the refusal: a turn's run starts inside its message's transaction, and a
    savepoint is two round trips."""
    with transaction.atomic(savepoint=quota):
        if quota and owner is not None:
            check_run_quota(owner=owner)
        # The insert is the key's check: a run with the key (committed, or being inserted by a
        # concurrent start, which it waits for) makes it insert nothing.
        created = statements.insert_run(run, RunAttempt(run=run, number=1))
        if created:
            enqueue_run(run.id, queue=run.queue)
            log_run(run, "created", later=True)
    return created


def _same_start(existing: WorkflowRun, payload: dict[str, Any]) -> WorkflowRun:
    if existing.payload != payload:
        raise IdempotencyConflict(
            f"idempotency key {existing.idempotency_key!r} was used for run {existing.id} with a different payload"
        )
    return existing


def run_send_event(
    *,
    run_id: UUID,
    type: str,
    payload: Any = None,
    idempotency_key: str | None = None,
    system: bool = False,
) -> tuple[RunEvent, bool]:
    """Record an event for the run and wake it if it waits for this type. Returns (event, created).

    Types and keys an app reserved (``hooks.reserve_event_prefix``) are refused unless ``system``:
    only that app's own services pass it. TooManyEvents, unless ``system``, if the run holds
    WORKFLOWS_MAX_WAITING_EVENTS_PER_RUN events no step has taken: a run keeps its events as long
    as it is kept, and whoever may send it one could otherwise fill the database.
    """
    if not type or not isinstance(type, str):
        raise InvalidPayload("event type must be a non-empty string")
    if not system:
        for value in (type, idempotency_key):
            if (why := hooks.reserved_event(value)) is not None:
                raise InvalidPayload(why)
    payload = {} if payload is None else payload
    check_text(type, what="event type", max_length=200)
    check_text(idempotency_key, what="event idempotency key", max_length=255)
    check_json_size(payload, what="event payload")
    with transaction.atomic():
        # Locked first: the engine locks the run before looking for events (see Step.wait_for_event).
        run = WorkflowRun.objects.select_for_update().get(pk=run_id)
        if idempotency_key:
            existing = RunEvent.objects.filter(run=run, idempotency_key=idempotency_key).first()
            if existing is not None:
                if existing.type != type or existing.payload != payload:
                    raise IdempotencyConflict(
                        f"event key {idempotency_key!r} was used on this run with another type or payload"
                    )
                return existing, False
        if run.is_terminal:
            raise TransitionNotAllowed(f"the run is {run.status}; it takes no more events", status=run.status)
        if not system:
            _check_waiting_events(run)
        event = RunEvent.objects.create(run=run, type=type, payload=payload, idempotency_key=idempotency_key or None)
        if run.status == RunStatus.WAITING and run.wait_event_type == type:
            wake_locked_run(run)
    return event, True


def _check_waiting_events(run: WorkflowRun) -> None:
    """TooManyEvents if the run (locked) holds WORKFLOWS_MAX_WAITING_EVENTS_PER_RUN events no step has taken."""
    limit = conf()["MAX_WAITING_EVENTS_PER_RUN"]
    if limit <= 0:
        return
    waiting = RunEvent.objects.filter(run=run, consumed_attempt__isnull=True)[:limit].count()
    if waiting >= limit:
        raise TooManyEvents(
            f"the run holds {limit} events no step has taken yet (WORKFLOWS_MAX_WAITING_EVENTS_PER_RUN); "
            "it takes more once its steps take some"
        )


def wake_locked_run(run: WorkflowRun, *, reason: str = "event") -> None:
    """Call inside atomic() with the run row locked. ``reason``: what woke it, for the log."""
    step = run.wait_step  # (wake clears it)
    run.wake(now=timezone.now())
    run.save()
    enqueue_run(run.id, queue=run.queue)
    emit_status(run)
    log_run(run, "woken", step=step, reason=reason, later=True)


def _locked(run_id: UUID) -> WorkflowRun:
    return WorkflowRun.objects.select_for_update().get(pk=run_id)


def _refuse(run: WorkflowRun, action: str) -> TransitionNotAllowed:
    return TransitionNotAllowed(f"cannot {action} a run that is {run.status}", status=run.status)


def run_pause(*, run_id: UUID) -> WorkflowRun:
    """Pause now if the run is between steps; a running run pauses at its next step boundary."""
    with transaction.atomic():
        run = _locked(run_id)
        if run.status == RunStatus.RUNNING:
            if run.pause_requested:
                raise TransitionNotAllowed("a pause is already requested for this run", status=run.status)
            run.pause_requested = True
        elif run.status in PAUSABLE:
            run.pause()
            log_run(run, "paused", later=True)
        else:
            raise _refuse(run, "pause")
        run.save()
        emit_status(run)
    return run


def run_resume(*, run_id: UUID) -> WorkflowRun:
    with transaction.atomic():
        run = _locked(run_id)
        if run.status == RunStatus.RUNNING and run.pause_requested:
            run.pause_requested = False
        elif run.status == RunStatus.PAUSED:
            run.resume(now=timezone.now())
            enqueue_run(run.id, queue=run.queue)
            log_run(run, "resumed", later=True)
        else:
            raise _refuse(run, "resume")
        run.save()
        emit_status(run)
    return run


def run_terminate(*, run_id: UUID) -> WorkflowRun:
    """Stop the run for good. A step in flight finishes its body, but no later step starts."""
    with transaction.atomic():
        run = _locked(run_id)
        now = timezone.now()
        try:
            run.terminate(now=now)
        except FSMTransitionNotAllowed:
            raise _refuse(run, "terminate") from None
        run.save()
        RunAttempt.objects.filter(run=run, number=run.attempt).update(status=run.status, finished_at=now)
        hooks.fire_run_terminated(run)  # e.g. approvals cancels the run's pending requests
        emit_status(run)
        log_run(run, "terminated", later=True)
        workflow = run.workflow
        transaction.on_commit(lambda: RUNS_FINISHED.labels(workflow, RunStatus.TERMINATED, "").inc())
    return run


def run_restart(*, run_id: UUID, attempt: int | None = None, quota_for: User | None = None) -> WorkflowRun:
    """Start a new attempt from the first step. Earlier attempts and their steps stay stored.

    ``attempt``: the attempt the caller saw and means to replace. If the run has moved on since (a
    second click, another operator), TransitionNotAllowed: the attempt that replaced it is left to run,
    not restarted once more. ``quota_for``: the caller, whose own run brought back from its end counts
    against their limit as a start would (``check_run_quota``): terminating and restarting runs
    must not get a customer past it. Staff restarting someone's run are not limited."""
    with transaction.atomic():
        run = _locked(run_id)
        if attempt is not None and run.attempt != attempt:
            moved = "restarted already?" if attempt < run.attempt else f"it has had no attempt {attempt}"
            raise TransitionNotAllowed(
                f"not restarted: it is on attempt {run.attempt} now, not attempt {attempt} ({moved})",
                status=run.status,
            )
        if quota_for is not None and run.owner_id == quota_for.pk and run.is_terminal:
            check_run_quota(owner=quota_for)  # (a private workflow's run is not counted, as at start)
        now = timezone.now()
        if not run.is_terminal:
            RunAttempt.objects.filter(run=run, number=run.attempt).update(
                status=RunStatus.TERMINATED, finished_at=now, error={"type": "Restarted", "message": "restarted"}
            )
        run.restart(now=now)
        run.save()
        RunAttempt.objects.create(run=run, number=run.attempt)
        hooks.fire_run_restarted(run)
        enqueue_run(run.id, queue=run.queue)
        emit_status(run)
        log_run(run, "restarted", later=True)
    return run
