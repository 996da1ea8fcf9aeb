"""The outbox sends tasks by name: the messages are those the tasks' own ``apply_async`` sends."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from celery import current_app

from workflows import outbox

RUN_ID = uuid.UUID(int=7)
# Differ from one message to the next whoever sends it.
VARYING = {"id", "root_id", "origin", "eta"}


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Each message given to the broker: its headers (but those that always differ) and the options
    it is published with (None is the broker's default, as if absent)."""
    messages: list[dict[str, Any]] = []

    def send_task_message(producer: Any, name: str, message: Any, **options: Any) -> None:
        headers = {key: value for key, value in message.headers.items() if key not in VARYING}
        given = {key: value for key, value in options.items() if value is not None}
        messages.append({"headers": headers, "countdown": message.headers["eta"] is not None, "options": given})

    monkeypatch.setattr(current_app.amqp, "send_task_message", send_task_message)
    return messages


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("by_name", "by_task"),
    [
        (
            lambda: outbox.enqueue_run(RUN_ID, queue="q"),
            lambda tasks: tasks.advance_run.apply_async((str(RUN_ID),), queue="q"),
        ),
        (
            lambda: outbox.enqueue_run(RUN_ID, queue="q", countdown=5),
            lambda tasks: tasks.advance_run.apply_async((str(RUN_ID),), queue="q", countdown=5),
        ),
        (
            lambda: outbox.enqueue_step(RUN_ID, 1, 2, 3, queue="q-io"),
            lambda tasks: tasks.run_step.apply_async((str(RUN_ID), 1, 2, 3), queue="q-io"),
        ),
    ],
)
def test_a_task_sent_by_name_is_the_message_apply_async_sends(
    sent: list[dict[str, Any]],
    django_capture_on_commit_callbacks: Any,
    by_name: Callable[[], None],
    by_task: Callable[[Any], None],
) -> None:
    # given the message the outbox sends once the transaction commits
    with django_capture_on_commit_callbacks(execute=True):
        by_name()
        assert sent == []  # not before the commit

    # when the task itself sends the same
    from workflows import tasks

    by_task(tasks)

    # then both carry the same headers (this process's time limits among them) and options
    assert len(sent) == 2
    assert sent[0] == sent[1]
    assert sent[0]["headers"]["timelimit"] == [current_app.conf.task_time_limit, current_app.conf.task_soft_time_limit]


def test_the_tasks_are_registered_under_the_names_the_outbox_sends() -> None:
    from workflows import tasks

    assert (tasks.advance_run.name, tasks.run_step.name, tasks.sweep.name) == (
        outbox.ADVANCE_TASK,
        outbox.RUN_STEP_TASK,
        outbox.SWEEP_TASK,
    )
