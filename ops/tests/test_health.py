"""``/healthz`` and ``/readyz`` against the real PostgreSQL and Redis, and with each taken away."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db.migrations.recorder import MigrationRecorder
from django.test import Client

from tests.support import free_port

pytestmark = pytest.mark.django_db


def test_healthz_answers_without_asking_anything_else() -> None:
    response = Client().get("/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def test_readyz_is_ready_when_postgresql_redis_and_the_broker_answer_and_all_is_migrated() -> None:
    response = Client().get("/readyz")
    assert response.status_code == 200, response.json()
    assert response.json() == {
        "status": "ok",
        "checks": {"database": "ok", "redis": "ok", "broker": "ok", "migrations": "ok"},
    }


def test_readyz_is_503_naming_redis_and_the_broker_when_redis_is_gone(settings: Any) -> None:
    # given Redis (the broker too) pointed at a port nobody listens on
    dead = f"redis://127.0.0.1:{free_port()}/0"
    settings.REDIS_URL = settings.CELERY_BROKER_URL = dead

    response = Client().get("/readyz")

    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["redis"].endswith("cannot reach Redis"), checks
    assert checks["broker"].endswith("cannot reach the Celery broker"), checks
    assert (checks["database"], checks["migrations"]) == ("ok", "ok")
    assert dead not in response.content.decode()


@pytest.mark.django_db(transaction=True)  # the checks run on connections of their own
def test_readyz_is_503_naming_a_migration_not_applied() -> None:
    # given the newest migration of the webhooks app recorded as not applied (put back after)
    latest = MigrationRecorder.Migration.objects.filter(app="webhooks").order_by("-name").first()
    assert latest is not None
    latest.delete()
    try:
        response = Client().get("/readyz")
    finally:
        MigrationRecorder.Migration.objects.create(app=latest.app, name=latest.name)

    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["migrations"] == f"1 migrations not applied: webhooks.{latest.name}"
    assert (checks["database"], checks["redis"], checks["broker"]) == ("ok", "ok", "ok")


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server that accepts connections and never answers (a hung Redis, a proxy whose backend
    is gone): its ``redis://`` URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    listener.close()


def test_readyz_answers_in_its_time_when_redis_and_the_broker_never_answer(settings: Any, silent_server: str) -> None:
    # given Redis and the broker pointed at a server that accepts and never answers
    settings.REDIS_URL = settings.CELERY_BROKER_URL = silent_server
    settings.READYZ_TIMEOUT = 0.5

    # when two probes come, one after the other
    times, answers = [], []
    for _ in range(2):
        started = time.monotonic()
        response = Client().get("/readyz")
        times.append(time.monotonic() - started)
        answers.append(response)

    # then each is a 503 within about the timeout, naming both, and the database is fine
    for response in answers:
        assert response.status_code == 503
        checks = response.json()["checks"]
        assert checks["redis"] != "ok" and checks["broker"] != "ok", checks
        assert (checks["database"], checks["migrations"]) == ("ok", "ok")
    assert max(times) < 1.5, times


def test_the_probes_answer_get_and_head_and_405_to_the_rest() -> None:
    client = Client(enforce_csrf_checks=True)  # as a browser-less probe posts: no CSRF token
    for path in ("/healthz", "/readyz"):
        assert client.head(path).status_code == 200, path
        assert client.post(path).status_code == 405, path
