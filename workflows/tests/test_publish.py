"""workflows.publish: the Celery message written straight to Redis, and when Celery sends instead.

That the message is Celery's own, field by field, is test_outbox's; that workers run it, every test
with a worker's."""

from __future__ import annotations

import base64
import gc
import json
import uuid
import weakref
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from celery import Celery, current_app, signals
from celery._state import _task_stack

from tests.support import RedisServer
from workflows import outbox
from workflows.publish import RedisPublisher, publisher_for


@pytest.fixture
def queue() -> Iterator[str]:
    name = f"test-publish-{uuid.uuid4().hex}"
    yield name
    redis.Redis.from_url(current_app.conf.broker_url).delete(name)


def taken(queue: str) -> dict[str, Any]:
    """The one message on ``queue``, as a worker reads it."""
    raw = redis.Redis.from_url(current_app.conf.broker_url).rpop(queue)
    assert isinstance(raw, bytes)
    message: dict[str, Any] = json.loads(raw)
    message["body"] = json.loads(base64.b64decode(message["body"]))
    return message


def app_with(**conf: Any) -> Celery:
    app = Celery("test-publish", set_as_current=False)
    app.conf.update({"broker_url": current_app.conf.broker_url, **conf})
    return app


def test_the_process_app_on_redis_publishes_directly() -> None:
    assert current_app.conf.broker_url.startswith("redis://")
    publisher = publisher_for(current_app._get_current_object())
    assert isinstance(publisher, RedisPublisher)
    assert publisher_for(current_app._get_current_object()) is publisher  # built once per app


@pytest.mark.parametrize(
    "conf",
    [
        {"broker_url": "amqp://guest:guest@127.0.0.1:5672//"},
        {"broker_url": "rediss://127.0.0.1:6380/0"},
        {"broker_url": "redis://127.0.0.1:6379/0;redis://127.0.0.1:6380/0"},
        {"broker_use_ssl": {"ssl_cert_reqs": "required"}},
        {"task_serializer": "pickle"},
        {"task_compression": "gzip"},
        {"task_send_sent_event": True},
        {"broker_transport_options": {"global_keyprefix": "tenant-a:"}},
        {"broker_write_url": "redis://127.0.0.1:6380/0"},
        {"task_protocol": 1},
        {"task_default_priority": 5},
        {"task_inherit_parent_priority": True},
        {"task_routes": {"workflows.advance": {"queue": "elsewhere"}}},
        {"task_queues": []},
        {"task_create_missing_queues": False},
    ],
)
def test_celery_sends_where_the_direct_message_would_differ(conf: dict[str, Any]) -> None:
    assert publisher_for(app_with()) is not None
    assert publisher_for(app_with(**conf)) is None


def test_celery_sends_while_a_publish_signal_has_a_receiver(queue: str) -> None:
    # given a receiver of Celery's before_task_publish, as tracing integrations connect
    seen: list[str] = []

    def receiver(sender: str | None = None, **kwargs: Any) -> None:
        seen.append(str(sender))

    signals.before_task_publish.connect(receiver)
    try:
        # when the outbox sends a task
        assert publisher_for(current_app._get_current_object()) is None
        outbox._send(outbox.ADVANCE_TASK, ("run",), {"queue": queue})
    finally:
        signals.before_task_publish.disconnect(receiver)

    # then Celery sent it, telling the receiver; without one, the direct path is back
    assert seen == [outbox.ADVANCE_TASK]
    assert taken(queue)["headers"]["task"] == outbox.ADVANCE_TASK
    assert publisher_for(current_app._get_current_object()) is not None


def test_a_countdown_is_an_eta_in_utc(queue: str) -> None:
    publisher = publisher_for(current_app._get_current_object())
    assert publisher is not None
    before = datetime.now(UTC)

    task_id = publisher.send(outbox.ADVANCE_TASK, ("run",), queue=queue, countdown=2.5)

    headers = taken(queue)["headers"]
    assert headers["id"] == task_id
    eta = datetime.fromisoformat(headers["eta"])
    assert eta.utcoffset() == timedelta(0)
    assert before + timedelta(seconds=2.5) <= eta <= datetime.now(UTC) + timedelta(seconds=2.5)


def test_a_message_sent_from_a_task_names_it_as_celery_does(queue: str) -> None:
    # given a task running in a worker (on Celery's stack of current tasks)
    from workflows import tasks

    task = tasks.advance_run
    task.push_request(id="parent-id", root_id="root-id", called_directly=False)
    _task_stack.push(task)
    try:
        # when it sends a message directly, then through Celery
        publisher = publisher_for(current_app._get_current_object())
        assert publisher is not None
        publisher.send(outbox.ADVANCE_TASK, ("run",), queue=queue)
        current_app.send_task(outbox.ADVANCE_TASK, ("run",), queue=queue)
    finally:
        _task_stack.pop()
        task.pop_request()

    # then both name the task as their parent and its root as theirs
    for message in (taken(queue), taken(queue)):
        assert (message["headers"]["parent_id"], message["headers"]["root_id"]) == ("parent-id", "root-id")


def test_a_publish_after_redis_restarted_goes_through_a_new_connection() -> None:
    # given a publisher whose pooled connection was used, then Redis restarted under it
    server = RedisServer()
    try:
        publisher = RedisPublisher(app_with(broker_url=server.url))
        publisher.send(outbox.ADVANCE_TASK, ("before",), queue="q")
        server.restart()  # what it held is gone, and the connection with it

        # when the outbox's next message is sent
        publisher.send(outbox.ADVANCE_TASK, ("after",), queue="q")

        # then it is on the new Redis's queue
        messages = redis.Redis.from_url(server.url).lrange("q", 0, -1)
        assert [json.loads(base64.b64decode(json.loads(m)["body"]))[0] for m in messages] == [["after"]]
    finally:
        server.stop()


def test_a_push_on_a_dead_connection_is_sent_once_more_as_a_new_message(
    queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher = RedisPublisher(app_with())
    pushed: list[bytes] = []
    lpush = publisher.client.lpush

    def flaky(name: str, message: bytes) -> Any:
        pushed.append(message)
        if len(pushed) == 1:
            raise redis.ConnectionError("Connection closed by server.")
        return lpush(name, message)

    monkeypatch.setattr(publisher.client, "lpush", flaky)

    task_id = publisher.send(outbox.ADVANCE_TASK, ("run",), queue=queue)

    first, second = (json.loads(m) for m in pushed)
    assert first["headers"]["id"] == second["headers"]["id"] == task_id
    assert first["properties"]["delivery_tag"] != second["properties"]["delivery_tag"]
    assert taken(queue)["properties"]["delivery_tag"] == second["properties"]["delivery_tag"]


def test_a_push_that_fails_twice_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    publisher = RedisPublisher(app_with())

    def dead(name: str, message: bytes) -> Any:
        raise redis.ConnectionError("Connection refused.")

    monkeypatch.setattr(publisher.client, "lpush", dead)

    with pytest.raises(redis.ConnectionError):
        publisher.send(outbox.ADVANCE_TASK, ("run",), queue="q")


def test_an_app_gone_takes_its_publisher_with_it() -> None:
    app = app_with()
    assert publisher_for(app) is not None
    gone = weakref.ref(app)

    del app
    gc.collect()

    assert gone() is None
