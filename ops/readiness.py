"""What ``/readyz`` asks: can this process reach PostgreSQL, Redis and the broker, and is the
database migrated as far as this code expects? Each check is quick, bounded by
``READYZ_TIMEOUT`` seconds, and answers None or why it failed (no secret, no URL)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder


def check_database() -> str | None:
    try:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        return f"{type(exc).__name__}: cannot query the database"
    return None


def check_redis() -> str | None:
    import redis

    timeout = float(settings.READYZ_TIMEOUT)
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=timeout, socket_connect_timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"{type(exc).__name__}: cannot reach Redis"
    return None


def check_broker() -> str | None:
    from kombu.connection import Connection

    timeout = float(settings.READYZ_TIMEOUT)
    try:
        # kombu leaves its constructor unannotated
        with Connection(settings.CELERY_BROKER_URL, connect_timeout=timeout) as conn:  # type: ignore[no-untyped-call]
            conn.ensure_connection(max_retries=0, timeout=timeout)
    except Exception as exc:
        return f"{type(exc).__name__}: cannot reach the Celery broker"
    return None


@functools.cache
def _migrations_on_disk() -> dict[tuple[str, str], list[tuple[str, str]]]:
    """Every migration this code has, with what it replaces (a squashed one): read once, as the
    files do not change under a running process."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    return {key: list(migration.replaces) for key, migration in loader.disk_migrations.items()}


def check_migrations() -> str | None:
    """One SELECT of ``django_migrations`` against the migrations on disk (MigrationExecutor's
    plan would load the graph again on every call)."""
    try:
        applied = set(MigrationRecorder(connections[DEFAULT_DB_ALIAS]).applied_migrations())
    except Exception as exc:
        return f"{type(exc).__name__}: cannot read the applied migrations"
    missing = sorted(
        f"{app}.{name}"
        for (app, name), replaces in _migrations_on_disk().items()
        if (app, name) not in applied and not (replaces and all(key in applied for key in replaces))
    )
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        return f"{len(missing)} migrations not applied: {shown}"
    return None


CHECKS: dict[str, Callable[[], str | None]] = {
    "database": check_database,
    "redis": check_redis,
    "broker": check_broker,
    "migrations": check_migrations,
}


def readiness() -> dict[str, str]:
    """Each check's answer, "ok" or why not. Migrations are not checked without a database."""
    answers: dict[str, str] = {}
    for name, check in CHECKS.items():
        if name == "migrations" and answers.get("database") != "ok":
            answers[name] = "not checked: no database"
            continue
        answers[name] = check() or "ok"
    return answers
