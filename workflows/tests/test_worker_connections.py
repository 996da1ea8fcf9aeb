"""Workers keep their database connection from one task to the next, as web processes do between
requests, and replace one that broke. Celery's Django fix-up would otherwise close every connection
around every task, and each run would begin by opening a new one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from tests.support import Worker, wait_for_terminal
from workflows import public as wf
from workflows.models import RunStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def lone_worker(settings: Any) -> Iterator[Worker]:
    """One worker process on a queue of its own, without beat: no sweeper re-enqueues a run."""
    queue = f"connections-{uuid.uuid4().hex[:8]}"
    settings.WORKFLOWS = {**settings.WORKFLOWS, "QUEUE": queue}
    worker = Worker(queue=queue, concurrency=1)
    yield worker
    worker.stop()


def session_of_next_run() -> dict[str, int]:
    run = wait_for_terminal(wf.start("test.database_session", {}).id, timeout=30)
    assert run.status == RunStatus.COMPLETED and run.result is not None, run.error
    return dict(run.result)


def test_a_worker_keeps_its_database_connection_between_runs(lone_worker: Worker) -> None:
    # given a worker process that has advanced one run
    first = session_of_next_run()

    # when it advances the next ones
    later = [session_of_next_run() for _ in range(3)]

    # then the same process used the same PostgreSQL backend throughout
    assert {s["process"] for s in later} == {first["process"]}
    assert {s["backend"] for s in later} == {first["backend"]}


def test_a_worker_replaces_a_connection_that_broke_between_runs(lone_worker: Worker) -> None:
    # given a worker whose connection is cut between two runs (PostgreSQL restarted, a proxy timed out)
    first = session_of_next_run()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [first["backend"]])

    # when the next run is started
    second = session_of_next_run()

    # then the same worker process advanced it on a new connection, with no sweeper's help
    assert second["process"] == first["process"]
    assert second["backend"] != first["backend"]
