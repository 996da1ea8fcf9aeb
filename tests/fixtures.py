"""Fixtures every app's tests use: named users, real workers, a real ASGI server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import redis
from django.conf import settings

from tests.support import AsgiServer, Worker, serving

if TYPE_CHECKING:
    from tests.factories import Users


@pytest.fixture(scope="session", autouse=True)
def _flush_that_outlasts_a_deadlock() -> Iterator[None]:
    """Transactional tests end with Django's ``flush`` while the real workers of the session still
    advance runs and beat still sweeps. Two changes to it, for the whole session:

    - Fast. Django's flush is one TRUNCATE of every table and then the ``post_migrate`` signal, which
      recreates the content types and permissions it just emptied: about 300 ms a test here, minutes
      over the suite. Between tests the tables hold a few rows, so DELETE of each (the foreign keys
      are deferred to the commit) takes about 10 ms; content types and permissions, which only
      migrations write, are kept, so the signal has nothing to do and is not sent. A flush that
      resets sequences goes the old way.
    - Patient. A worker's transaction holding row locks on one table and waiting for another that
      the flush holds is a deadlock PostgreSQL breaks by failing one side; when that is the flush,
      the next test would start on the last one's rows. The flush runs in one transaction, rolled
      back whole, so trying it again is safe: a few tries with a pause, then the error as before."""
    import time

    from django.core.management.base import CommandError
    from django.core.management.commands import flush
    from django.db import IntegrityError, OperationalError, connections, transaction

    handle = flush.Command.handle
    kept = {"django_content_type", "auth_permission"}

    def delete_all(database: str) -> None:
        connection = connections[database]
        tables = [t for t in connection.introspection.django_table_names(only_existing=True) if t not in kept]
        with transaction.atomic(using=database), connection.cursor() as cursor:
            for table in tables:
                cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)}")

    def patient_handle(self: flush.Command, **options: Any) -> None:
        database = options.get("database") or "default"
        fast = not options.get("reset_sequences", True) and connections[database].vendor == "postgresql"
        for attempt in range(5):
            try:
                if fast:
                    return delete_all(database)
                return handle(self, **options)
            except (CommandError, OperationalError, IntegrityError) as exc:
                cause = exc.__cause__ if isinstance(exc, CommandError) else exc
                # A deadlock, or (DELETE takes no table lock) a worker's row inserted meanwhile that
                # references one deleted: the transaction rolled back whole, so try again.
                racing = isinstance(cause, IntegrityError) or "deadlock" in str(cause)
                if not (isinstance(cause, OperationalError | IntegrityError) and racing) or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))
        return None

    flush.Command.handle = patient_handle  # type: ignore[method-assign]
    yield
    flush.Command.handle = handle  # type: ignore[method-assign]


@pytest.fixture(scope="session", autouse=True)
def _clean_queue() -> Iterator[None]:
    """Each test session has its own queue; drop what a crashed earlier session may have left."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    queue = settings.WORKFLOWS["QUEUE"]
    keys = [queue, f"{queue}-io", f"_kombu.binding.{queue}", f"_kombu.binding.{queue}-io"]
    client.delete(*keys)
    yield
    client.delete(*keys)


@pytest.fixture(scope="session")
def worker(django_db_setup: None, django_db_blocker: object) -> Iterator[Worker]:
    """Two prefork worker processes plus beat (the sweeper), shared by the session's tests."""
    process = Worker(concurrency=2, beat=True)
    yield process
    process.stop()


@pytest.fixture
def queue(settings: Any) -> Iterator[str]:
    """A queue only this test's own workers listen on (``workers``): runs started in the test go there,
    and no session worker takes them. Its Redis keys are dropped after the test."""
    name = f"own-{uuid.uuid4().hex[:8]}"
    settings.WORKFLOWS = {**settings.WORKFLOWS, "QUEUE": name}
    yield name
    redis.Redis.from_url(settings.REDIS_URL).delete(name, f"{name}-io")


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    """Workers a test starts (``workers.append(Worker(queue=queue, ...))``), stopped after it."""
    started: list[Worker] = []
    yield started
    for w in started:
        w.stop()


class NoEnqueue:
    """Drops every Celery message a run or a step would be sent, until ``stop()``: a run committed
    without its message (as after a crash between commit and send), or one that only the test's own
    threads advance. Every enqueue, the services', the engine's and the sweeper's, goes through
    ``workflows.outbox.send_on_commit``, which is what this replaces."""

    def __init__(self) -> None:
        from workflows import outbox

        self._patch = pytest.MonkeyPatch()
        self._patch.setattr(outbox, "send_on_commit", lambda task, args, **options: None)

    def stop(self) -> None:
        """Send messages again from here on."""
        self._patch.undo()


@pytest.fixture
def no_enqueue() -> Iterator[NoEnqueue]:
    """No run or step is sent to Celery during the test (or until ``no_enqueue.stop()``)."""
    dropping = NoEnqueue()
    yield dropping
    dropping.stop()


@pytest.fixture(scope="session")
def asgi_server(django_db_setup: None, django_db_blocker: Any) -> Iterator[AsgiServer]:
    with serving(django_db_blocker) as server:
        yield server


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    """Django's default hasher takes about a second a password on this machine; tests log in with
    force_login or tokens, so a fast hasher loses nothing."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def users(db: None) -> Users:
    """The cast, each with one role in every test:

    - alice, the customer: owns the runs, orders, refund requests and assessments; not staff.
    - bob, alice's colleague: not staff, and sees none of her runs. Where an app has approvers he
      is one of them beside carol, and asks for approvals himself (four eyes keeps him off his own).
    - carol, the approver: staff who views and controls every run; each app's tests put her in its
      approvers' group, and the ledger's give her its permissions.
    - dave, the auditor: staff who may view runs and approval requests, and controls or decides
      nothing.
    - erin, the operator: staff with approvals.decide_any, who decides any request outside its group.
    - mallory, another customer: must see and change nothing of alice's.
    """
    from tests.factories import create_users

    return create_users()
