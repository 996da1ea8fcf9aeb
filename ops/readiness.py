"""What ``/readyz`` asks: can this process reach PostgreSQL, Redis and the broker, and is the
database migrated as far as this code expects? Each check answers None or why it failed (no
secret, no URL).

The probe waits ``READYZ_TIMEOUT`` seconds at most, whatever a check does: the checks run in
threads of their own, one per check, and a check that has not answered by then is reported as
such (a broker that accepts connections and never answers, a database pool waiting its own
timeout). A probe that comes while the last probe's check still waits joins that wait instead of
starting another: a hung dependency holds at most one thread per check, never the server's request
threads (a probe hanging in each of them took every request of the web process down)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

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
    url = settings.CELERY_BROKER_URL
    # Redis's transport reads with no timeout of its own: a server that accepts and never answers
    # would hold the check for ever.
    redis_transport = url.lower().startswith(("redis://", "rediss://"))
    options = {"socket_timeout": timeout, "socket_connect_timeout": timeout} if redis_transport else {}
    try:
        # kombu leaves its constructor unannotated
        with Connection(url, connect_timeout=timeout, transport_options=options) as conn:  # type: ignore[no-untyped-call]
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


def check_database_and_migrations() -> dict[str, str]:
    """The database, then (if it answers) its migrations, on this thread's connection, which goes
    back to the pool after."""
    try:
        problem = check_database()
        if problem is not None:
            return {"database": problem, "migrations": "not checked: no database"}
        return {"database": "ok", "migrations": check_migrations() or "ok"}
    finally:
        connections.close_all()


def _one(name: str, check: Callable[[], str | None]) -> Callable[[], dict[str, str]]:
    return lambda: {name: check() or "ok"}


# Each job answers for the checks it names; the database's and the migrations' share a connection.
JOBS: dict[tuple[str, ...], Callable[[], dict[str, str]]] = {
    ("database", "migrations"): check_database_and_migrations,
    ("redis",): _one("redis", check_redis),
    ("broker",): _one("broker", check_broker),
}
_threads = ThreadPoolExecutor(max_workers=len(JOBS), thread_name_prefix="readyz")
_waiting: dict[tuple[str, ...], Future[dict[str, str]]] = {}  # each job's latest run
_lock = threading.Lock()


def readiness() -> dict[str, str]:
    """Each check's answer, "ok" or why not, within READYZ_TIMEOUT seconds."""
    timeout = float(settings.READYZ_TIMEOUT)
    deadline = time.monotonic() + timeout
    with _lock:
        for names, job in JOBS.items():
            running = _waiting.get(names)
            if running is None or running.done():  # else: join the wait of the probe before
                _waiting[names] = _threads.submit(job)
        futures = dict(_waiting)
    answers: dict[str, str] = {}
    for names, future in futures.items():
        try:
            answers.update(future.result(timeout=max(0.0, deadline - time.monotonic())))
        except FutureTimeout:
            answers.update({name: f"no answer within {timeout:g}s" for name in names})
        except Exception as exc:  # a check's own bug: the probe still answers
            answers.update({name: f"{type(exc).__name__}: the check failed" for name in names})
    return {name: answers[name] for name in ("database", "redis", "broker", "migrations")}
