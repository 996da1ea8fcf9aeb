"""``/healthz`` and ``/readyz`` against the real PostgreSQL and Redis, and with each taken away."""

from __future__ import annotations

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


def test_readyz_is_503_naming_a_migration_not_applied() -> None:
    # given the newest migration of the webhooks app recorded as not applied (rolled back after the test)
    latest = MigrationRecorder.Migration.objects.filter(app="webhooks").order_by("-name").first()
    assert latest is not None
    latest.delete()

    response = Client().get("/readyz")

    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["migrations"] == f"1 migrations not applied: webhooks.{latest.name}"
    assert (checks["database"], checks["redis"], checks["broker"]) == ("ok", "ok", "ok")


def test_the_probes_answer_get_and_head_and_405_to_the_rest() -> None:
    client = Client(enforce_csrf_checks=True)  # as a browser-less probe posts: no CSRF token
    for path in ("/healthz", "/readyz"):
        assert client.head(path).status_code == 200, path
        assert client.post(path).status_code == 405, path
