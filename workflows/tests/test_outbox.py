"""The outbox sends tasks by name: the messages are those the tasks' own ``apply_async`` sends, on the
broker byte for byte but for their ids."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import current_app

from workflows import outbox

RUN_ID = uuid.UUID(int=7)


@pytest.fixture
def queue() -> Iterator[str]:
    """A queue of this test's own on the broker (nothing consumes it), emptied after."""
    name = f"test-outbox-{uuid.uuid4().hex}"
    yield name
    broker().delete(name)


def broker() -> redis.Redis:
    return redis.Redis.from_url(current_app.conf.broker_url)


def messages(queue: str) -> list[dict[str, Any]]:
    """The queue's messages, oldest first, as a worker decodes them: kombu's envelope with its body
    decoded, without what differs from one message to the next whoever sends it (the ids, the
    countdown's due time: compared apart)."""
    decoded = []
    for raw in reversed(broker().lrange(queue, 0, -1)):
        message = json.loads(raw)
        message["body"] = json.loads(base64.b64decode(message["body"]))
        headers, properties = message["headers"], message["properties"]
        assert headers["root_id"] == headers["id"] == properties["correlation_id"]  # sent from no task
        for key in ("id", "root_id", "eta"):
            headers[key] = bool(headers[key])
        properties["correlation_id"] = properties["delivery_tag"] = "varies"
        decoded.append(message)
    return decoded


def not_celery(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("the outbox published through Celery")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("by_name", "by_task"),
    [
        (
            lambda q: outbox.enqueue_run(RUN_ID, queue=q),
            lambda tasks, q: tasks.advance_run.apply_async((str(RUN_ID),), queue=q),
        ),
        (
            lambda q: outbox.enqueue_run(RUN_ID, queue=q, countdown=5),
            lambda tasks, q: tasks.advance_run.apply_async((str(RUN_ID),), queue=q, countdown=5),
        ),
        (
            lambda q: outbox.enqueue_step(RUN_ID, 1, 2, 3, queue=q),
            lambda tasks, q: tasks.run_step.apply_async((str(RUN_ID), 1, 2, 3), queue=q),
        ),
    ],
)
def test_a_task_sent_by_name_is_the_message_apply_async_sends(
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
    by_name: Callable[[str], None],
    by_task: Callable[[Any, str], None],
) -> None:
    # given the message the outbox sends once the transaction commits (on Redis, written by
    # workflows.publish: Celery's own publish is not called)
    with monkeypatch.context() as patched:
        patched.setattr(current_app.amqp, "send_task_message", not_celery)
        with django_capture_on_commit_callbacks(execute=True):
            by_name(queue)
            assert broker().llen(queue) == 0  # not before the commit

    # when the task itself sends the same, through Celery and kombu
    from workflows import tasks

    by_task(tasks, queue)

    # then the broker holds the same message twice, this process's time limits among its headers
    ours, celerys = messages(queue)
    assert ours == celerys
    assert ours["headers"]["timelimit"] == [current_app.conf.task_time_limit, current_app.conf.task_soft_time_limit]


def test_the_tasks_are_registered_under_the_names_the_outbox_sends() -> None:
    from workflows import tasks

    assert (tasks.advance_run.name, tasks.run_step.name, tasks.sweep.name) == (
        outbox.ADVANCE_TASK,
        outbox.RUN_STEP_TASK,
        outbox.SWEEP_TASK,
    )


@pytest.mark.parametrize(("broker_url", "sent"), [("amqp://guest@localhost//", 5), ("redis://localhost/0", 4.2)])
def test_on_rabbitmq_every_countdown_is_whole_seconds_rounded_up(
    monkeypatch: pytest.MonkeyPatch, broker_url: str, sent: float
) -> None:
    # a countdown of less than a second is refused by Celery on RabbitMQ (and its message lost until
    # a sweep), whichever task it is for: a run's timer or a webhook's next try
    monkeypatch.setattr(current_app.conf, "broker_url", broker_url)
    captured: list[dict[str, Any]] = []
    monkeypatch.setattr(outbox, "on_commit", lambda fn: fn())
    monkeypatch.setattr(outbox, "_send", lambda task, args, options: captured.append(options))

    outbox.send_on_commit("webhooks.act", (1, 1), queue="q", countdown=4.2)
    outbox.enqueue_run(RUN_ID, queue="q", countdown=4.2)

    assert [options["countdown"] for options in captured] == [sent, sent]
