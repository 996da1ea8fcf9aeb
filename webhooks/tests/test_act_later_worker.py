"""A source that acts later, end to end through a real daphne and a real Celery worker: deliveries
sent at once are acted on once each; a task lost on its way is sent again by the sweep; a worker
SIGKILLed in the middle of an action leaves nothing of it, and the action then happens once."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.utils import timezone

from tests.fixtures import NoEnqueue
from tests.support import AsgiServer, Worker, race, serving, thread_of, wait_for
from webhooks import actions, services
from webhooks.conf import source_get
from webhooks.models import WebhookDelivery
from webhooks.services import delivery_act, delivery_receive, delivery_sweep
from webhooks.tests.support import SOURCES, encode, perform_workflow_with, standard_headers
from workflows.models import WorkflowRun
from workflows.services import run_start

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LATER_SOURCES = {**SOURCES, "later": {**SOURCES["runs"], "act": "later"}}
SOURCES_JSON = json.dumps(LATER_SOURCES)


@pytest.fixture(scope="module")
def queue_name() -> Iterator[str]:
    """The queue the module's server sends to and its workers take from."""
    name = f"later-{uuid.uuid4().hex[:8]}"
    yield name
    redis.Redis.from_url(django_settings.REDIS_URL).delete(name, f"{name}-io")


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any, queue_name: str) -> Iterator[AsgiServer]:
    with serving(django_db_blocker, WORKFLOWS_QUEUE=queue_name, WEBHOOK_SOURCES_JSON=SOURCES_JSON) as process:
        yield process


@pytest.fixture
def later(settings: Any, queue_name: str) -> None:
    """This process sends to the module's queue and knows its sources (the sweep, receive)."""
    settings.WEBHOOK_SOURCES = LATER_SOURCES
    settings.WORKFLOWS = {**settings.WORKFLOWS, "QUEUE": queue_name}


def send(server: AsgiServer, event_id: str, data: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    body = encode({"type": "order.paid", "data": data})
    headers = {**standard_headers(body, event_id), "Content-Type": "application/json"}
    with httpx.Client(timeout=60) as client:
        response = client.post(f"{server.url}/webhooks/later/", content=body, headers=headers)
    return response.status_code, response.json()


def accepted_unsent(event_id: str) -> WebhookDelivery:
    """A delivery to the source that acts later, accepted in this process while its task was lost
    (the broker went away as it was sent): committed, pending, and no message for it."""
    body = encode({"type": "order.paid", "data": {"n": event_id}})
    source = source_get("later")
    assert source is not None
    dropping = NoEnqueue()
    try:
        delivery, rejected = delivery_receive(source=source, headers=standard_headers(body, event_id), body=body)
    finally:
        dropping.stop()
    assert rejected is None and delivery is not None and delivery.action_state == "pending"
    return delivery


def all_done(count: int) -> bool:
    return WebhookDelivery.objects.filter(outcome="accepted", action_state="done").count() == count


def test_a_burst_with_replays_and_fifty_copies_of_one_event_is_acted_on_once_each(
    server: AsgiServer, queue_name: str, workers: list[Worker], later: None
) -> None:
    # given a worker, and 40 events sent from 8 senders with every fourth sent twice, plus one event
    # sent by 50 senders at the same instant
    workers.append(Worker(queue=queue_name, concurrency=2, WEBHOOK_SOURCES_JSON=SOURCES_JSON))
    sends = [(f"evt_{i}", {"n": i}) for i in range(40)] + [(f"evt_{i}", {"n": i}) for i in range(0, 40, 4)]
    barrier = threading.Barrier(50)

    def race() -> tuple[int, dict[str, Any]]:
        barrier.wait()
        return send(server, "evt_race", {"n": "race"})

    # when
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda s: send(server, *s), sends))
    with ThreadPoolExecutor(50) as pool:
        raced = [f.result() for f in [pool.submit(race) for _ in range(50)]]

    # then each event was accepted once, the rest are duplicates
    assert sorted(status for status, _ in answers) == [200] * 10 + [202] * 40
    assert sorted(status for status, _ in raced) == [200] * 49 + [202]
    # and the worker acted on each once: one run per event, with the event's data
    wait_for(lambda: all_done(41), timeout=60, what="every accepted delivery to be acted on")
    keys = sorted(WorkflowRun.objects.values_list("idempotency_key", flat=True))
    assert keys == sorted([f"later:evt_{i}" for i in range(40)] + ["later:evt_race"])
    assert WorkflowRun.objects.get(idempotency_key="later:evt_7").payload == {"n": 7}
    assert not WebhookDelivery.objects.exclude(raw_body=None).exists()  # every raw body dropped once acted on
    for delivery in WebhookDelivery.objects.filter(outcome="accepted"):
        assert delivery.run is not None and delivery.run.idempotency_key == f"later:{delivery.event_id}"


def test_a_task_lost_on_its_way_is_sent_again_by_the_sweep(
    queue_name: str, workers: list[Worker], later: None, settings: Any
) -> None:
    # given a delivery accepted while its task was lost (the broker went away as it was sent)
    delivery = accepted_unsent("evt_lost")
    workers.append(Worker(queue=queue_name, concurrency=1, WEBHOOK_SOURCES_JSON=SOURCES_JSON))

    # when the sweep runs once it is overdue
    overdue(delivery.pk, settings)
    assert delivery_sweep() == 1

    # then the worker acts on it
    wait_for(lambda: all_done(1), timeout=30, what="the swept delivery to be acted on")
    assert WorkflowRun.objects.get().idempotency_key == "later:evt_lost"


def test_a_worker_killed_in_the_middle_of_an_action_leaves_nothing_and_it_then_happens_once(
    server: AsgiServer, queue_name: str, workers: list[Worker], later: None, settings: Any
) -> None:
    # given the event's run being inserted by another transaction, not committed: the worker's own
    # insert of that run (its action's first write is done: the delivery row is locked) waits on it
    held, release = threading.Event(), threading.Event()

    def hold_the_key() -> None:
        try:
            with transaction.atomic():
                run_start(workflow="test.echo", payload={"n": "other"}, idempotency_key="later:evt_kill")
                held.set()
                release.wait(60)
                raise RuntimeError("roll back")
        except RuntimeError:
            pass

    holder = thread_of(hold_the_key)
    holder.start()
    assert held.wait(30)
    doomed = Worker(queue=queue_name, concurrency=1, WEBHOOK_SOURCES_JSON=SOURCES_JSON)
    workers.append(doomed)
    assert send(server, "evt_kill", {"n": "kill"})[0] == 202

    def worker_waiting() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND query ILIKE '%%workflows_workflowrun%%'"
            )
            return bool(cursor.fetchone()[0] == 1)

    wait_for(worker_waiting, timeout=30, what="the worker's action to wait on the run's key")

    # when the worker is SIGKILLed there, and the other transaction then rolls back
    doomed.kill()
    release.set()
    holder.join(30)

    # then nothing of the action was kept: the delivery is still pending, its try counted, no run
    wait_for(lambda: not worker_waiting(), timeout=30, what="the killed worker's transaction to end")
    delivery = WebhookDelivery.objects.get(outcome="accepted")
    assert (delivery.action_state, delivery.action_attempts, delivery.run_id) == ("pending", 1, None)
    assert not WorkflowRun.objects.exists()
    # and once a worker is back and the sweep finds it overdue, the action happens once
    workers.append(Worker(queue=queue_name, concurrency=1, WEBHOOK_SOURCES_JSON=SOURCES_JSON))
    overdue(delivery.pk, settings)
    assert delivery_sweep() == 1
    wait_for(lambda: all_done(1), timeout=30, what="the delivery to be acted on after the kill")
    [run] = WorkflowRun.objects.all()
    assert (run.idempotency_key, run.payload) == ("later:evt_kill", {"n": "kill"})
    assert WebhookDelivery.objects.get(outcome="accepted").action_attempts == 2


def test_two_tasks_for_one_try_at_once_make_it_once(later: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a pending delivery, and an action that takes a while and counts its calls (it has no
    # key of its own that would collapse two calls into one effect)
    delivery = accepted_unsent("evt_twice")
    calls: list[str] = []

    def slow(action: dict[str, Any], event: actions.Event) -> actions.ActionResult:
        calls.append(event.event_id)
        time.sleep(0.5)
        return {"result": {"slow": True}}

    perform_workflow_with(monkeypatch, slow)

    # when two tasks for its first try arrive at the same moment (the broker's and the sweep's)
    results = race(lambda: delivery_act(delivery.pk, 0), n=2)

    # then the action ran once: one task made the try, the other did nothing
    assert calls == ["evt_twice"]
    assert sorted(r is None for r in results) == [False, True], results
    delivery.refresh_from_db()
    assert (delivery.action_state, delivery.action_attempts, delivery.result) == ("done", 1, {"slow": True})


def test_a_duplicate_holding_the_row_a_moment_does_not_make_the_try_skip_its_action(
    later: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a pending delivery, and a second task for the same try that locks its row a moment (it
    # finds the try counted and ends) just as the first task, having counted the try, goes to act
    delivery = accepted_unsent("evt_moment")
    calls: list[str] = []

    def quick(action: dict[str, Any], event: actions.Event) -> actions.ActionResult:
        calls.append(event.event_id)
        return {"result": {"quick": True}}

    perform_workflow_with(monkeypatch, quick)
    pending = services._pending
    locked = threading.Event()
    holders: list[threading.Thread] = []

    def duplicate_in_the_way(delivery_id: int, tries: int, **kwargs: Any) -> WebhookDelivery | None:
        if tries == 1 and not locked.is_set():  # the first task's second transaction, about to act

            def hold() -> None:
                with transaction.atomic():
                    WebhookDelivery.objects.select_for_update().filter(pk=delivery_id).first()
                    locked.set()
                    time.sleep(0.3)

            holder = thread_of(hold)
            holder.start()
            holders.append(holder)
            assert locked.wait(10)
        return pending(delivery_id, tries, **kwargs)

    monkeypatch.setattr(services, "_pending", duplicate_in_the_way)

    # when the first task makes its try
    acted = delivery_act(delivery.pk, 0)
    for holder in holders:
        holder.join(10)

    # then it waited out the duplicate's moment and acted, rather than leaving the try undone
    assert calls == ["evt_moment"] and acted is not None
    delivery.refresh_from_db()
    assert (delivery.action_state, delivery.action_attempts, delivery.result) == ("done", 1, {"quick": True})


def overdue(delivery_id: int, settings: Any) -> None:
    """Make the delivery's next try overdue by more than the sweep's grace."""
    grace = timedelta(seconds=settings.WEBHOOKS_ACT_GRACE_SECONDS + 1)
    WebhookDelivery.objects.filter(pk=delivery_id).update(act_after=timezone.now() - grace)


def test_the_202_stands_when_the_task_cannot_be_sent(later: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a broker that refuses every message
    from workflows import outbox

    def refused(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the broker is away")

    monkeypatch.setattr(outbox, "_send", refused)
    source = source_get("later")
    assert source is not None
    body = encode({"type": "order.paid", "data": {"n": "unsent"}})

    # when a delivery is accepted (in autocommit, as the view does)
    delivery, rejected = delivery_receive(source=source, headers=standard_headers(body, "evt_unsent"), body=body)

    # then it stands, committed and pending, for the sweep to send once it is overdue
    assert rejected is None and delivery is not None
    assert WebhookDelivery.objects.get(pk=delivery.pk).action_state == "pending"
