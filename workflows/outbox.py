"""The outbox: the one way anything leaves the database, deferred to commit.

A Celery enqueue or a stream push sent from inside an open transaction could announce a row that
is then rolled back, or arrive before the row is visible. Everything goes through ``on_commit``;
a crash between commit and send is repaired by the sweeper (lost enqueue) or is harmless
(progress is best effort).

Tasks are sent by name (``send_on_commit``, the one place every enqueue goes through), so the
engine never imports ``workflows.tasks``: the tasks import the engine, not the other way round.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any
from uuid import UUID

from celery import current_app
from django.db import transaction

from workflows.models import WorkflowRun
from workflows.publish import publisher_for
from workflows.selectors import run_status_summary, status_summary
from workflows.streams import publish_later

# The Celery tasks' names: workflows.tasks registers its tasks under them; the outbox sends the
# first two, and beat the sweep (CELERY_BEAT_SCHEDULE names it too).
ADVANCE_TASK = "workflows.advance"
RUN_STEP_TASK = "workflows.run_step"
SWEEP_TASK = "workflows.sweep"


def on_commit(fn: Callable[[], Any]) -> None:
    """Run ``fn`` after the current transaction commits (at once in autocommit); log, never raise."""
    transaction.on_commit(fn, robust=True)


def send_on_commit(task: str, args: tuple[Any, ...], **options: Any) -> None:
    """Send the Celery task named ``task`` with ``args`` once the current transaction commits.

    On RabbitMQ a ``countdown`` waits in its native delayed-delivery queues, which count whole
    seconds: Celery refuses to send one of less than a second (ValueError), and the message would
    be lost until a sweep. It is rounded up there, so a task is never due before its time."""
    if options.get("countdown") and _on_rabbitmq():
        options["countdown"] = math.ceil(options["countdown"])
    on_commit(lambda: _send(task, args, options))


def _send(task: str, args: tuple[Any, ...], options: dict[str, Any]) -> None:
    """The message the task's own ``apply_async`` would send, though the task need not be imported
    here: what a task takes from this process's settings is given as it would be (Celery's hard time
    limit travels in each message; see CELERY_TASK_TIME_LIMIT). Written to a Redis broker directly
    (workflows.publish: a tenth of Celery's cost), else sent through Celery."""
    publisher = publisher_for(current_app._get_current_object())
    if publisher is not None and "queue" in options and options.keys() <= {"queue", "countdown"}:
        publisher.send(task, args, queue=options["queue"], countdown=options.get("countdown"))
        return
    conf = current_app.conf
    current_app.send_task(
        task,
        args,
        time_limit=conf.task_time_limit,
        soft_time_limit=conf.task_soft_time_limit,
        ignore_result=conf.task_ignore_result,
        serializer=conf.task_serializer,
        **options,
    )


def enqueue_run(run_id: UUID, *, queue: str, countdown: float | None = None) -> None:
    """Ask a worker on ``queue`` (the run's) to advance the run once the current transaction commits."""
    options: dict[str, Any] = {"queue": queue}
    if countdown:
        options["countdown"] = countdown  # whole seconds on RabbitMQ (send_on_commit)
    send_on_commit(ADVANCE_TASK, (str(run_id),), **options)


def _on_rabbitmq() -> bool:
    """Whether this process's Celery app sends to RabbitMQ (config/broker.py)."""
    return str(current_app.conf.broker_url or "").lower().startswith(("amqp://", "amqps://", "pyamqp://"))


def enqueue_step(run_id: UUID, attempt: int, position: int, tries: int, *, queue: str) -> None:
    """Ask a worker on ``queue`` (the step's) to run try ``tries`` of the step once the current
    transaction commits. The try number lets the task refuse a late or redelivered message of an
    earlier try."""
    send_on_commit(RUN_STEP_TASK, (str(run_id), attempt, position, tries), queue=queue)


def emit_status(run: WorkflowRun) -> None:
    """Push the run's status, as it is in memory now, to its stream once the transaction commits."""
    run_id, summary = run.id, status_summary(run)
    on_commit(lambda: publish_later(run_id, "status", summary))


def emit_stored_status(run_id: UUID | str) -> None:
    """Push the run's status, as the database has it after the commit, to its stream (for callers
    without the run in memory)."""

    def publish() -> None:
        summary = run_status_summary(run_id=run_id)
        if summary is not None:
            publish_later(run_id, "status", summary)

    on_commit(publish)
